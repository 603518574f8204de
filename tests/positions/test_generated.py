"""The generated frame on the Llama fixture: decode, per-step reads cut against the continuation,
writes at reached steps.

Which rows "said" their text depends on the fixture's weights, so the provenance test
first decodes, then chooses each row's `said` from what that row generated.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from causalab_ref.runs import compile as compiler
from causalab_ref.fixtures import builder
from causalab_ref.positions import resolve
from causalab_ref.runs import run
from causalab_ref.documents import validate
from causalab_ref.shapes import Anchor, Refusal, Where

from conftest import Delegate

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
GENERATED = json.loads((ROOT / "documents" / "generated_answer.json").read_text())
PROMPTS = [f"If today is {d}, tomorrow is" for d in ("Thursday", "Friday", "Saturday", "Sunday")]


def _greedy(llama, decode):
    """The fixture's own greedy continuation, through plain transformers (no engine code)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(builder.checkpoint_dir("fixture:tiny-llama")).eval()
    tok = llama.tokenizer
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=decode, min_new_tokens=decode, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
    return out.sequences[:, enc["input_ids"].shape[1]:], torch.stack(out.logits, dim=1)


def _rows_with_said(tmp_path, said):
    rows = json.loads((DATA / "weekdays" / "said.json").read_text())
    for row, text in zip(rows, said):
        row["said"] = text
        row["example_id"] = text
    (tmp_path / "weekdays").mkdir(exist_ok=True)
    (tmp_path / "weekdays" / "said.json").write_text(json.dumps(rows))
    return tmp_path


def _run(llama, doc, root=DATA):
    plan = compiler.compile_document(doc, llama, Path(root))
    step = plan.steps[0]
    return step, run.run_step(llama, step), plan


def test_said_rows_report_the_step_and_token_others_alignment_missing(llama, tmp_path):
    """SPEC.md:342 [P45] a row that said its text reports the step and the token; a row that did not is
    alignment_missing, value null, eligible false, and stays in the table (seed 000:286-291)."""
    generated, _ = _greedy(llama, 6)
    tok = llama.tokenizer
    said = [tok.decode([int(generated[0, 2])]).strip(), tok.decode([int(generated[1, 4])]).strip(),
            "Friday", "Saturday"]
    root = _rows_with_said(tmp_path, said)
    step, results, plan = _run(llama, GENERATED, root)
    where = results.positions["at_said"]
    assert where["rows"] == ((2,), (4,), (), ())
    assert where["reason"] == ("", "", "alignment_missing", "alignment_missing")
    assert where["tokens"][:2] == (repr(tok.decode([int(generated[0, 2])])),
                                   repr(tok.decode([int(generated[1, 4])])))
    assert results.eligible["p_answer"] == (True, True, False, False)
    table = run.metric_table(step, results, "p_answer", plan.digest)
    assert [r["eligible"] for r in table] == [True, True, False, False]
    assert table[2]["value"] is None and table[2]["positions"] == [] and table[2]["reason"] == "alignment_missing"


def test_no_row_stops_so_eos_is_alignment_missing_everywhere(llama):
    """SPEC.md:319 [P37] EOS is held off, so no row stops and the eos segment is missing on every row
    (seed 000:322)."""
    _step, results, _plan = _run(llama, GENERATED)
    assert results.positions["at_stop"]["reason"] == ("alignment_missing",) * 4
    assert results.positions["at_stop"]["rows"] == ((), (), (), ())


def test_decode_runs_to_its_bound_greedily(llama):
    """SPEC.md:315 [P36] every forward decodes exactly `decode` tokens, greedily: the ids equal
    transformers' own greedy generate with min == max new tokens."""
    _step, results, _plan = _run(llama, GENERATED)
    want, _ = _greedy(llama, 6)
    assert torch.equal(results.values["original.generated"], want)


def test_a_decode_past_the_models_positions_is_refused_at_compile(llama):
    """SPEC.md:315 [P36] prompt length + decode beyond max_position_embeddings is refused before any forward."""
    doc = copy.deepcopy(GENERATED)
    doc["interventions"]["generation"]["decode"] = 5000
    doc["interventions"]["generation"]["reads"] = {"step0": {"site": "head", "input": "base",
                                                             "pos": {"frame": "generated", "index": 0}}}
    doc["interventions"]["generation"]["metrics"] = {"p": {"kind": "token_prob", "of": "step0", "token": "cf_answer"}}
    doc["steps"]["score"]["saves"] = []
    with pytest.raises(Refusal) as refusal:
        compiler.compile_document(doc, llama, DATA)
    assert refusal.value.message == ("decode 5000 after a 11-token prompt runs past the model's 2048 positions; "
                                     "decode at most 2037 tokens")
    assert refusal.value.path == "interventions.generation.decode"


def test_a_continuation_write_with_a_cut_and_a_scope_gets_the_cut_refusal():
    """SPEC.md:335 [P42] the finished-continuation cut is refused before the scope, in A9's order."""
    doc = copy.deepcopy(GENERATED)
    iv = doc["interventions"]["generation"]
    iv["writes"] = {"w": {"site": "head", "mechanism": "swap", "operand": 0.0,
                          "pos": {"frame": "generated", "index": -1, "scope": {"variable": "said"}}}}
    with pytest.raises(Refusal) as refusal:
        validate.document(doc)
    assert "names a cut of the finished continuation" in refusal.value.message


def test_a_step_read_is_the_logits_that_produced_that_token(llama, tmp_path):
    """SPEC.md:324 [P39] step k is the forward that produces generated token k: token_prob at the step of
    the said token equals softmax of transformers' score for that step."""
    generated, scores = _greedy(llama, 6)
    tok = llama.tokenizer
    said = [tok.decode([int(generated[r, 3])]).strip() for r in range(2)] + ["Friday", "Saturday"]
    root = _rows_with_said(tmp_path, said)
    step, results, _plan = _run(llama, GENERATED, root)
    rows = json.loads((root / "weekdays" / "said.json").read_text())
    for r in range(2):
        assert results.positions["at_said"]["rows"][r] == (3,)
        token = tok.encode(" " + rows[r]["cf_answer"].lstrip(), add_special_tokens=False)[0]
        want = float(torch.softmax(scores[r, 3].float(), -1)[token])
        assert results.scores["p_answer"][r] == pytest.approx(want, rel=1e-5)


def test_a_fixed_step_read_fires_at_that_step(llama):
    """SPEC.md:324 [P39] {"frame": "generated", "index": k} reads step k and reports position k and the
    token produced there."""
    doc = copy.deepcopy(GENERATED)
    doc["interventions"]["generation"]["reads"]["step2"] = {"site": "head", "pos": {"frame": "generated",
                                                                                    "index": 2}, "input": "base"}
    _step, results, _plan = _run(llama, doc)
    generated, scores = _greedy(llama, 6)
    assert torch.allclose(results.values["step2"][:, 0], scores[:, 2], atol=1e-4)
    assert results.positions["step2"]["rows"] == ((2,),) * 4
    tok = llama.tokenizer
    assert results.positions["step2"]["tokens"][0] == repr(tok.decode([int(generated[0, 2])]))


def test_a_write_at_step_k_changes_the_continuation_from_k_on(llama):
    """SPEC.md:339 [P43] a write at decode step k leaves tokens before k as they were and changes the
    continuation from step k."""
    doc = copy.deepcopy(GENERATED)
    intervention = doc["interventions"]["generation"]
    doc["sites"]["resid"] = {"component": "block_output", "layers": [1]}
    intervention["writes"] = {"push": {"site": "resid", "pos": {"frame": "generated", "index": 2},
                                       "mechanism": "swap", "operand": 50.0}}
    intervention["models"] = {"pushed": {"input": "base", "writes": ["push"]}}
    intervention["reads"]["after"] = {"site": "head", "pos": {"frame": "generated", "index": 3},
                                      "model": "pushed", "input": "base"}
    _step, results, _plan = _run(llama, doc)
    plain = results.values["original.generated"]
    pushed = results.values["pushed.generated"]
    assert torch.equal(pushed[:, :2], plain[:, :2])
    assert not torch.equal(pushed[:, 2:], plain[:, 2:])


def test_a_stacked_read_over_256_mib_is_refused_at_compile_without_allocating(llama):
    """SPEC.md:333 [P41] rows x decode x width x 4 bytes above 256 MiB is refused when compiled, giving the
    number and what to change."""
    doc = copy.deepcopy(GENERATED)
    doc["interventions"]["generation"]["decode"] = 600
    with pytest.raises(Refusal) as refusal:
        compiler.compile_document(doc, llama, DATA)
    assert refusal.value.stage == "compile"
    assert "4 rows x 600 steps x 32000 features x 4 bytes = 307200000 bytes" in refusal.value.message
    assert "--batch-size" in refusal.value.message
    assert refusal.value.path == "interventions.generation.reads.at_said.pos"


def test_continuation_map_is_built_from_the_decoded_ids(llama):
    """SPEC.md:322 [P38] the continuation's offsets come from decoding prefixes of the generated ids."""
    generated, _ = _greedy(llama, 6)
    tok = llama.tokenizer
    frame = resolve.frame_of_continuation(tok, generated, tok.eos_token_id)
    for r in range(4):
        ids = generated[r].tolist()
        assert frame.offsets[r] == resolve.char_map(tok, ids)
        assert frame.texts[r] == tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def test_eos_resolves_over_hand_made_ids(llama):
    """SPEC.md:319 [P37] the positive eos case over hand-made ids: the frame ends at the first stop token
    and eos is that token; a row that never stopped has no eos (seed 000:322)."""
    tok = llama.tokenizer
    eos = tok.eos_token_id
    frame = resolve.frame_of_continuation(tok, [[450, 1095, 29889, eos, 450, 1095], [450, 1095, 29889, 450, 1095, 2]
                                               [:5] + [450]], eos)
    assert frame.ends == (4, 6)
    windows, reasons = resolve.resolve(frame, Where(frame="generated", index=-1, scope=Anchor(segment="eos")))
    assert windows == ((3,), ()) and reasons == ("", "alignment_missing")
    last, _ = resolve.resolve(frame, Where(frame="generated", index=-1))
    assert last == ((3,), (5,))


def test_prompt_taps_in_a_decode_act_at_step_zero(llama):
    """SPEC.md:340 [P44] a prompt read in a decoding forward is the prompt's own forward: it equals the
    same read without decode."""
    doc = copy.deepcopy(GENERATED)
    doc["interventions"]["generation"]["reads"]["prompt_last"] = {"site": "head", "pos": -1, "input": "base"}
    _step, with_decode, _plan = _run(llama, doc)
    _g, scores = _greedy(llama, 6)
    assert torch.allclose(with_decode.values["prompt_last"][:, 0], scores[:, 0], atol=1e-4)


def test_an_earlier_prompt_position_of_the_head_during_a_decode_is_refused(llama):
    """SPEC.md:340 [P44] the head is computed at the last prompt position only during a decode; asking for
    an earlier one is refused rather than read from a neighbour."""
    doc = copy.deepcopy(GENERATED)
    doc["interventions"]["generation"]["reads"]["early"] = {"site": "head", "pos": -2, "input": "base"}
    with pytest.raises(Refusal, match="computes this tensor at the last 1 prompt position") as refusal:
        _run(llama, doc)
    assert refusal.value.path == "interventions.generation.reads.early.pos"


def test_other_continuation_cuts_stack_every_step_and_cut_per_row(llama):
    """SPEC.md:328 [P40] a negative index, `last`, and `all` in the generated frame are one read per decode
    step, stacked and cut per row against the continuation afterwards: the plan says so, and the values
    are transformers' scores at the steps each cut names (no row stops, so -1 is step 5)."""
    doc = copy.deepcopy(GENERATED)
    reads = doc["interventions"]["generation"]["reads"]
    reads["tail"] = {"site": "head", "pos": {"frame": "generated", "last": 2}, "input": "base"}
    reads["final"] = {"site": "head", "pos": {"frame": "generated", "index": -1}, "input": "base"}
    reads["every"] = {"site": "head", "pos": {"frame": "generated", "all": True}, "input": "base"}
    step, results, plan = _run(llama, doc)
    taps = {t.name: t for f in step.forwards for t in f.taps}
    assert all(taps[n].stacked == 6 for n in ("tail", "final", "every"))
    assert "read  'tail' at lm_head pos={generated last:2} via 'identity'  (stacked over 6 decode steps, cut " \
           "against the continuation)" in plan.text()
    _generated, scores = _greedy(llama, 6)
    where = results.positions
    assert where["tail"]["rows"] == ((4, 5),) * 4 and where["final"]["rows"] == ((5,),) * 4
    assert where["every"]["rows"] == (tuple(range(6)),) * 4
    values = results.values
    assert values["tail"].shape == (4, 2, scores.shape[-1])
    assert torch.allclose(values["tail"], scores[:, 4:6], atol=1e-4)
    assert torch.allclose(values["final"][:, 0], scores[:, 5], atol=1e-4)
    assert torch.allclose(values["every"], scores.flatten(0, 1), atol=1e-4)  # ragged: flat, row by row


def _forced_stop_document() -> dict:
    """The issue's example: a swap of 1000.0 into the head's unit 2 (the tokenizer's EOS) at decode step 1,
    and a second write at step 3; reads at the stop token and at the continuation's last token."""
    doc = copy.deepcopy(GENERATED)
    doc["sites"].update({"eos_unit": {"component": "lm_head", "units": [2]},
                         "resid": {"component": "block_output", "layers": [0]}})
    intervention = doc["interventions"]["generation"]
    intervention["decode"] = 4
    intervention["writes"] = {
        "force": {"site": "eos_unit", "pos": {"frame": "generated", "index": 1}, "mechanism": "swap",
                  "operand": 1000.0},
        "late": {"site": "resid", "pos": {"frame": "generated", "index": 3}, "mechanism": "swap", "operand": 0.0}}
    intervention["models"] = {"forced": {"input": "base", "writes": ["force", "late"]}}
    intervention["reads"] = {
        "at_stop": {"site": "head", "pos": {"frame": "generated", "index": -1, "scope": {"segment": "eos"}},
                    "input": "base", "model": "forced"},
        "last": {"site": "head", "pos": {"frame": "generated", "index": -1}, "input": "base", "model": "forced"}}
    intervention["metrics"] = {"p_last": {"kind": "token_prob", "of": "last", "token": "cf_answer"}}
    doc["steps"]["score"]["saves"] = [{"value": "p_last", "file_path": "p_last.json"}]
    return doc


def test_every_stop_id_is_held_off_so_a_forced_stop_token_is_never_generated(llama):
    """SPEC.md:345 [P53] a decode holds off every id its continuation can end at — the tokenizer's EOS (2 on
    the Llama fixture) and the generation config's (1) — so the issue's forced stop runs to the end: no
    generated id is a stop id, the eos read is alignment_missing on every row, and -1 is the last step."""
    assert llama.stop_ids() == (1, 2)
    _step, results, _plan = _run(llama, _forced_stop_document())
    generated = results.values["forced.generated"]
    assert generated.shape == (4, 4)
    assert not any(int(i) in (1, 2) for i in generated.flatten())
    assert results.positions["at_stop"]["reason"] == ("alignment_missing",) * 4
    assert results.positions["last"]["rows"] == ((3,),) * 4
    assert results.positions["late"]["reason"] == ("",) * 4


class _StopsAtStepOne(Delegate):
    """The Llama engine, except that row 0's continuation says the tokenizer's EOS at step 1 (the positive
    case is reachable only over hand-made ids, seed 000:322)."""

    def generate(self, batch):
        reads, generated = self.inner.generate(batch)
        generated = generated.clone()
        generated[0, 1] = self.tokenizer.eos_token_id
        return reads, generated


def test_a_row_that_stops_ends_there_and_a_later_write_says_past_stop(llama):
    """SPEC.md:353 [P54] / SPEC.md:319 [P37] a row whose continuation stops at step 1 ends there: its eos read
    is step 1 and its -1 is step 1, and the write at step 3 reports the step it fired at with reason
    `past_stop` and no token; the row that did not stop is unchanged. Nothing crashes."""
    _step, results, _plan = _run(_StopsAtStepOne(llama), _forced_stop_document())
    where = results.positions
    assert where["at_stop"]["rows"][:2] == ((1,), ()) and where["at_stop"]["reason"][:2] == ("", "alignment_missing")
    assert where["last"]["rows"][:2] == ((1,), (3,))
    assert where["late"]["rows"][:2] == ((3,), (3,))
    assert where["late"]["reason"][:2] == ("past_stop", "")
    assert where["late"]["tokens"][0] == "" and where["late"]["tokens"][1] != ""
