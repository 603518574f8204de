"""The shipped Locations documents: a heads sweep, the attention pattern, a layer sweep (logit lens)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from causalab_ref.runs import compile as compiler
from causalab_ref.engines import loading
from causalab_ref.documents import reader, sweeps, validate
from causalab_ref.runs import run
from causalab_ref.shapes import Refusal

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"


def _doc(name):
    return json.loads((ROOT / "documents" / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def llama_eager():
    spec = validate.document(sweeps.points(_doc("attention_pattern_patching"))[0][1]).model
    return loading.load(spec, weights=True)


def test_explain_head_patching_prints_the_seeds_plan_lines(llama):
    """SPEC.md:549 [R5] explain prints each point, forward and tap; features=[h]/4 is head h of four and
    lm_head carries no layer (seed 004:9-29)."""
    text = compiler.compile_document(_doc("head_patching"), llama, DATA).text()
    lines = text.splitlines()
    assert lines[:8] == [
        "<root>: Plan",
        "  heads=0: Plan",
        "    score: Observe  metrics=['iia/match', 'logit_diff/logit_diff']  saves=['iia.json', 'logit_diff.json']",
        "        forward 'original' on 'counterfactual'  (4 rows x 11 tokens)",
        "          read  'v_cf' at attention_premix[0] pos={index:-1} features=[0]/4 via 'identity'",
        "        forward 'patched' on 'base'  (4 rows x 11 tokens)",
        "          write 'patch' at attention_premix[0] pos={index:-1} features=[0]/4 swap(v_cf) via 'identity'",
        "          read  'logits' at lm_head pos={index:-1} via 'identity'",
    ]
    assert "          read  'v_cf' at attention_premix[0] pos={index:-1} features=[3]/4 via 'identity'" in lines


def test_a_swept_run_writes_one_directory_per_point(llama, tmp_path):
    """SPEC.md:552 [R6] a swept run writes each point's document.json and saves under its label
    (seed 004:386-395)."""
    plan = compiler.compile_document(_doc("head_patching"), llama, DATA)
    written = run.execute(plan, llama, tmp_path / "heads")
    names = [str(Path(p).relative_to(tmp_path / "heads")) for p in written]
    assert names[:5] == ["document.json", "run.json", "heads=0/document.json", "heads=0/iia.json",
                         "heads=0/logit_diff.json"]
    assert names[-3:] == ["heads=3/document.json", "heads=3/iia.json", "heads=3/logit_diff.json"]
    point = json.loads((tmp_path / "heads" / "heads=1" / "document.json").read_text())
    assert point["sites"]["target"]["heads"] == [1]
    rows = json.loads((tmp_path / "heads" / "heads=1" / "iia.json").read_text())
    assert {r["produced_by"] for r in rows} == {reader.digest(point)}


def test_one_head_swap_leaves_the_other_heads(llama):
    """SPEC.md:421 [L13] a scatter writes the named head back and leaves the others: patching head 0 of
    attention_premix changes only its 4 features of the 16."""
    doc = sweeps.points(_doc("head_patching"))[0][1]
    doc = copy.deepcopy(doc)
    iv = doc["interventions"]["patching"]
    doc["sites"]["whole"] = {"component": "attention_premix", "layers": [0]}
    iv["reads"]["after"] = {"site": "whole", "pos": -1, "model": "patched", "input": "base"}
    iv["reads"]["before"] = {"site": "whole", "pos": -1, "model": "original", "input": "base"}
    plan = compiler.compile_document(doc, llama, DATA)
    values = run.run_step(llama, plan.steps[0]).values
    after, before, v_cf = values["after"][:, 0], values["before"][:, 0], values["v_cf"][:, 0]
    assert torch.equal(after[:, :4], v_cf)
    assert torch.equal(after[:, 4:], before[:, 4:])


def test_a_pattern_swap_between_different_layouts_is_refused_at_compile(llama_eager):
    """SPEC.md:408 [L11] the pattern's last axis is keys: a swap between batches whose attention masks
    differ is refused when compiled (seed-tables B5)."""
    doc = copy.deepcopy(_doc("attention_pattern_patching"))
    doc["steps"]["score"]["rows"] = {"base": "weekdays/train", "counterfactual": "weekdays/train"}
    with pytest.raises(Refusal) as refusal:
        compiler.compile_document(doc, llama_eager, DATA)
    assert refusal.value.stage == "compile"
    assert "their attention masks differ" in refusal.value.message
    assert refusal.value.path == "interventions.patching.writes.patch"


def test_the_pattern_document_runs_on_aligned_rows(llama_eager, tmp_path):
    """SPEC.md:408 [L11] under eager attention the pattern exists; on weekdays_aligned the swap runs: head 0's
    pattern row at the last query takes the counterfactual's values, and every other head and every other
    query position of every row is bit-identical to the base run's."""
    plan = compiler.compile_document(_doc("attention_pattern_patching"), llama_eager, DATA)
    results = run.run_step(llama_eager, plan.leaves()[0].steps[0])
    assert results.values["v_cf"].shape == (6, 1, 9)
    assert len(results.scores["iia"]) == 6
    doc = copy.deepcopy(sweeps.points(_doc("attention_pattern_patching"))[0][1])  # the point heads=[0]
    iv = doc["interventions"]["patching"]
    doc["sites"]["whole"] = {"component": "attention_probs", "layers": [0]}  # all 4 heads, (query, head x key)
    iv["reads"]["after"] = {"site": "whole", "pos": {"last": 8}, "model": "patched", "input": "base"}
    iv["reads"]["before"] = {"site": "whole", "pos": {"last": 8}, "model": "original", "input": "base"}
    iv["reads"]["cf"] = {"site": "whole", "pos": -1, "model": "original", "input": "counterfactual"}
    values = run.run_step(llama_eager, compiler.compile_document(doc, llama_eager, DATA).steps[0]).values
    after, before, v_cf = values["after"], values["before"], values["v_cf"][:, 0]
    keys = v_cf.shape[-1]
    assert after.shape == before.shape == (6, 8, 4 * keys)
    assert torch.equal(values["cf"][:, 0, :keys], v_cf)  # head 0 is the first `keys` features of the site
    assert not torch.equal(before[:, -1, :keys], v_cf)  # the base's own pattern differs: the swap is visible
    assert torch.equal(after[:, -1, :keys], v_cf)
    assert torch.equal(after[:, -1, keys:], before[:, -1, keys:])
    assert torch.equal(after[:, :-1], before[:, :-1])


def test_the_pattern_under_sdpa_is_refused_saying_what_to_write(llama):
    """SPEC.md:408 [L11] under sdpa the refusal says to write "attn_implementation": "eager"."""
    doc = copy.deepcopy(_doc("attention_pattern_patching"))
    del doc["model"]["attn_implementation"]
    with pytest.raises(Refusal) as refusal:
        compiler.compile_document(doc, llama, DATA)
    assert refusal.value.message == ("component 'attention_probs' exists only under 'eager' attention, and this "
                                     "model runs 'sdpa': say \"attn_implementation\": \"eager\" in the document's "
                                     "model block")


def test_logit_lens_at_the_last_layer_equals_the_head(llama):
    """SPEC.md:406 [L10] "view": "logits" pushes the residual through the final norm and the head: at the
    last block it is the head's own output."""
    doc = sweeps.points(_doc("layer_sweep"))[1][1]
    doc = copy.deepcopy(doc)
    doc["sites"]["head"] = {"component": "lm_head"}
    doc["interventions"]["lens"]["reads"]["head"] = {"site": "head", "pos": -1, "input": "base"}
    values = run.run_step(llama, compiler.compile_document(doc, llama, DATA).steps[0]).values
    assert torch.allclose(values["lens"], values["head"], atol=1e-5)
