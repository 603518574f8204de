"""SPEC.md §7 Safety, documents, data files and names (S40-S45): each test performs the attack.

Every attack goes through the command line in this process (tests/fuzzing.py `check`), so the
outcome is what a user sees: one `<stage>: <path>: <message>` line and status 2, never a
traceback, an internal error or a silently different run.
"""
from __future__ import annotations

import pytest

import contextlib
import copy
import io
import json
import pathlib
import shutil

import fuzzing
from causalab_ref import cli
from causalab_ref.documents import sweeps, validate
from causalab_ref.shapes import Refusal

pytestmark = pytest.mark.fast  # the edit-test loop's subset: `pytest -m fast` (README)

PATCHING_FILE = fuzzing.REPO / "documents" / "patching.json"
PATCHING = json.loads(PATCHING_FILE.read_text(encoding="utf-8"))


def _refusal(argv: list[str]) -> str:
    ok, status, text = fuzzing.check(argv)
    assert ok and status == 2, (status, text)
    return text.strip()


def _data_root(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "data"
    shutil.copytree(fuzzing.DATA, root)
    return root


def test_a_key_named_twice_in_a_document_is_refused_naming_its_path(tmp_path):
    """SPEC.md:1236 [S40] `"layers": [0], "layers": [1]` would run layer 1; it is refused at the key's dotted path."""
    text = PATCHING_FILE.read_text(encoding="utf-8").replace('"layers": [0]', '"layers": [0], "layers": [1]', 1)
    doc = tmp_path / "doc.json"
    doc.write_text(text, encoding="utf-8")
    line = _refusal(["validate", str(doc)])
    assert line.startswith("validation: sites.target.layers: duplicate key 'layers'"), line


def test_a_second_model_key_is_refused_not_taken(tmp_path):
    """SPEC.md:1236 [S40] a second `model.key` does not replace the first: refused at `model.key`."""
    text = PATCHING_FILE.read_text(encoding="utf-8").replace(
        '"key": "fixture:tiny-llama",', '"key": "fixture:tiny-llama", "key": "fixture:tiny-gpt2",', 1)
    doc = tmp_path / "doc.json"
    doc.write_text(text, encoding="utf-8")
    assert _refusal(["validate", str(doc)]).startswith("validation: model.key: duplicate key 'key'")


def test_a_key_named_twice_in_a_data_file_is_refused_naming_file_and_place(tmp_path):
    """SPEC.md:1236 [S40] a data row naming a column twice is refused with the file and the row's path."""
    root = _data_root(tmp_path)
    table = root / "weekdays" / "train.json"
    rows = json.loads(table.read_text(encoding="utf-8"))
    text = json.dumps(rows).replace('"cf_answer": ', '"cf_answer": "x", "cf_answer": ', 1)
    table.write_text(text, encoding="utf-8")
    line = _refusal(["validate", str(PATCHING_FILE), "--data-root", str(root)])
    assert line.startswith(f"compile: steps.score.rows.base: dataset ref 'weekdays/train': {table} at 0.cf_answer: "
                           "duplicate key 'cf_answer'"), line


def test_an_integer_of_more_than_4300_digits_is_a_malformed_number(tmp_path):
    """SPEC.md:1240 [S41] a 5000-digit integer is refused at its path as a malformed number, not a ValueError."""
    text = PATCHING_FILE.read_text(encoding="utf-8").replace('"layers": [0]', '"layers": [' + "7" * 5000 + "]", 1)
    doc = tmp_path / "doc.json"
    doc.write_text(text, encoding="utf-8")
    line = _refusal(["validate", str(doc)])
    assert line == ("validation: sites.target.layers.0: malformed number: an integer of 5000 digits; a number has "
                    "at most 4300 digits"), line


def test_nan_infinity_and_an_overflowing_float_are_malformed_numbers(tmp_path):
    """SPEC.md:1240 [S41] NaN, -Infinity and 1e999 are not JSON numbers: refused at their path."""
    doc = tmp_path / "doc.json"
    for spelled, message in (("NaN", "NaN is not a JSON number"), ("-Infinity", "-Infinity is not a JSON number"),
                             ("1e999", "1e999 is beyond the range of a 64-bit float")):
        text = PATCHING_FILE.read_text(encoding="utf-8").replace('"operand": "v_cf"', f'"operand": {spelled}', 1)
        doc.write_text(text, encoding="utf-8")
        line = _refusal(["validate", str(doc)])
        assert line.startswith(f"validation: interventions.patching.writes.patch.operand: malformed number: "
                               f"{message}"), line


def test_a_huge_integer_in_a_data_file_is_refused_by_data_and_by_validate(tmp_path):
    """SPEC.md:1240 [S41] SPEC.md:1245 [S42] a data file's 5000-digit integer is refused by `data --json`
    (which never prints NaN or a traceback) and by `validate`."""
    root = _data_root(tmp_path)
    table = root / "weekdays" / "train.json"
    rows = json.loads(table.read_text(encoding="utf-8"))
    table.write_text(json.dumps(rows)[:-1] + ', {"n": ' + "1" * 5000 + "}]", encoding="utf-8")
    for argv in (["--json", "data", "weekdays/train", "--data-root", str(root)],
                 ["validate", str(PATCHING_FILE), "--data-root", str(root)]):
        line = _refusal(argv)
        assert f"{table} at {len(rows)}.n: malformed number: an integer of 5000 digits" in line, line


def _strict(text: str):
    def no_constant(name):
        raise AssertionError(f"{name} is not JSON")
    return json.loads(text, parse_constant=no_constant)


def test_data_json_prints_strict_json_and_refuses_nan(tmp_path):
    """SPEC.md:1245 [S42] `data --json` prints JSON a strict reader takes; a NaN cell is refused, not printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["--json", "data", "weekdays/train", "--data-root", str(fuzzing.DATA)]) == 0
    assert _strict(out.getvalue())["rows"] > 0
    root = _data_root(tmp_path)
    table = root / "weekdays" / "train.json"
    table.write_text(table.read_text(encoding="utf-8").replace('"cf_answer": " Friday"', '"cf_answer": NaN', 1),
                     encoding="utf-8")
    line = _refusal(["--json", "data", "weekdays/train", "--data-root", str(root)])
    assert "malformed number: NaN is not a JSON number" in line, line


def test_a_name_with_a_slash_or_a_dot_is_refused_at_validation():
    """SPEC.md:1247 [S43] an intervention, metric or step name that is not one path segment is refused at its path."""
    cases = []
    raw = copy.deepcopy(PATCHING)
    raw["interventions"]["a/b"] = raw["interventions"].pop("patching")
    raw["steps"]["score"]["interventions"] = "a/b"
    cases.append((raw, "interventions.a/b"))
    raw = copy.deepcopy(PATCHING)
    raw["interventions"]["patching"]["metrics"]["x/iia"] = raw["interventions"]["patching"]["metrics"].pop("iia")
    cases.append((raw, "interventions.patching.metrics.x/iia"))
    raw = copy.deepcopy(PATCHING)
    raw["steps"]["s.core"] = raw["steps"].pop("score")
    cases.append((raw, "steps.s.core"))
    for raw, path in cases:
        try:
            validate.points_of(raw)
        except Refusal as refusal:
            assert (refusal.stage, refusal.path) == ("validation", path), refusal
            assert "cannot be one path segment" in refusal.message
        else:
            raise AssertionError(f"{path} accepted")


def test_a_slashed_intervention_does_not_pick_the_wrong_one_for_a_qualified_save(tmp_path):
    """SPEC.md:1247 [S43] with interventions `a` and `a/b`, the save `a/b/iia` is refused at validation
    through the CLI rather than written for the wrong intervention."""
    raw = copy.deepcopy(PATCHING)
    raw["interventions"]["a"] = raw["interventions"]["patching"]
    raw["interventions"]["a/b"] = raw["interventions"].pop("patching")
    raw["steps"]["score"]["interventions"] = ["a", "a/b"]
    raw["steps"]["score"]["saves"] = [{"value": "a/b/iia", "file_path": "iia.json"}]
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps(raw), encoding="utf-8")
    assert _refusal(["validate", str(doc)]).startswith("validation: interventions.a/b: name 'a/b' cannot be one path")


def test_saves_that_collide_as_paths_are_refused_at_validation(tmp_path):
    """SPEC.md:1252 [S44] `iia.json` and `iia.json/b.json` (and anything under document.json) cannot both be
    written: refused at validation at the later save, before any forward."""
    raw = copy.deepcopy(PATCHING)
    raw["steps"]["score"]["saves"].append({"value": "logit_diff", "file_path": "iia.json/b.json"})
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps(raw), encoding="utf-8")
    line = _refusal(["run", str(doc), "--out", str(tmp_path / "out"), "--quiet"])
    assert line.startswith("validation: steps.score.saves.2.file_path: 'iia.json/b.json' and 'iia.json' collide "
                           "as paths"), line
    assert not (tmp_path / "out").exists()
    raw["steps"]["score"]["saves"][2]["file_path"] = "document.json/b.json"
    doc.write_text(json.dumps(raw), encoding="utf-8")
    assert "collide as paths" in _refusal(["validate", str(doc)])


def test_a_prompt_longer_than_the_models_positions_is_refused_at_compile(tmp_path):
    """SPEC.md:1259 [S45] `"x " * 700` on the GPT-2 fixture (512 positions) is refused at compile naming the
    rows and their lengths (1400 and 1200 tokens: the fixture BPE splits "x " in two), not a traceback
    from inside the model."""
    root = _data_root(tmp_path)
    rows = [{"input": "x " * 700, "cf_answer": " a"}, {"input": "short", "cf_answer": " a"},
            {"input": "x " * 600, "cf_answer": " a"}]
    (root / "long").mkdir()
    (root / "long" / "rows.json").write_text(json.dumps(rows), encoding="utf-8")
    raw = copy.deepcopy(PATCHING)
    raw["model"] = {"key": "fixture:tiny-gpt2", "revision": "seeded", "dtype": "fp32"}
    raw["roles"] = {"base": {"field": "input"}}
    raw["interventions"] = {"probe": {"reads": {"logits": {"site": "head", "pos": -1, "input": "base"}},
                                      "metrics": {"p": {"kind": "token_prob", "of": "logits", "token": "cf_answer"}}}}
    raw["steps"] = {"score": {"kind": "observe", "rows": {"base": "long/rows"}}}
    del raw["sites"]["target"]
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps(raw), encoding="utf-8")
    line = _refusal(["validate", str(doc), "--data-root", str(root)])
    assert line == ("compile: steps.score.rows.base: role 'base': 2 prompt(s) longer than the model's 512 positions "
                    "(row 0: 1400 tokens, row 2: 1200 tokens); shorten them to at most 512 tokens or pick rows that "
                    "fit"), line


def test_a_command_lowers_sweeps_once_and_validates_each_point_once(monkeypatch):
    """SPEC.md:76 [D21] `validate` of a swept document, which reads and compiles it, lowers it once (its
    points and their coordinates from one lowering) and validates each point once."""
    calls = {"points": 0, "document": 0}
    lower, check = sweeps.lowered, validate.document  # sweeps.points lowers through sweeps.lowered

    def counted_points(raw):
        calls["points"] += 1
        return lower(raw)

    def counted_document(raw):
        calls["document"] += 1
        return check(raw)
    monkeypatch.setattr(sweeps, "lowered", counted_points)
    monkeypatch.setattr(validate, "document", counted_document)
    sweep = fuzzing.REPO / "documents" / "layer_sweep.json"
    with fuzzing.cached_loads():
        ok, status, text = fuzzing.check(["validate", str(sweep)])
    assert ok and status == 0, text
    n = len(lower(json.loads(sweep.read_text(encoding="utf-8"))))
    assert n > 1 and calls == {"points": 1, "document": n}
