"""Rules sharpened after review: qualified saves, where a layer or a head is judged, which passes report
positions, the decode bound, and operand widths at compile."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from causalab_ref import compile as compiler
from causalab_ref import engine, run, validate
from causalab_ref.shapes import Refusal

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "documents" / "data"
PATCHING = json.loads((ROOT / "documents" / "patching.json").read_text())
GENERATED = json.loads((ROOT / "documents" / "generated_answer.json").read_text())


def _two_interventions(saves):
    doc = copy.deepcopy(PATCHING)
    other = copy.deepcopy(doc["interventions"]["patching"])
    other["models"]["patched"]["writes"] = []
    doc["interventions"]["plain"] = other
    doc["steps"]["score"]["interventions"] = ["patching", "plain"]
    doc["steps"]["score"]["saves"] = saves
    return doc


def test_a_step_of_two_interventions_saves_qualified_names(llama, tmp_path):
    """SPEC.md:28 [D16] with two interventions each metric is saved as <intervention>/<metric>, into its own
    file, and the two tables differ (the patched one and the plain one)."""
    doc = _two_interventions([{"value": "patching/logit_diff", "file_path": "patched.json"},
                              {"value": "plain/logit_diff", "file_path": "plain.json"}])
    plan = compiler.compile_document(doc, llama, DATA)
    assert [s.name for s in plan.steps] == ["score/patching", "score/plain"]
    run.execute(plan, llama, tmp_path / "out")
    patched = [r["value"] for r in json.loads((tmp_path / "out" / "patched.json").read_text())]
    plain = [r["value"] for r in json.loads((tmp_path / "out" / "plain.json").read_text())]
    assert all(abs(a - b) > 1e-6 for a, b in zip(patched, plain))


def test_an_ambiguous_bare_metric_name_is_refused(llama):
    """SPEC.md:28 [D16] a bare name two interventions share is not something the step produces."""
    doc = _two_interventions([{"value": "iia", "file_path": "iia.json"}])
    with pytest.raises(Refusal) as refusal:
        validate.document(doc)
    assert refusal.value.path == "steps.score.saves.0.value"
    assert "saves 'iia', which it does not produce" in refusal.value.message


def test_two_steps_may_not_save_to_one_file():
    """SPEC.md:28 [D16] a second save to the same file_path in another step is refused."""
    doc = copy.deepcopy(PATCHING)
    doc["steps"]["again"] = copy.deepcopy(doc["steps"]["score"])
    with pytest.raises(Refusal) as refusal:
        validate.document(doc)
    assert refusal.value.path == "steps.again.saves.0.file_path"
    assert refusal.value.message == "'iia.json' is already written by step 'score'; name another file"


def test_a_negative_layer_is_refused_at_compile_by_number(llama):
    """SPEC.md:120 [L3] a negative layer is outside the stack: refused when compiled, by number."""
    doc = copy.deepcopy(PATCHING)
    doc["sites"]["target"]["layers"] = [-1]
    validate.document(doc)
    with pytest.raises(Refusal) as refusal:
        compiler.compile_document(doc, llama, DATA)
    assert (refusal.value.stage, refusal.value.message) == ("compile", "site 'target': layer -1 is outside the "
                                                            "model's 2 layers")


def test_heads_at_an_added_place_with_no_head_count_is_refused():
    """SPEC.md:131 [L14] heads at a place added with `extra` (no head count) is refused, not a TypeError."""
    spec = validate.document(PATCHING).model
    shell = engine.load(spec, weights=False, extra={"gate": ("mlp.gate_proj", 42)})
    doc = copy.deepcopy(PATCHING)
    doc["sites"]["target"] = {"component": "gate", "layers": [0], "heads": [0]}
    with pytest.raises(Refusal) as refusal:
        compiler.compile_document(doc, shell, DATA)
    assert refusal.value.message.startswith("'gate' is not a per-head tensor; `heads` applies at [")
    assert refusal.value.path == "sites.target.heads"


def test_a_last_cut_makes_a_pass_report_its_positions(llama):
    """SPEC.md:88 [P32] only a pass of bare `index` cuts reports nothing; a `last` cut is the row's own
    and is reported."""
    doc = copy.deepcopy(PATCHING)
    for op in (doc["interventions"]["patching"]["reads"]["v_cf"], doc["interventions"]["patching"]["writes"]["patch"]):
        op["pos"] = {"last": 1}
    step = compiler.compile_document(doc, llama, DATA).steps[0]
    assert step.dynamic
    results = run.run_step(llama, step)
    assert results["positions"]["patch"]["rows"] == ((10,),) * 4
    assert results["positions"]["patch"]["tokens"] == ("' is'",) * 4


def test_a_decode_past_the_models_positions_is_refused_at_compile(llama):
    """SPEC.md:94 [P36] prompt length + decode beyond max_position_embeddings is refused before any forward."""
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


def test_a_write_and_operand_of_different_widths_are_refused_at_compile(llama):
    """SPEC.md:143 [L26] 64 mlp_activation features cannot land in a 16-wide block_output: refused when
    compiled, naming both places."""
    doc = copy.deepcopy(PATCHING)
    doc["sites"]["act"] = {"component": "mlp_activation", "layers": [0]}
    doc["interventions"]["patching"]["reads"]["v_cf"]["site"] = "act"
    with pytest.raises(Refusal) as refusal:
        compiler.compile_document(doc, llama, DATA)
    assert refusal.value.message == ("write 'patch' lands 16 features per position at block_output[0], and its "
                                     "operand 'v_cf' was read with 64 at mlp_activation[0]; a swap needs the same "
                                     "width on both sides")
    assert (refusal.value.stage, refusal.value.path) == ("compile", "interventions.patching.writes.patch")


def test_a_continuation_write_with_a_cut_and_a_scope_gets_the_cut_refusal():
    """SPEC.md:100 [P42] the finished-continuation cut is refused before the scope, in A9's order."""
    doc = copy.deepcopy(GENERATED)
    iv = doc["interventions"]["generation"]
    iv["writes"] = {"w": {"site": "head", "mechanism": "swap", "operand": 0.0,
                          "pos": {"frame": "generated", "index": -1, "scope": {"variable": "said"}}}}
    with pytest.raises(Refusal) as refusal:
        validate.document(doc)
    assert "names a cut of the finished continuation" in refusal.value.message
