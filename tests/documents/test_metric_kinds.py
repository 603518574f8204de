"""The original's later metric kinds (soft_accuracy, kl, js, top_k) and `token_form: "bare"`: validation
without a model, compile on the session's Llama fixture and the weekday fixture's tokenizer, and the
formulas on tensors held against closed forms computed here in float64 (SPEC.md D24-D29).

Every test starts from documents/patching.json with a `clean` read (the unpatched head at the last
token) beside the patched `logits`, changes one thing and checks one behaviour.
"""
from __future__ import annotations

import copy
import json
import math
import pathlib

import pytest
import torch

from causalab_ref.documents import metrics, validate
from causalab_ref.runs import compile as compiler
from causalab_ref.runs import data, scoring
from causalab_ref.runs.placement import Resolved, eligible_rows
from causalab_ref.runs.plan import MetricPlan
from causalab_ref.shapes import Refusal

REPO = pathlib.Path(__file__).resolve().parents[2]
DATA = REPO / "documents" / "data"
_SHIPPED = json.loads((REPO / "documents" / "patching.json").read_text(encoding="utf-8"))
MP = "interventions.patching.metrics"


def doc(**metric) -> dict:
    """The shipped document with a `clean` read and one metric `m` (what `metric` gives), saved."""
    raw = copy.deepcopy(_SHIPPED)
    iv = raw["interventions"]["patching"]
    iv["reads"]["clean"] = {"site": "head", "pos": -1, "model": "original", "input": "base"}
    iv["metrics"] = {"m": metric}
    raw["steps"]["score"]["saves"] = [{"value": "m", "file_path": "m.json"}]
    return raw


def _refused(raw: dict) -> Refusal:
    with pytest.raises(Refusal) as refusal:
        validate.document(raw)
    return refusal.value


@pytest.mark.fast
@pytest.mark.parametrize("metric", [
    {"kind": "soft_accuracy", "of": "logits", "expected": "cf_answer"},
    {"kind": "kl", "of": "logits", "against": "clean"},
    {"kind": "js", "of": "logits", "against": "clean", "token_form": "space_prefixed"},
    {"kind": "top_k", "of": "logits", "k": 3},
    {"kind": "top_k", "of": "logits"},
    {"kind": "top_k_overlap", "of": "logits", "against": "clean", "k": 3},
    {"kind": "top_k_overlap", "of": "logits", "against": "clean"},
])
def test_the_four_later_kinds_validate_with_their_fields(metric):
    """SPEC.md:128 [D24] each later kind is accepted with the fields the original's documents give it."""
    got = dict(dict(validate.document(doc(**metric)).interventions)["patching"].metrics)["m"]
    assert (got.kind, got.of, got.against) == (metric["kind"], "logits", metric.get("against"))
    assert got.k == (metric.get("k", 5) if metric["kind"].startswith("top_k") else None)


@pytest.mark.fast
@pytest.mark.parametrize("kind", ["kl", "js", "top_k_overlap"])
def test_a_comparing_kind_without_against_is_refused_naming_against(kind):
    """SPEC.md:128 [D24] kl, js and top_k_overlap need `against`; its absence is refused at `<metric>.against`."""
    refusal = _refused(doc(kind=kind, of="logits"))
    assert (refusal.stage, refusal.path) == ("validation", f"{MP}.m.against")
    assert refusal.message.startswith(f"a {kind} metric compares `of` with a reference: name it in `against`")


@pytest.mark.fast
def test_the_originals_top_k_readout_validates_and_takes_no_against():
    """SPEC.md:128 [D24] the original's readout (`k` and no `against`, its readout.json) is top_k here, as
    there; `against` on it is an unknown key (issue 38: it was refused saying a table holds one number)."""
    got = dict(dict(validate.document(doc(kind="top_k", of="logits", k=3)).interventions)["patching"].metrics)["m"]
    assert (got.kind, got.against, got.k) == ("top_k", None, 3)
    refusal = _refused(doc(kind="top_k", of="logits", against="clean", k=3))
    assert (refusal.path, refusal.message.split(";")[0]) == (f"{MP}.m.against", "unknown key 'against'")


@pytest.mark.fast
@pytest.mark.parametrize("metric, key", [
    ({"kind": "match", "of": "logits", "expected": "cf_answer", "against": "clean"}, "against"),
    ({"kind": "kl", "of": "logits", "against": "clean", "k": 3}, "k"),
    ({"kind": "soft_accuracy", "of": "logits", "token": "cf_answer"}, "token"),
])
def test_a_field_its_kind_does_not_take_is_an_unknown_key(metric, key):
    """SPEC.md:128 [D24] `against` on a match or `k` on a kl is an unknown key (D2)."""
    refusal = _refused(doc(**metric))
    assert (refusal.path, refusal.message.split(";")[0]) == (f"{MP}.m.{key}", f"unknown key '{key}'")


@pytest.mark.fast
def test_against_must_name_a_read_of_the_intervention():
    """SPEC.md:139 [D25] `against` names a read of the same intervention, with the nearest names."""
    refusal = _refused(doc(kind="kl", of="logits", against="cleen"))
    assert refusal.path == f"{MP}.m.against"
    assert refusal.message == ("interventions.patching: metric 'm': `against` must be a read name of this "
                               "intervention, got 'cleen'; did you mean 'clean'?")


@pytest.mark.fast
def test_against_over_a_window_wider_than_one_is_refused():
    """SPEC.md:139 [D25] `against` is of width 1 as `of` is (P49), refused at `<metric>.against`."""
    raw = doc(kind="js", of="logits", against="clean")
    raw["interventions"]["patching"]["reads"]["clean"]["pos"] = {"last": 3}
    refusal = _refused(raw)
    assert refusal.path == f"{MP}.m.against"
    assert refusal.message.endswith("metric 'm' reads 'clean', a window of 3 positions; a metric scores one "
                                    "position per row")


@pytest.mark.fast
@pytest.mark.parametrize("k, said", [(0, "k 0 is not a positive number"), (-2, "k -2 is not a positive number"),
                                     (1e9, "expected an integer, got a number"), ("3", "expected an integer, got a string"),
                                     (True, "expected an integer, got a boolean"), (None, "expected an integer, got null")])
def test_k_is_a_positive_integer_at_validation(k, said):
    """SPEC.md:145 [D27] k of 0, a float, a string, a boolean or null is one refusal at `<metric>.k`.
    SPEC.md:1319 [S58] the surface: one line at the field's path."""
    for metric in ({"kind": "top_k"}, {"kind": "top_k_overlap", "against": "clean"}):
        refusal = _refused(doc(of="logits", k=k, **metric))
        assert (refusal.stage, refusal.path, refusal.message) == ("validation", f"{MP}.m.k", said)


def test_k_past_the_vocabulary_is_refused_at_compile(llama):
    """SPEC.md:145 [D27] k is at most the vocabulary (32000 on the Llama fixture): 32001 and 1e9 are refused
    at compile before any forward, 32000 compiles."""
    for k in (32001, 10**9):
        with pytest.raises(Refusal) as refusal:
            compiler.compile_document(doc(kind="top_k_overlap", of="logits", against="clean", k=k), llama, DATA)
        assert (refusal.value.stage, refusal.value.path) == ("compile", f"{MP}.m.k")
        assert refusal.value.message.startswith(f"metric 'm': k {k} is more than the vocabulary's 32000 tokens")
    plan = compiler.compile_document(doc(kind="top_k_overlap", of="logits", against="clean", k=32000), llama, DATA)
    assert plan.leaves()[0].steps[0].metrics[0].k == 32000


def test_against_that_is_not_logits_is_refused_at_compile(llama):
    """SPEC.md:143 [D26] `against` holds the vocabulary's logits (D20), refused at `<metric>.against`."""
    raw = doc(kind="kl", of="logits", against="clean")
    raw["interventions"]["patching"]["reads"]["clean"]["site"] = "target"
    with pytest.raises(Refusal) as refusal:
        compiler.compile_document(raw, llama, DATA)
    assert (refusal.value.stage, refusal.value.path) == ("compile", f"{MP}.m.against")
    assert refusal.value.message.startswith("metric 'm' scores token ids, and its read 'clean' at block_output[0]")


# ---------------------------------------------------------------- the formulas (D28), against float64 closed forms


def _rows(seed: int = 3, n: int = 6, vocab: int = 500, scale: float = 4.0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, vocab, generator=gen) * scale, torch.randn(n, vocab, generator=gen) * scale


def _kl64(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    p, q = p_logits.double().softmax(-1), q_logits.double().softmax(-1)
    return (p * (p.log() - q.log())).sum(-1)


@pytest.mark.fast
def test_kl_is_kl_of_of_against_against_in_nats():
    """SPEC.md:153 [D28] kl = Σ P (log P − log Q), P of `of`, Q of `against`, natural log (float64 here)."""
    of, against = _rows()
    got = metrics.KINDS["kl"].score(of, {"against": against})
    assert torch.allclose(got.double(), _kl64(of, against), rtol=1e-5)
    assert not torch.allclose(got, metrics.KINDS["kl"].score(against, {"against": of}), rtol=1e-3)  # P is `of`'s


@pytest.mark.fast
def test_js_is_the_mean_kl_to_the_mixture_and_at_most_log_2():
    """SPEC.md:153 [D28] js = ½KL(P‖M) + ½KL(Q‖M), M = (P + Q)/2, in nats; symmetric; ≤ log 2, nearly
    log 2 for two distributions on different tokens."""
    of, against = _rows()
    p, q = of.double().softmax(-1), against.double().softmax(-1)
    m = (p + q) / 2
    want = ((p * (p.log() - m.log())).sum(-1) + (q * (q.log() - m.log())).sum(-1)) / 2
    got = metrics.KINDS["js"].score(of, {"against": against})
    assert torch.allclose(got.double(), want, rtol=1e-5)
    assert torch.allclose(got, metrics.KINDS["js"].score(against, {"against": of}), rtol=1e-6)
    apart = torch.full((2, 50), -30.0)
    apart[0, 3], apart[1, 7] = 30.0, 30.0
    far = metrics.KINDS["js"].score(apart[:1], {"against": apart[1:]})
    assert math.log(2) - 1e-6 <= far.item() <= math.log(2) + 1e-6


@pytest.mark.fast
@pytest.mark.parametrize("kind", ["kl", "js"])
def test_a_divergence_of_a_read_against_itself_is_exactly_0(kind):
    """SPEC.md:153 [D28] kl and js are 0 exactly (not to rounding) when the two reads are equal."""
    of, _ = _rows(scale=9.0)
    assert torch.equal(metrics.KINDS[kind].score(of, {"against": of.clone()}), torch.zeros(of.shape[0]))


@pytest.mark.fast
def test_kl_stays_finite_where_a_softmax_underflows():
    """SPEC.md:153 [D28] from log-softmax: logits 200 apart (softmax underflows to 0 in float32) give the
    closed form, where log(softmax) would give inf."""
    of = torch.tensor([[0.0, -200.0, 5.0]])
    against = torch.tensor([[-200.0, 0.0, 5.0]])
    got = metrics.KINDS["kl"].score(of, {"against": against})
    assert math.isfinite(got.item())
    assert got.item() == pytest.approx(_kl64(of, against).item(), rel=1e-6)
    assert not math.isfinite((of.softmax(-1) * (of.softmax(-1).log() - against.softmax(-1).log())).sum().item())


@pytest.mark.fast
def test_soft_accuracy_is_the_probability_of_the_expected_token():
    """SPEC.md:153 [D28] soft_accuracy = softmax(of)[expected], bit for bit token_prob of the same id."""
    of, _ = _rows()
    ids = torch.tensor([0, 5, 9, 499, 12, 3])
    got = metrics.KINDS["soft_accuracy"].score(of, {"expected": ids})
    assert torch.equal(got, metrics.KINDS["token_prob"].score(of, {"token": ids}))
    assert torch.allclose(got.double(), of.double().softmax(-1)[torch.arange(6), ids], rtol=1e-5)


@pytest.mark.fast
def test_top_k_overlap_is_the_share_of_the_k_top_tokens_both_reads_hold():
    """SPEC.md:153 [D28] top_k_overlap = |T_k(of) ∩ T_k(against)| / k: tops {4, 3, 2} and {4, 2, 0} share 2
    of 3."""
    of = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]])
    against = torch.tensor([[3.5, 0.0, 4.0, 1.0, 5.0]])
    assert metrics.KINDS["top_k_overlap"].score(of, {"against": against, "k": 3}).item() == pytest.approx(2 / 3)
    assert metrics.KINDS["top_k_overlap"].score(of, {"against": against, "k": 5}).item() == 1.0
    assert metrics.KINDS["top_k_overlap"].score(of, {"against": against, "k": 1}).item() == 1.0


@pytest.mark.fast
def test_top_k_overlap_ranks_a_tie_to_the_lower_id():
    """SPEC.md:153 [D28] equal logits rank by id: with every logit tied, T_2 is {0, 1}, so a read whose top
    two are ids 0 and 1 shares both and one whose top two are 2 and 3 shares none."""
    tied = torch.zeros(1, 6)
    low = torch.tensor([[9.0, 8.0, 0.0, 0.0, 0.0, 0.0]])
    high = torch.tensor([[0.0, 0.0, 9.0, 8.0, 0.0, 0.0]])
    assert metrics.KINDS["top_k_overlap"].score(tied, {"against": low, "k": 2}).item() == 1.0
    assert metrics.KINDS["top_k_overlap"].score(tied, {"against": high, "k": 2}).item() == 0.0


@pytest.mark.fast
def test_top_k_ranks_by_float32_probability_ties_to_the_lower_id():
    """SPEC.md:153 [D28] top_k is softmax(of) in float32, its k largest, most likely first, equal
    probabilities by the lower id; checked against sorted() on (-p, id) over the same softmax."""
    of = torch.tensor([[0.0, 2.0, 2.0, 1.0, 2.0, -1.0], [5.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    probabilities, ids = metrics.KINDS["top_k"].score(of, {"k": 4})
    for r in range(2):
        p = of[r].float().softmax(-1).tolist()
        want = sorted(range(6), key=lambda j: (-p[j], j))[:4]
        assert ids[r].tolist() == want and probabilities[r].tolist() == [p[j] for j in want]
    assert ids[0].tolist() == [1, 2, 4, 3] and ids[1].tolist() == [0, 1, 2, 3]


@pytest.mark.fast
def test_a_top_k_row_is_spelled_by_the_runs_tokenizer_and_a_non_finite_row_is_null():
    """SPEC.md:153 [D28] scoring writes each row as [[repr(decode([id])), p], ...]; a row whose vector holds a
    NaN is S52's null (its table row ineligible), the others keep their lists."""
    of = torch.tensor([[0.0, 3.0, 1.0], [0.0, math.nan, 1.0], [2.0, 0.0, 0.0]])
    plan = _plan("top_k", k=2, spell=lambda i: repr(f"t{i}"))
    got = scoring.score(plan, {"of": of.unsqueeze(1)}, {"of": _placed(("", "", ""))}, (True, True, True))
    p0, p2 = of[0].softmax(-1).tolist(), of[2].softmax(-1).tolist()
    assert got == [[["'t1'", p0[1]], ["'t2'", p0[2]]], None, [["'t0'", p2[0]], ["'t1'", p2[1]]]]


@pytest.mark.fast
@pytest.mark.parametrize("where, said", [
    (lambda fit: fit.update(objective=[[1.0, "top"]]),
     "objective names 'top', a metric whose value is a list per row; a list cannot be minimized"),
    (lambda fit: fit["early_stop"].update(metric="top"),
     "early_stop watches 'top', a metric whose value is a list per row; a list cannot be watched"),
], ids=["objective", "early-stop"])
def test_a_top_k_metric_is_no_objective_and_no_early_stop(where, said):
    """SPEC.md:145 [D27] the original's words (its test_readout.py): a list per row cannot be minimized or
    watched; refused at the objective's term or the early stop's metric."""
    raw = json.loads((REPO / "documents" / "das.json").read_text(encoding="utf-8"))
    fit = next(s for s in raw["steps"].values() if s.get("kind") == "fit")
    iv = fit.get("interventions") or fit.get("intervention")
    iv = iv if isinstance(iv, str) else iv[0]
    of = next(m["of"] for m in raw["interventions"][iv]["metrics"].values())
    raw["interventions"][iv]["metrics"]["top"] = {"kind": "top_k", "of": of}
    where(fit)
    with pytest.raises(Refusal) as refusal:
        validate.document(raw)
    assert said in refusal.value.message and refusal.value.stage == "validation"


def test_a_top_k_table_past_a_million_pairs_is_refused_at_compile(llama):
    """SPEC.md:145 [D27] rows x k is bounded before any row is made: 4 rows x 32000 fits no bound but 250,001
    pairs per row would; k 32000 on the 4-row data is 128,000 pairs and compiles, and a 40-row table of k
    32000 (1,280,000 pairs) is refused at `<metric>.k`."""
    plan = compiler.compile_document(doc(kind="top_k", of="logits", k=32000), llama, DATA)
    assert plan.leaves()[0].steps[0].metrics[0].k == 32000
    with pytest.raises(Refusal) as refusal:
        compiler._check_k(validate.document(doc(kind="top_k", of="logits", k=32000)).interventions[0][1].metrics[0][1],
                          32000, "m", f"{MP}.m", 40)
    assert (refusal.value.stage, refusal.value.path) == ("compile", f"{MP}.m.k")
    assert refusal.value.message == ("metric 'm': k 32000 on 40 rows is 1,280,000 [token, probability] pairs, "
                                     "more than the 1,000,000 a table holds; write a smaller k or score fewer rows")


def _plan(kind: str, **extra) -> MetricPlan:
    row = metrics.KINDS[kind]
    return MetricPlan(name="m", kind=kind, of="of", answers=(), eligible=(True, True, True), unit=row.unit,
                      estimand_version=row.estimand_version, **extra)


def _placed(reasons: tuple) -> Resolved:
    return Resolved(windows=tuple(() if r else (5,) for r in reasons), reasons=reasons, tokens=("",) * len(reasons))


@pytest.mark.fast
def test_a_row_against_did_not_place_is_not_scored():
    """SPEC.md:139 [D25] a row is scored when both `of` and `against` placed it (P30 over both reads)."""
    plan = _plan("kl", against="ref")
    placed = {"of": _placed(("", "", "")), "ref": _placed(("", "anchor_not_found", ""))}
    assert eligible_rows(plan, placed) == (True, False, True)


@pytest.mark.fast
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_logit_in_against_gives_the_row_a_null(bad):
    """SPEC.md:153 [D28] a non-finite entry in `against`'s vector (not only `of`'s) gives S52's null for that
    row alone; the other rows keep their values."""
    of, against = _rows(n=3)
    against[1, 7] = bad
    plan = _plan("js", against="ref")
    placed = {"of": _placed(("", "", "")), "ref": _placed(("", "", ""))}
    values = {"of": of.unsqueeze(1), "ref": against.unsqueeze(1)}  # (rows, 1, V), as a rectangular read is
    got = scoring.score(plan, values, placed, (True, True, True))
    assert got[1] is None and all(isinstance(v, float) and math.isfinite(v) for v in (got[0], got[2]))


# ---------------------------------------------------------------- token_form "bare" (D29)


@pytest.fixture(scope="module")
def weekday_tok():
    from causalab_ref.fixtures import builder
    return builder.tokenizer("fixture:weekday-llama")


@pytest.mark.fast
def test_bare_encodes_the_stripped_text_with_no_space(weekday_tok):
    """SPEC.md:174 [D29] `bare` spells the answer as the first word of a text: on the weekday BPE ' Monday'
    is 519 bare and 315 space_prefixed (its own encodings of 'Monday' and ' Monday')."""
    assert data.answer_id(weekday_tok, " Monday", "p", token_form="bare") == 519
    assert data.answer_id(weekday_tok, "Monday", "p", token_form="bare") == 519
    assert data.answer_id(weekday_tok, "Monday", "p") == 315
    assert weekday_tok.encode("Monday", add_special_tokens=False) == [519]


@pytest.mark.fast
def test_a_bare_answer_of_two_tokens_is_refused_with_its_surface():
    """SPEC.md:174 [D29] a bare answer is exactly one id too, else D15's refusal quoting the bare surface."""
    from causalab_ref.fixtures import builder
    tok = builder.tokenizer("fixture:tiny-gpt2")  # 'Monday' is 3 tokens there, ' Monday' one
    assert data.answer_id(tok, "Monday", "p") == 615
    with pytest.raises(Refusal) as refusal:
        data.answer_id(tok, "Monday", "p", token_form="bare")
    assert refusal.value.message.startswith("answer 'Monday' is 3 tokens as 'Monday'; a metric column must resolve")


@pytest.mark.fast
@pytest.mark.parametrize("text", ["</s>", "<unk>", "<s>"])
@pytest.mark.parametrize("form", ["bare", "space_prefixed"])
def test_a_special_tokens_spelling_is_text_not_the_special_token(weekday_tok, text, form):
    """SPEC.md:174 [D29] an answer is encoded with no special tokens, none parsed from its text either: a bare
    `</s>` was scored as the end-of-sequence token (id 2), eligible, where the same answer space_prefixed was
    refused (issue 38). Both forms now spell it in ordinary tokens, so it is D15's refusal of several ids; the
    tokenizer's own special-token-free encoding is the ground (the backend with special tokens as text)."""
    backend = weekday_tok.backend_tokenizer
    backend.encode_special_tokens = True
    try:
        plain = backend.encode((" " if form == "space_prefixed" else "") + text, add_special_tokens=False).ids
    finally:
        backend.encode_special_tokens = False
    assert len(plain) > 1 and not set(plain) & {0, 1, 2}
    with pytest.raises(Refusal) as refusal:
        data.answer_id(weekday_tok, text, "p", token_form=form)
    assert refusal.value.message.startswith(f"answer '{text}' is {len(plain)} tokens as ")
    assert weekday_tok.encode(text, add_special_tokens=False) == [{"</s>": 2, "<unk>": 0, "<s>": 1}[text]]


@pytest.mark.fast
def test_token_form_is_one_of_the_two_forms():
    """SPEC.md:174 [D29] token_form is space_prefixed or bare; anything else is refused naming both."""
    refusal = _refused(doc(kind="soft_accuracy", of="logits", expected="cf_answer", token_form="spaced"))
    assert refusal.path == f"{MP}.m.token_form"
    assert refusal.message.startswith("'spaced' is not one of ['space_prefixed', 'bare']")


# ---------------------------------------------------------------- a run of all four on the Llama fixture


def _four() -> dict:
    raw = doc(kind="soft_accuracy", of="logits", expected="cf_answer")
    raw["interventions"]["patching"]["metrics"] = {
        "soft": {"kind": "soft_accuracy", "of": "logits", "expected": "cf_answer"},
        "prob": {"kind": "token_prob", "of": "logits", "token": "cf_answer"},
        "kl": {"kind": "kl", "of": "logits", "against": "clean"},
        "js": {"kind": "js", "of": "logits", "against": "clean"},
        "top": {"kind": "top_k_overlap", "of": "logits", "against": "clean", "k": 4},
        "list": {"kind": "top_k", "of": "logits", "k": 4},
        "same": {"kind": "kl", "of": "clean", "against": "clean"}}
    raw["steps"]["score"]["saves"] = [{"value": m, "file_path": f"{m}.json"}
                                      for m in raw["interventions"]["patching"]["metrics"]]
    return raw


@pytest.fixture(scope="module")
def tables(llama):
    from causalab_ref.runs import passes
    plan = compiler.compile_document(_four(), llama, DATA)
    step = plan.leaves()[0].steps[0]
    return (step, passes.run_step(llama, step, score_as_you_go=True),
            passes.run_step(llama, step, rows_per_pass=2, score_as_you_go=True))


def test_the_four_kinds_run_with_their_units_and_versions(tables):
    """SPEC.md:153 [D28] each kind's table carries its unit and estimand version; soft_accuracy equals
    token_prob of the same column bit for bit; kl of a read against itself is 0 on every row."""
    step, whole, _ = tables
    units = {m.name: (m.unit, m.estimand_version) for m in step.metrics}
    assert units["soft"] == ("probability", "soft_accuracy/v1") and units["kl"] == ("nat", "kl/v1")
    assert units["js"] == ("nat", "js/v1") and units["top"] == ("fraction", "top_k_overlap/v1")
    assert whole.scores["soft"] == whole.scores["prob"]
    assert whole.scores["same"] == [0.0] * len(step.example_ids)
    assert all(0 <= v <= math.log(2) + 1e-6 for v in whole.scores["js"] if v is not None)
    assert all(v in (0.0, 0.25, 0.5, 0.75, 1.0) for v in whole.scores["top"])
    assert units["list"] == ("[token, probability] list", "top_k/v1")


def test_a_top_k_row_is_its_k_most_likely_tokens_spelled_with_their_probabilities(tables, llama):
    """SPEC.md:153 [D28] the original's test_readout.py, on the Llama fixture: every row is k pairs, the
    probabilities descending and summing to at most 1, the first the argmax of softmax(logits) in float32 with
    its probability, each token repr(decode([id])); a chunked pass (--batch-size 2) gives the same lists."""
    step, whole, chunked = tables
    rows = whole.scores["list"]
    assert len(rows) == len(step.example_ids) and all(len(row) == 4 for row in rows)
    for row in rows:
        probabilities = [p for _, p in row]
        assert probabilities == sorted(probabilities, reverse=True) and 0 < sum(probabilities) <= 1
        assert all(isinstance(t, str) and t[:1] in ("'", '"') for t, _ in row)
    from causalab_ref.runs import passes
    logits = passes.run_step(llama, step).values["logits"][:, 0]  # (rows, V): the patched head at the last token
    top = logits.float().softmax(-1).max(-1)
    assert [row[0][1] for row in rows] == top.values.tolist()
    assert [row[0][0] for row in rows] == [repr(llama.tokenizer.decode([i])) for i in top.indices.tolist()]
    assert [[t for t, _ in row] for row in chunked.scores["list"]] == [[t for t, _ in row] for row in rows]


def test_a_comparing_metric_scored_in_chunks_equals_the_whole_pass(tables):
    """SPEC.md:139 [D25] `of` and `against` are scored in the same chunks: --batch-size 2 gives the whole
    pass's values (R11, to float32 rounding)."""
    _, whole, chunked = tables
    for name in ("kl", "js", "top"):
        assert chunked.scores[name] == pytest.approx(whole.scores[name], rel=1e-4, abs=1e-6)


@pytest.mark.fast
def test_vocab_and_the_schema_name_the_later_kinds_and_their_fields(capsys):
    """SPEC.md:128 [D24] `vocab` lists each kind with its fields (`top_k(against, k=5)`) and the two token
    forms; the JSON Schema's metric of each kind requires `against` where the kind does and takes `k` as an
    integer >= 1."""
    from causalab_ref import cli
    from causalab_ref.documents import schema
    assert cli.main(["vocab"]) == 0
    out = capsys.readouterr().out
    assert "soft_accuracy(expected), kl(against), js(against), top_k(k=5), top_k_overlap(against, k=5)" in out
    assert "token forms:      space_prefixed, bare" in out
    kinds = {m["properties"]["kind"]["const"]: m for m in schema.SCHEMA["$defs"]["metric"]["oneOf"]}
    assert kinds["top_k"]["required"] == ["kind", "of"] and "against" not in kinds["top_k"]["properties"]
    assert kinds["top_k_overlap"]["required"] == ["kind", "of", "against"]
    for kind in ("top_k", "top_k_overlap"):
        assert kinds[kind]["properties"]["k"]["anyOf"][0] == {"type": "integer", "minimum": 1}
    assert kinds["soft_accuracy"]["properties"]["token_form"]["anyOf"][0] == {"enum": ["space_prefixed", "bare"]}


@pytest.mark.fast
def test_the_weekday_cases_hold_the_laws_stated_before_measuring():
    """SPEC.md:957 [C38] the entity swap's top_k_overlap (k = 1) is 0 and kl, js > 0 on every row, bare and spaced answers
    differ; the shared-token swap's kl and js are 0 and top_k_overlap 1 exactly (the cases' recorded expectations)."""
    corpus = REPO / "causalab_ref" / "conformance" / "corpus"

    def values(case: str, table: str) -> list:
        return [r["value"] for r in json.loads((corpus / f"{case}.json").read_text())["expect"]["tables"][table]]
    entity = "run_weekday_divergence"
    assert set(values(entity, "top1.json")) == {0.0} and set(values(entity, "iia.json")) == {1.0}
    assert all(0 < v for v in values(entity, "kl.json"))
    assert all(0 < v <= math.log(2) for v in values(entity, "js.json"))
    assert values(entity, "soft.json") == values(entity, "p_spaced.json")
    assert all(b != s for b, s in zip(values(entity, "p_bare.json"), values(entity, "p_spaced.json")))
    shared = "run_weekday_shared_token_divergence"
    assert set(values(shared, "kl.json")) == set(values(shared, "js.json")) == {0.0}
    assert set(values(shared, "top3.json")) == {1.0}


@pytest.mark.fast
def test_the_fuzzer_knows_the_later_fields():
    """SPEC.md:1319 [S58] the document fuzzer mutates the shipped divergence document with the new fields' names, kinds
    and k's hostile numbers."""
    import sys
    sys.path.insert(0, str(REPO / "tests"))
    import fuzzing
    assert REPO / "documents" / "weekday_divergence.json" in fuzzing.DOCUMENTS
    assert {"kl", "js", "top_k", "top_k_overlap", "soft_accuracy", "against", "bare", "k"} <= set(
        fuzzing.WEIRD_STRINGS)
    assert {1e9, 32000, 32001} <= set(fuzzing.WEIRD_NUMBERS)


@pytest.mark.parametrize("seed", range(24))
def test_the_fuzzers_readout_mutation_meets_no_internal_error(seed, tmp_path):
    """SPEC.md:1319 [S58] fuzzing.readout (a metric made top_k or top_k_overlap, a hostile k, a stray against,
    a top_k as a fit's objective or early stop) on every shipped document: validate and explain end in ok or
    one refusal line, never an internal error."""
    import random
    import sys
    sys.path.insert(0, str(REPO / "tests"))
    import fuzzing
    rng = random.Random(seed)
    source = fuzzing.DOCUMENTS[seed * 7 % len(fuzzing.DOCUMENTS)]
    raw = fuzzing.readout(rng, json.loads(source.read_text(encoding="utf-8")))
    doc_path = tmp_path / "doc.json"
    doc_path.write_text(json.dumps(raw), encoding="utf-8")
    with fuzzing.cached_loads():
        for verb in ("validate", "explain"):
            ok, status, text = fuzzing.check([verb, str(doc_path), "--data-root", str(DATA)])
            assert ok and status in (0, 2), (source.name, verb, status, text)


def test_the_originals_readout_runs_and_plot_draws_no_list_table(tmp_path):
    """SPEC.md:153 [D28] SPEC.md:2461 [FG4] documents/steps_first/readout.json runs: top3.json is 4 rows of 3
    [token, probability] pairs (unit '[token, probability] list', top_k/v1), its summary line gives the first
    row's pairs and no mean; plot draws p_answer alone, and a folder of top3 alone is one refusal naming why."""
    import shutil
    from causalab_ref.figures import plot
    from tests.inprocess import cli
    out = tmp_path / "out"
    done = cli("run", str(REPO / "documents" / "steps_first" / "readout.json"), "--data-root", str(DATA),
               "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = json.loads((out / "top3.json").read_text(encoding="utf-8"))
    assert len(rows) == 4 and all(len(r["value"]) == 3 and r["unit"] == "[token, probability] list"
                                  and r["estimand_version"] == "top_k/v1" for r in rows)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith(f"{out / 'top3.json'}:"))
    first = ", ".join(f"{t} {p:.6g}" for t, p in rows[0]["value"])
    assert line.endswith(f"top3 4 of 4 rows scored ([token, probability] list); first [{first}]") and "mean" not in line
    assert [p.title.split(":")[0] for p in plot.panels(out)] == ["p_answer.json"]
    (out / "p_answer.json").unlink()
    with pytest.raises(Refusal) as refusal:
        plot.panels(out)
    assert "a table whose value per row is a list, top_k's, is not drawn" in refusal.value.message
    shutil.rmtree(out)
