"""Fuzzed surfaces: bundles, case files, --impl outputs, CLI flags, fixture caches, results folders, environment
variables and exported folders (tests/fuzz_surfaces.py, tests/fuzz_surfaces_env.py).

A few seeded cases of each surface, in this process, each checked against the invariant (tests/invariant.py): no
internal error, no eligible metric row with a non-finite or null value, nothing written outside
--out or the cache, no case past its bound. `python bench/fuzz_surfaces.py` runs thousands.
"""
from __future__ import annotations

import json
import pathlib
import random

import pytest

import fuzz_surfaces

PER_SURFACE = {"bundle": 6, "case": 6, "impl": 6, "flags": 10, "cache": 3, "results": 6, "env": 4, "exported": 6,
               "interrupt": 4,
               "table": 6}


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("surfaces")


@pytest.mark.parametrize("surface", sorted(PER_SURFACE))
def test_mutated_surfaces_keep_the_invariant(surface: str, session: pathlib.Path):
    """SPEC.md:1086 [S9] SPEC.md:922 [C19] SPEC.md:1107 [S13] SPEC.md:1161 [S27] SPEC.md:1188 [S28] Whatever a bundle,
    a case file, an implementation, a flag, a cache folder, a results folder `plot` draws, an environment variable
    or an exported folder holds (or a results folder `table` reads, SPEC.md:1329 [S64]), no call ends in an internal
    error, writes outside --out, or scores a non-finite row."""
    broken = []
    for k in range(PER_SURFACE[surface]):
        _, results = fuzz_surfaces.run_case(random.Random(1000 * k + 17), session, surface)
        broken += [(k, argv, found, stderr) for argv, _, found, stderr in results if found]
    assert not broken, broken


def test_the_invariant_sees_an_internal_error_a_nan_row_and_a_changed_file(tmp_path):
    """SPEC.md:1086 [S9] The checker can fail: an internal error, an eligible NaN row under --out and a changed
    file outside it are each reported."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "t.json").write_text(json.dumps([{"example_id": "0", "value": float("nan"), "eligible": True}]))
    argv = ["run", "doc.json", "--out", str(out)]
    found = fuzz_surfaces.violations(argv, 0, "internal error (TypeError): x", 1.0,
                                     ({"/a": ("file", 1, "x")}, {"/a": ("file", 0, "")}), tmp_path)
    assert [f.split(":")[0] for f in found] == ["internal error (status 0)", str(out / "t.json"),
                                                "changed outside --out"]


def test_the_runs_own_out_and_staging_names_are_not_outside(tmp_path):
    """SPEC.md:1043 [S4] A change under --out or at `.<out>.partial-...` beside it is the run's own; a refused run's
    --out itself is not (it is left as it was, S2)."""
    out = tmp_path / "out"
    before: dict = {}
    after = {str(out / "run.json"): ("file", 1, "x"), str(tmp_path / ".out.lock"): ("file", 0, ""),
             str(tmp_path / "other"): ("file", 0, "")}
    found = fuzz_surfaces.violations(["run", "d", f"--out={out}"], 0, "", 1.0, (before, after), tmp_path)
    assert found == [f"changed outside --out: {[str(tmp_path / 'other')]}"]
    refused = fuzz_surfaces.violations(["run", "d", f"--out={out}"], 2, "", 1.0, (before, after), tmp_path)
    assert refused == [f"changed outside --out: {[str(tmp_path / 'other'), str(out / 'run.json')]}"]


def test_a_memory_budget_of_5000_nines_is_not_a_size():
    """SPEC.md:1267 [S47] A budget whose number is past any float (fuzz case 37, flags: an internal
    OverflowError once) is refused as not a size at validation, not converted."""
    from causalab_ref.runs import memory
    from causalab_ref.shapes import Refusal
    with pytest.raises(Refusal) as refused:
        memory.parse_budget("9" * 5000)
    assert refused.value.path == "--memory-budget" and "is not a size" in refused.value.message
    assert memory.parse_budget("9" * 300) == int(float("9" * 300))  # a finite one still counts


def test_a_timeout_of_1e308_waits_for_the_implementation_without_overflowing(tmp_path):
    """SPEC.md:917 [C18] `--timeout 1e308` is a positive number of seconds: the call is waited for (once an
    internal OverflowError in the poll, fuzz case 31, flags) and its exit status read back."""
    import sys

    from causalab_ref.conformance.invoke import Subprocess
    call = Subprocess([sys.executable, "-c", "import sys; print('hi'); sys.exit(3)"], {}, 1e308)
    assert call(["validate", "doc.json"], tmp_path) == (3, "hi\n", "")


def test_a_case_whose_rules_are_null_is_reported_not_an_internal_error(tmp_path):
    """SPEC.md:922 [C19] A case file with `"rules": null` (fuzz case 158, case: an internal TypeError in the
    report once) is checked and reported in its line, the rules shown as `?`."""
    import inprocess
    source = fuzz_surfaces.CORPUS / "model_components_gpt2.json"
    folder = fuzz_surfaces._corpus_copy(tmp_path, [source])
    case = json.loads(source.read_text(encoding="utf-8"))
    case["rules"] = None
    (folder / source.name).write_text(json.dumps(case), encoding="utf-8")
    done = inprocess.cli("conform", "--cases", str(folder))
    assert "internal error" not in done.stderr, done.stderr
    assert "PASS model_components_gpt2  [model; ?]" in done.stdout, done.stdout
