"""`--engine ndif` (remote execution) is a known engine refused by name before anything loads, and nothing a
remote engine would need is local-only (SPEC.md E12, E13)."""
from __future__ import annotations

import json
import pathlib
import pickle

import pytest

from causalab_ref import cli
from causalab_ref.engines import checkpoint, loading, weightless

REPO = pathlib.Path(__file__).resolve().parents[2]
PATCHING = str(REPO / "documents" / "patching.json")


@pytest.fixture
def nothing_loads(monkeypatch):
    """Any config, tokenizer or weight load fails the test."""
    def loaded(*_args, **_kwargs):
        raise AssertionError("a model was loaded for --engine ndif")
    monkeypatch.setattr(checkpoint, "load", loaded)
    monkeypatch.setattr(weightless, "load", loaded)


@pytest.mark.fast
@pytest.mark.parametrize("argv", [["validate", PATCHING], ["explain", PATCHING], ["model", "fixture:tiny-llama"],
                                  ["run", PATCHING, "--out", "OUT"]])
def test_ndif_is_refused_by_name_before_anything_loads(argv, nothing_loads, capsys, tmp_path):
    """SPEC.md:1969 [E12] validate, explain, run and model take `--engine ndif` (no argparse "invalid choice")
    and refuse it in one line, status 2, naming what remote execution needs and the local engines; nothing is
    loaded and run writes nothing."""
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert cli.main(argv + ["--engine", "ndif"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("compile: --engine: engine 'ndif' runs a document on a remote NDIF server, and this "
                          "installation cannot reach one")
    assert "nnsight >= 0.8 and Python >= 3.12" in err and err.endswith("--engine nnterp or --engine hooks")
    assert not (tmp_path / "out").exists()


@pytest.mark.fast
def test_the_cli_names_the_engines_loading_knows():
    """SPEC.md:1969 [E12] the command line's engine choices are the loader's."""
    assert cli.ENGINES == loading.ENGINES == ("nnterp", "hooks", "ndif")


@pytest.mark.fast
def test_a_bad_document_is_refused_for_itself_before_the_engine(capsys, tmp_path):
    """SPEC.md:1969 [E12] the document's own refusals come first: a document with an unknown key is refused at
    that key under --engine ndif too."""
    raw = json.loads(pathlib.Path(PATCHING).read_text(encoding="utf-8"))
    raw["bogus"] = 1
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps(raw), encoding="utf-8")
    assert cli.main(["validate", str(doc), "--engine", "ndif"]) == 2
    assert capsys.readouterr().err.startswith("validation: bogus: unknown key 'bogus'")


def test_a_compiled_plan_pickles_to_an_equal_plan():
    """SPEC.md:1976 [E13] the plan (positions resolved from the tokenizer and rows alone) is plain data a
    remote engine could be sent: it pickles and unpickles to an equal plan, and run.json's record says
    `remote: false` on a local engine."""
    from causalab_ref.runs import compile as compiler
    from causalab_ref.shapes import Model
    raw = json.loads(pathlib.Path(PATCHING).read_text(encoding="utf-8"))
    eng, plan = loading.compiled(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"),
                                 lambda e: compiler.compile_document(raw, e, REPO / "documents" / "data"))
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert eng.run_record(None)["remote"] is False
