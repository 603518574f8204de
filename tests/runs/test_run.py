"""The spine end to end on the Llama fixture: documents/patching.json compiled, run and written.

The patched numbers are checked against a hand-written forward in plain transformers
(a forward hook doing the same swap), so the engine is tested against something it
does not share code with.
"""
from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from causalab_ref.runs import compile as compiler
from causalab_ref.fixtures import builder
from causalab_ref.documents import reader
from causalab_ref.runs import results, run
from causalab_ref.shapes import Refusal, Where

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
PATCHING = json.loads((ROOT / "documents" / "patching.json").read_text())
KEYS = ["example_id", "metric", "value", "eligible", "positions", "reason", "tokens", "unit",
        "estimand_version", "produced_by"]


@pytest.fixture(scope="module")
def written(llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "patching"
    plan = compiler.compile_document(PATCHING, llama, DATA)
    paths = run.execute(plan, llama, out)
    return out, paths


def _hand_patched_logits():
    """Counterfactual block_output[0] at the last token swapped into the base run, by a torch hook."""
    from transformers import AutoModelForCausalLM
    path = builder.checkpoint_dir("fixture:tiny-llama")
    tok = builder.tokenizer("fixture:tiny-llama")
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    rows = json.loads((DATA / "weekdays" / "train.json").read_text())
    base = tok([r["input"] for r in rows], return_tensors="pt", padding=True)
    cf = tok([r["counterfactual_inputs"][0] for r in rows], return_tensors="pt", padding=True)
    with torch.no_grad():
        hidden = model(**cf, output_hidden_states=True).hidden_states[1][:, -1].clone()

        def swap(_module, _args, output):
            tensor = output[0] if isinstance(output, tuple) else output
            tensor = tensor.clone()
            tensor[:, -1] = hidden
            return (tensor, *output[1:]) if isinstance(output, tuple) else tensor

        handle = model.model.layers[0].register_forward_hook(swap)
        try:
            logits = model(**base).logits[:, -1]
        finally:
            handle.remove()
    ids = {c: [tok.encode(" " + r[c].lstrip(), add_special_tokens=False)[0] for r in rows]
           for c in ("cf_answer", "base_answer")}
    return logits, ids


def test_patching_writes_the_four_files(written):
    """SPEC.md:552 [R6] run writes document.json, run.json and each step's saves."""
    out, paths = written
    assert [Path(p).name for p in paths] == ["document.json", "run.json", "iia.json", "logit_diff.json"]
    assert sorted(p.name for p in out.iterdir()) == ["document.json", "iia.json", "logit_diff.json", "run.json"]


def test_metric_table_rows_have_the_fields_in_order(written):
    """SPEC.md:554 [R7] one object per base row, keys in the documented order, ids as strings."""
    out, _ = written
    for name in ("iia", "logit_diff"):
        rows = json.loads((out / f"{name}.json").read_text())
        assert len(rows) == 4
        assert [list(r) for r in rows] == [KEYS] * 4
        assert [r["example_id"] for r in rows] == ["0", "1", "2", "3"]
        assert all(r["metric"] == name for r in rows)


def test_every_file_a_run_writes_is_json_dumps_indented_by_one(written):
    """SPEC.md:1780 [Q16] each JSON file is exactly `json.dumps(obj, indent=1)` and a newline, the flat tables
    (this unanchored step's) included."""
    out, _ = written
    for name in ("document.json", "run.json", "iia.json", "logit_diff.json"):
        text = (out / name).read_text(encoding="utf-8")
        assert text == json.dumps(json.loads(text), indent=1) + "\n", name


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(alphabet=st.sampled_from('ab"\\{}[],:\n \u00e9\u2028\U0001f600'), max_size=8))
ROWS = st.dictionaries(st.text(alphabet=st.sampled_from('k}{,\n"'), max_size=4), SCALARS, max_size=4)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                      max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(obj=st.one_of(st.lists(ROWS, max_size=5), st.lists(st.one_of(ROWS, VALUES), max_size=4), VALUES))
def test_the_results_encoder_writes_json_dumps_bytes(obj):
    """SPEC.md:1780 [Q16] tables of flat rows (keys and strings holding braces, commas, quotes and newlines; NaN,
    infinities, big ints), tables with an empty or a nested row, and any other value: the bytes json.dumps writes."""
    assert results.dumps(obj) == json.dumps(obj, indent=1)


def test_bare_integer_pass_reports_no_positions(written):
    """SPEC.md:302 [P33] a pass of bare integers reports positions null, reason and tokens empty."""
    out, _ = written
    rows = json.loads((out / "iia.json").read_text())
    assert all(r["positions"] is None and r["reason"] == "" and r["tokens"] == "" for r in rows)


def test_units_and_estimands_follow_the_kind(written):
    """SPEC.md:576 [R8] match is a fraction (match/v1), logit_diff a logit (logit_diff/v1)."""
    out, _ = written
    iia = json.loads((out / "iia.json").read_text())
    diff = json.loads((out / "logit_diff.json").read_text())
    assert {(r["unit"], r["estimand_version"]) for r in iia} == {("fraction", "match/v1")}
    assert {(r["unit"], r["estimand_version"]) for r in diff} == {("logit", "logit_diff/v1")}


def test_swap_matches_a_hand_written_hook(written):
    """SPEC.md:43 [D12] swap replaces the addressed values with the operand: logit_diff and iia equal
    a plain-transformers forward hook doing the same patch."""
    out, _ = written
    logits, ids = _hand_patched_logits()
    want_diff = [float(logits[r, ids["cf_answer"][r]] - logits[r, ids["base_answer"][r]]) for r in range(4)]
    want_iia = [1.0 if int(logits[r].argmax()) == ids["cf_answer"][r] else 0.0 for r in range(4)]
    got_diff = [r["value"] for r in json.loads((out / "logit_diff.json").read_text())]
    got_iia = [r["value"] for r in json.loads((out / "iia.json").read_text())]
    assert got_diff == pytest.approx(want_diff, abs=1e-5)
    assert got_iia == want_iia


def test_the_patch_changes_the_base_run(llama):
    """SPEC.md:43 [D12] the swap is an intervention: without the write the base run's numbers differ."""
    unpatched = copy.deepcopy(PATCHING)
    unpatched["interventions"]["patching"]["models"]["patched"]["writes"] = []
    plan = compiler.compile_document(unpatched, llama, DATA)
    plain = run.run_step(llama, plan.steps[0]).scores["logit_diff"]
    patched = run.run_step(llama, compiler.compile_document(PATCHING, llama, DATA).steps[0]).scores["logit_diff"]
    assert all(abs(a - b) > 1e-6 for a, b in zip(plain, patched))


def test_produced_by_is_the_digest_and_ignores_the_header(written):
    """SPEC.md:63 [D19] produced_by is the header-free digest; the header never changes it."""
    out, _ = written
    rows = json.loads((out / "iia.json").read_text())
    assert {r["produced_by"] for r in rows} == {reader.digest(PATCHING)}
    other = copy.deepcopy(PATCHING)
    other["header"]["description"] = "another note"
    assert reader.digest(other) == reader.digest(PATCHING)


def test_run_json_records_the_fixture_recipe_and_versions(written):
    """SPEC.md:580 [R9] run.json records engine, package digest, versions, model and recipe digest."""
    out, _ = written
    record = json.loads((out / "run.json").read_text())
    assert record["engine"] == "NNterpEngine"
    assert record["fixture_recipe"] == builder.recipe_digest("fixture:tiny-llama")
    assert record["model"]["key"] == "fixture:tiny-llama"
    assert set(record["versions"]) == {"torch", "transformers", "nnsight", "nnterp"}
    assert record["causalab_ref"] == results.package_digest()
    text = (out / "run.json").read_text()
    assert str(Path.home()) not in text and "/tmp" not in text


def test_existing_out_is_refused_without_replace(llama, written):
    """SPEC.md:585 [R10] an existing --out is refused unless --replace is given."""
    out, _ = written
    plan = compiler.compile_document(PATCHING, llama, DATA)
    with pytest.raises(Refusal, match="already exists"):
        run.execute(plan, llama, out)
    run.execute(plan, llama, out, replace=True)
    assert (out / "iia.json").is_file()


def test_a_refused_run_leaves_no_result_folder(llama, tmp_path):
    """SPEC.md:585 [R10] a run refused mid-way leaves neither --out nor its temporary folder."""
    plan = compiler.compile_document(copy.deepcopy(PATCHING), llama, DATA)
    # A cut no row fits, put into the plan after compile (which would refuse it, P58), so the run refuses it
    # mid-way, where it places the write.
    step = plan.steps[0]
    forwards = tuple(replace(f, taps=tuple(replace(t, pos=Where(index=40)) if t.name == "patch" else t
                                           for t in f.taps)) for f in step.forwards)
    plan = replace(plan, steps=(replace(step, forwards=forwards),))
    out = tmp_path / "never"
    with pytest.raises(Refusal, match="has no position on row") as refused:
        run.execute(plan, llama, out)
    assert refused.value.stage == "run"
    assert list(tmp_path.iterdir()) == []


def test_forwards_follow_their_operands(llama):
    """SPEC.md:546 [R3] the counterfactual forward that reads the operand runs before the patched one."""
    plan = compiler.compile_document(PATCHING, llama, DATA)
    assert [(f.model, f.input) for f in plan.steps[0].forwards] == [("original", "counterfactual"),
                                                                     ("patched", "base")]


def test_taps_run_in_rank_order_writes_first(llama):
    """SPEC.md:548 [R4] taps in rank order; at one address the write comes before the read."""
    doc = copy.deepcopy(PATCHING)
    doc["interventions"]["patching"]["reads"]["after"] = {"site": "target", "pos": -1, "model": "patched",
                                                           "input": "base"}
    plan = compiler.compile_document(doc, llama, DATA)
    taps = [(t.kind, t.name) for t in plan.steps[0].forwards[1].taps]
    assert taps == [("write", "patch"), ("read", "after"), ("read", "logits")]
    results = run.run_step(llama, plan.steps[0])
    cf = results.values["v_cf"]
    assert torch.equal(results.values["after"], cf)


def test_a_metric_over_a_read_that_is_not_the_vocabulary_is_refused_at_compile(llama):
    """SPEC.md:71 [D20] a metric's read is lm_head or logits whole, or a logits view; a read of the residual
    stream without the view is refused when compiled."""
    doc = copy.deepcopy(PATCHING)
    doc["interventions"]["patching"]["metrics"]["iia"]["of"] = "v_cf"
    doc["interventions"]["patching"]["reads"]["v_cf"]["model"] = "original"
    with pytest.raises(Refusal) as refusal:
        compiler.compile_document(doc, llama, DATA)
    assert refusal.value.stage == "compile"
    assert refusal.value.path == "interventions.patching.metrics.iia.of"
    assert refusal.value.message.startswith("metric 'iia' scores token ids, and its read 'v_cf' at block_output[0]")


def test_rows_scored_together_equal_each_row_scored_alone():
    """SPEC.md:576 [R8] each kind's batched scoring gives, bit for bit, its formula on each row's vector alone."""
    from causalab_ref.documents import metrics
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(9, 32000, generator=gen) * 6
    logits[3, 17] = logits[3].max() + 40  # a dominant logit (softmax near 1, others underflow)
    logits[4, :] = 0.5  # every logit tied: argmax is the first
    ids = torch.randint(0, 32000, (9,), generator=gen)
    other = torch.randint(0, 32000, (9,), generator=gen)
    ids[3], ids[4] = 17, 0
    against = torch.randn(9, 32000, generator=gen) * 6
    against[5] = logits[5]  # a row equal to its reference: kl and js 0, top_k 1
    alone = {"match": lambda v, r: (v.argmax() == ids[r]).float(),
             "logit_diff": lambda v, r: v[ids[r]] - v[other[r]],
             "cross_entropy": lambda v, r: -v.log_softmax(-1)[ids[r]],
             "token_logit": lambda v, r: v[ids[r]],
             "token_prob": lambda v, r: v.softmax(-1)[ids[r]],
             "soft_accuracy": lambda v, r: v.softmax(-1)[ids[r]],
             "kl": lambda v, r: metrics.KINDS["kl"].score(v[None], {"against": against[r][None]})[0],
             "js": lambda v, r: metrics.KINDS["js"].score(v[None], {"against": against[r][None]})[0],
             "top_k_overlap": lambda v, r: metrics.KINDS["top_k_overlap"].score(
                 v[None], {"against": against[r][None], "k": 7})[0],
             "top_k": lambda v, r: torch.stack([part[0] for part in metrics.KINDS["top_k"].score(v[None], {"k": 7})])}
    assert set(alone) == set(metrics.KINDS)
    for name, formula in alone.items():
        kind = metrics.KINDS[name]
        columns = {**dict(zip(kind.columns, (ids, other))), "against": against, "k": 7}
        together = kind.score(logits, columns)
        want = torch.stack([formula(logits[r], r) for r in range(9)])
        if kind.listed:  # (probabilities, ids), each (n, k): row r's pair is (want[r][0], want[r][1])
            together = torch.stack([together[0], together[1].to(together[0].dtype)], 1)
        assert torch.equal(together, want), (name, (together - want).abs().max())
