"""Fuzzed inputs: mutated shipped documents and data tables through validate, explain, tokens and run.

Every outcome is the project's own: status 0, or status 2 with one `<stage>: ...` line; never
another exception, never a traceback. Hypothesis draws the mutations (tests/fuzzing.py); CI runs
a few hundred cases in this process with model loads cached; `python bench/fuzz.py` runs 10,000.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fuzzing


@settings(max_examples=200, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(rng=st.randoms(use_true_random=False))
def test_mutated_documents_end_in_success_or_a_refusal(rng: random.Random, tmp_path_factory):
    """SPEC.md:19 [D4] SPEC.md:597 [R14] Whatever the document and data hold, validate, explain,
    `tokens --document` and run end with status 0 or 2 and one line; no other exception, no traceback."""
    tmp = tmp_path_factory.mktemp("fuzz")
    with fuzzing.cached_loads():
        foreign = fuzzing.run_case(rng, tmp)
    assert not foreign, foreign


def test_broken_json_and_deep_nesting_are_refusals(tmp_path):
    """SPEC.md:19 [D4] SPEC.md:597 [R14] Broken JSON, text nested past any parser, and bytes that are not
    UTF-8 are refused at validation in one line."""
    doc = tmp_path / "doc.json"
    for body in (b'{"model": ', b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe{}", b'{"a": NaN}'):
        doc.write_bytes(body)
        ok, status, text = fuzzing.check(["validate", str(doc)])
        assert ok and status == 2 and text.startswith("validation: "), text


def test_a_document_nested_past_the_bound_is_refused_however_its_parser_fares(tmp_path):
    """SPEC.md:597-601 [R14] A JSON text nested more than 100 deep nests too deeply to read, at validation in
    one line (validate, explain and tokens here; run reads the same); 100 deep is read. Before, a layers "all"
    document nested 600 deep in its model block (which the JSON parser still reads, and which its points'
    digests walk before the model is validated) ended validate, explain, tokens and run in an internal error
    (RecursionError): found by `bench/fuzz.py 2000 --seed 19`, case 20. Ground: R14's words."""
    import json
    from causalab_ref.documents import reader

    raw = json.loads((fuzzing.REPO / "documents" / "weekday_lens_all.json").read_text(encoding="utf-8"))
    doc = tmp_path / "doc.json"
    def nested(depth: int) -> object:
        value: object = 0
        for _ in range(depth):
            value = [value]
        return value

    for depth in (101, 600):
        deep = nested(depth - 2)  # the document and its model block are two levels
        doc.write_text(json.dumps(dict(raw, model=dict(raw["model"], revision=deep))), encoding="utf-8")
        for verb in (fuzzing.VERB_ARGS[v] for v in ("validate", "explain", "tokens")):
            ok, status, text = fuzzing.check([*verb, str(doc)])
            assert ok and status == 2 and text.strip() == f"validation: {doc} nests too deeply to read", text
    at_bound = nested(reader.MAX_DEPTH)
    assert reader.parse(json.dumps(at_bound)) == at_bound  # exactly the bound is read, one more is not
    with pytest.raises(reader.Malformed) as malformed:
        reader.parse(json.dumps([at_bound]))
    assert malformed.value.message == "nests too deeply to read"


def test_a_key_holding_a_newline_is_still_one_line(tmp_path):
    """SPEC.md:19 [D4] A refusal quoting the document's own text stays one line (newlines escaped)."""
    import json
    raw = json.loads((fuzzing.REPO / "documents" / "patching.json").read_text(encoding="utf-8"))
    raw["roles"]["base"]["\nnew\nline"] = 1
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps(raw), encoding="utf-8")
    ok, status, text = fuzzing.check(["validate", str(doc)])
    assert ok and status == 2 and text.count("\n") == 1, text
    assert "roles.base.\\nnew\\nline" in text


def test_a_sweep_of_too_many_points_is_refused_not_built():
    """SPEC.md:597 [R14] A range of 10**100 values is refused at validation, not expanded."""
    import json

    from causalab_ref.documents import sweeps
    from causalab_ref.shapes import Refusal
    raw = json.loads((fuzzing.REPO / "documents" / "patching.json").read_text(encoding="utf-8"))
    raw["sites"]["target"]["layers"] = [{"sweep": {"range": [0, 10 ** 100]}}]
    try:
        sweeps.points(raw)
    except Refusal as refusal:
        assert refusal.path == "sites.target.layers.0.sweep.range"
        assert "at most 10000 points" in refusal.message
    else:
        raise AssertionError("not refused")


def test_a_lone_surrogate_in_a_document_or_a_table_is_a_refusal(tmp_path):
    """SPEC.md:597 [R14] `"\\ud800"` is JSON but no tokenizer's text: refused with its path, not a TypeError."""
    import json
    import shutil
    doc = tmp_path / "doc.json"
    doc.write_text('{"model": "\\ud800"}', encoding="utf-8")
    ok, status, text = fuzzing.check(["validate", str(doc)])
    assert ok and status == 2 and "not valid Unicode text" in text, text
    root = tmp_path / "data"
    shutil.copytree(fuzzing.DATA, root)
    table = root / "weekdays" / "train.json"
    table.write_text(table.read_text(encoding="utf-8").replace('" Friday"', '"\\ud800"', 1), encoding="utf-8")
    ok, status, text = fuzzing.check(["validate", str(fuzzing.REPO / "documents" / "patching.json"),
                                      "--data-root", str(root)])
    assert ok and status == 2 and text.startswith("compile: steps.score.rows.base: ") and "Unicode" in text, text
    assert json.loads(table.read_text(encoding="utf-8"))  # the table is still JSON


def test_a_metric_of_a_read_that_is_not_logits_is_a_refusal(tmp_path):
    """SPEC.md:597 [R14] a token-scoring metric over a residual without "view": "logits" is refused (at
    compile) naming the metric, not an IndexError."""
    import json
    raw = json.loads((fuzzing.REPO / "documents" / "layer_sweep.json").read_text(encoding="utf-8"))
    del raw["interventions"]["lens"]["reads"]["lens"]["view"]
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps(raw), encoding="utf-8")
    with fuzzing.cached_loads():
        ok, status, text = fuzzing.check(["run", str(doc), "--out", str(tmp_path / "out"), "--quiet"])
    assert ok and status == 2, text
    assert text.startswith("compile: interventions.lens.metrics.p_answer.of: metric 'p_answer' scores token ids"), text
    assert not (tmp_path / "out").exists()


def test_the_fuzzer_writes_the_later_languages_fields(tmp_path):
    """SPEC.md:1336 [S63] SPEC.md:114 [D36] SPEC.md:2527 [SF6] fuzzing.language makes layers "all" (and its wrong
    spellings) and steps-first cycles, the steps-first documents are among its sources; each such document
    validates or is refused in one line."""
    import json
    pos_sweep = json.loads((fuzzing.REPO / "documents" / "steps_first" / "pos_sweep.json").read_text("utf-8"))
    made = [fuzzing.language(random.Random(seed), pos_sweep) for seed in range(40)]
    alls = [m for m in made if m["sites"]["target"].get("layers") == "all"]
    cycles = [m for m in made if "interventions" in m["steps"]["counterfactual"]]
    assert alls and cycles
    assert {p.parent.name for p in fuzzing.DOCUMENTS} >= {"documents", "steps_first"}
    doc = tmp_path / "doc.json"
    for raw in (alls[0], cycles[0], made[0]):
        doc.write_text(json.dumps(raw), encoding="utf-8")
        ok, status, text = fuzzing.check(["validate", str(doc), "--data-root", str(fuzzing.DATA)])
        assert ok and status in (0, 2), text
    doc.write_text(json.dumps(cycles[0]), encoding="utf-8")
    assert "name each other in a cycle" in fuzzing.check(["validate", str(doc), "--data-root",
                                                          str(fuzzing.DATA)])[2]
