"""The conformance corpus and its runner, checked on causalab_ref itself; the document JSON Schema.

`conform` with no --impl runs every case of tests/conformance in-process and must pass; the
cases must name rule ids SPEC.md has; every shipped document and every case's document must
satisfy `schema`. The mutation check (tests/conformance/mutate.py) is not part of this run.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import jsonschema
import pytest

from causalab_ref import cli, conform, fixtures
from causalab_ref.schema import schema
from spec_rules import rules

ROOT = Path(__file__).resolve().parents[1]
CASES = conform.load_cases()


def test_corpus_passes_on_causalab_ref():
    """SPEC.md:187 [C1] `conform` with no --impl checks causalab_ref itself and must pass
    (SPEC.md:188 [C2], SPEC.md:189 [C3], SPEC.md:190 [C4], SPEC.md:191 [C5], SPEC.md:192 [C6])."""
    out = io.StringIO()
    result = conform.conform(stream=out, quiet=True, main=cli.main)
    assert result["ok"], out.getvalue()
    assert result["passed"] == len(CASES) and len(CASES) >= 60


def test_cases_name_existing_rules_and_say_how_they_were_confirmed():
    """SPEC.md:193 [C7] every case names SPEC.md rule ids and says how it was confirmed by hand."""
    ids = rules()
    for case in CASES:
        assert case["rules"], case["name"]
        assert all(r in ids for r in case["rules"]), (case["name"], case["rules"])
        assert case["confirmed"].strip(), case["name"]
        assert case["verb"] in conform.VERBS and "expect" in case, case["name"]


def test_corpus_covers_every_verb_and_fixture():
    """SPEC.md:193 [C7] the corpus has run, explain, validate and model cases, on every fixture (all six)."""
    assert {c["verb"] for c in CASES} == set(conform.VERBS)
    assert {c["fixture"] for c in CASES} == set(fixtures.names())


def test_compare_reports_a_readable_diff():
    """SPEC.md:192 [C6] floats agree within tolerance x max(|want|, 0.01); everything else exactly."""
    assert conform.compare({"v": 0.25}, {"v": 0.25 + 1e-7}, 1e-5) == []
    assert conform.compare({"v": 0.25}, {"v": 0.26}, 1e-5) == ["v: expected 0.25, got 0.26 (relative tolerance 1e-05)"]
    assert conform.compare({"t": "' is'"}, {"t": "'is'"}, 1e-5) == ["t: expected \"' is'\", got \"'is'\""]
    assert conform.compare({"a": 1, "b": 2}, {"b": 2, "a": 1}, 1e-5)  # key order counts (R7)


def test_impl_exit_3_is_not_applicable(tmp_path):
    """SPEC.md:191 [C5] an implementation that exits 3 makes the case not applicable, not failed."""
    case = next(c for c in CASES if c["verb"] == "validate")
    verdict, diffs, _got = conform.check(case, lambda argv, cwd: (3, "", "not applicable: no such verb"))
    assert verdict == "n/a" and diffs == []


def test_schema_verb_prints_a_valid_json_schema(capsys):
    """SPEC.md:194 [C8] `schema` prints the document format as a draft 2020-12 JSON Schema."""
    assert cli.main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator.check_schema(printed)
    assert printed == schema()


@pytest.mark.parametrize("path", sorted((ROOT / "documents").glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_document_satisfies_the_schema(path):
    """SPEC.md:194 [C8] every shipped document satisfies the schema."""
    jsonschema.validate(json.loads(path.read_text(encoding="utf-8")), schema())


def test_every_case_document_that_validates_satisfies_the_schema():
    """SPEC.md:194 [C8] a case document that causalab_ref accepts at validation satisfies the schema."""
    validator = jsonschema.Draft202012Validator(schema())
    for case in CASES:
        if "document" not in case:
            continue
        refused = case["expect"].get("refusal", "")
        if refused.startswith("validation:"):
            continue
        errors = list(validator.iter_errors(case["document"]))
        assert not errors, (case["name"], [e.message for e in errors[:3]])


def test_schema_refuses_what_validation_refuses_by_shape():
    """SPEC.md:194 [C8] two cuts and an unknown key are outside the schema, as at validation."""
    raw = json.loads((ROOT / "documents" / "patching.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema())
    raw["interventions"]["patching"]["reads"]["v_cf"]["pos"] = {"index": -1, "last": 2}
    assert list(validator.iter_errors(raw))
    raw["interventions"]["patching"]["reads"]["v_cf"]["pos"] = -1
    raw["sites"]["target"]["bogus"] = 1
    assert list(validator.iter_errors(raw))
