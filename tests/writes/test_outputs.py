"""Step outputs, {"ref"} operands, tensor saves and interventions written in place (SPEC.md §8.2-8.3).

Document checks through `validate.document`, compile checks through `compile.compile_document`, and
the numbers through `run` on the Llama fixture: a mean ablation's operand is compared with the mean
of the harvested values computed here, with and without --batch-size.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from causalab_ref.runs import compile as compiler
from causalab_ref.runs import run
from causalab_ref.documents import validate
from causalab_ref.shapes import Refusal

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
MEAN_ABLATION = json.loads((ROOT / "documents" / "mean_ablation.json").read_text())
PATCHING = json.loads((ROOT / "documents" / "patching.json").read_text())


def _ablation(**outputs) -> dict:
    raw = copy.deepcopy(MEAN_ABLATION)
    if outputs:
        raw["steps"]["harvest"]["outputs"] = outputs
        raw["steps"]["harvest"]["saves"] = []
    return raw


def _refusal(raw, stage="validation", call=validate.document) -> tuple[str, str]:
    with pytest.raises(Refusal) as caught:
        call(raw)
    assert caught.value.stage == stage
    return caught.value.path, caught.value.message


def _compile_refusal(raw, llama) -> tuple[str, str]:
    return _refusal(raw, "compile", lambda r: compiler.compile_document(r, llama, DATA))


# ---------------------------------------------------------------- declaring


def test_a_bare_string_output_is_the_read_unreduced():
    """SPEC.md:1386 [M10] `"outputs": {"acts": "x"}` means {"read": "x", "reduce": "none"}; k only with pca."""
    raw = _ablation(mean={"read": "acts", "reduce": "mean"}, kept="acts")
    step = dict(validate.document(raw).steps)["harvest"]
    assert [(n, o.read, o.reduce, o.k) for n, o in step.outputs] == [("mean", "acts", "mean", None),
                                                                     ("kept", "acts", "none", None)]


@pytest.mark.parametrize("output", [{"read": "acts", "reduce": "pca"}, {"read": "acts", "reduce": "mean", "k": 2},
                                    {"read": "acts", "reduce": "pca", "k": 0}])
def test_k_is_given_exactly_with_pca(output):
    """SPEC.md:1386 [M10] `k` is for pca and pca needs it (the reference's text)."""
    assert _refusal(_ablation(mean=output)) == ("steps.harvest.outputs.mean.k",
                                                 "`k` is for `reduce: pca`, and pca needs it")


def test_an_output_keeps_a_read_of_its_intervention():
    """SPEC.md:1393 [M12] an output naming a read the step's intervention does not have is refused."""
    assert _refusal(_ablation(mean={"read": "logits", "reduce": "mean"})) == (
        "steps.harvest.outputs.mean.read",
        "step 'harvest': output 'mean' keeps read 'logits', which its intervention does not have")


def test_two_steps_may_not_publish_one_name():
    """SPEC.md:1393 [M12] the second publisher of a name is refused naming the first."""
    raw = _ablation()
    raw["steps"]["clean"]["outputs"] = {"mean": "logits"}
    assert _refusal(raw) == ("steps.clean.outputs.mean",
                             "step 'clean': output 'mean' is already published by step 'harvest'")


def test_an_output_may_not_share_a_reads_name():
    """SPEC.md:1393 [M12] an output named like any read (here the other intervention's `logits`) is refused."""
    raw = _ablation(logits={"read": "acts", "reduce": "mean"})
    assert _refusal(raw) == ("steps.harvest.outputs.logits", "step 'harvest': output 'logits' shares its name with a "
                                                             "read; an operand names one or the other")


# ---------------------------------------------------------------- refs at validation


def test_a_ref_names_an_earlier_steps_output():
    """SPEC.md:1397 [M13] a ref to a name no earlier step publishes is refused listing what is published."""
    raw = _ablation()
    raw["steps"] = {"ablated": raw["steps"]["ablated"], "harvest": raw["steps"]["harvest"]}
    assert _refusal(raw) == ("interventions.ablation.writes.ablate.operand",
                             "step 'ablated': write 'ablate' references 'mean', which no earlier step outputs "
                             "(published so far: [])")


def test_a_bare_string_naming_an_output_is_told_to_write_a_ref():
    """SPEC.md:1397 [M13] an output named as a bare-string operand gets D11's text pointing at {"ref": …}."""
    raw = _ablation()
    raw["interventions"]["ablation"]["writes"]["ablate"]["operand"] = "mean"
    assert _refusal(raw) == ("interventions.ablation.writes.ablate.operand",
                             "interventions.ablation: write 'ablate': operand 'mean' is not a read of this "
                             "intervention; a value from an earlier step is {\"ref\": …}")


def test_outputs_of_a_step_running_several_interventions_are_not_visible_later():
    """SPEC.md:1397 [M13] a step that lists interventions publishes to itself only."""
    raw = _ablation()
    raw["steps"]["harvest"]["interventions"] = ["harvest", "clean"]
    path, message = _refusal(raw)
    assert path == "interventions.ablation.writes.ablate.operand"
    assert message.endswith("which no earlier step outputs (published so far: [])")


# ---------------------------------------------------------------- refs at compile


def _sliced_rows(raw, step: str, ref: str) -> dict:
    """A copy of the data root whose `weekdays/two` table holds the first two rows, for `step`."""
    raw["steps"][step]["rows"] = {role: ref for role in raw["steps"][step]["rows"]}
    return raw


@pytest.fixture(scope="module")
def two_rows(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    (root / "weekdays").mkdir()
    rows = json.loads((DATA / "weekdays" / "train.json").read_text())
    (root / "weekdays" / "train.json").write_text(json.dumps(rows))
    (root / "weekdays" / "two.json").write_text(json.dumps(rows[:2]))
    return root


def test_an_unreduced_ref_over_other_rows_is_refused(llama, two_rows):
    """SPEC.md:1402 [M14] an unreduced output of 4 rows swapped in over 2 rows is refused at compile."""
    raw = _ablation(mean="acts")
    raw = _sliced_rows(raw, "ablated", "weekdays/two")
    with pytest.raises(Refusal) as caught:
        compiler.compile_document(raw, llama, two_rows)
    assert (caught.value.stage, caught.value.path, caught.value.message) == (
        "compile", "interventions.ablation.writes.ablate.operand",
        "step 'ablated': write 'ablate' swaps in 'mean', which has 4 rows, over 2 rows; reduce the output or run "
        "over the same rows")


def test_a_mean_ref_over_other_rows_is_accepted(llama, two_rows):
    """SPEC.md:1402 [M14] a mean is one vector per position, so it fits any number of rows."""
    raw = _sliced_rows(_ablation(), "ablated", "weekdays/two")
    assert compiler.compile_document(raw, llama, two_rows).steps[2].example_ids == ("0", "1")


def test_a_pca_basis_as_an_operand_is_refused(llama):
    """SPEC.md:1402 [M14] a pca output is a featurizer's basis, not an operand."""
    raw = _ablation(mean={"read": "acts", "reduce": "pca", "k": 2})
    raw["interventions"]["harvest"]["reads"]["acts"]["pos"] = {"last": 3}
    raw["interventions"]["ablation"]["writes"]["ablate"]["pos"] = {"last": 3}
    assert _compile_refusal(raw, llama) == (
        "interventions.ablation.writes.ablate.operand",
        "step 'ablated': write 'ablate' names 'mean', a pca basis, as its operand; a basis is loaded as a featurizer, "
        "not written at a site")


def test_a_pca_over_too_few_vectors_is_refused_at_the_publishing_step(llama):
    """SPEC.md:1410 [M15] 4 rows x 1 position are 4 vectors, which centred hold 3 independent directions: k=4 is refused."""
    raw = _ablation(basis={"read": "acts", "reduce": "pca", "k": 4}, mean={"read": "acts", "reduce": "mean"})
    assert _compile_refusal(raw, llama) == (
        "steps.harvest.outputs.basis",
        "step 'harvest': output 'basis' asks for 4 principal directions of 4 vector(s); centered, they span at most 3. "
        "Harvest more rows, or more positions per row")


@pytest.mark.parametrize("write_pos, reduce, message", [
    ({"last": 2}, "none", "covers 2 position(s) but 'mean' was read over 1, unreduced"),
    ({"last": 2}, "mean", "covers 2 position(s) but 'mean' was read over 1"),
    ({"all": True}, "none", "covers a varying number of position(s) but 'mean' was read over 1, unreduced"),
])
def test_a_ref_whose_window_does_not_fit_is_refused(llama, write_pos, reduce, message):
    """SPEC.md:1402 [M14] a mean of a rectangle fits its own width (or a ragged write when it was one position);
    an unreduced rectangle only its own width."""
    raw = _ablation(mean={"read": "acts", "reduce": reduce})
    raw["interventions"]["ablation"]["writes"]["ablate"]["pos"] = write_pos
    path, got = _compile_refusal(raw, llama)
    assert path == "interventions.ablation.writes.ablate.operand"
    assert got == f"step 'ablated': write 'ablate' {message}; the windows must match, or reduce the output"


def test_a_mean_of_one_position_fits_a_ragged_write(llama):
    """SPEC.md:1402 [M14] a (1, width) mean lands at every position of a ragged write."""
    raw = _ablation()
    raw["interventions"]["ablation"]["writes"]["ablate"]["pos"] = {"all": True}
    assert compiler.compile_document(raw, llama, DATA)


def test_a_ref_of_another_width_is_refused(llama):
    """SPEC.md:1415 [M16] a 16-wide mean written into one 4-wide head is refused at compile, naming both."""
    raw = _ablation()
    raw["sites"]["one_head"] = {"component": "attention_premix", "layers": [0], "heads": [0]}
    raw["interventions"]["ablation"]["writes"]["ablate"]["site"] = "one_head"
    path, message = _compile_refusal(raw, llama)
    assert path == "interventions.ablation.writes.ablate.operand"
    assert message.startswith("step 'ablated': write 'ablate' lands 4 features per position, and 'mean' holds 16")


# ---------------------------------------------------------------- saves and interventions written in place


def test_a_tensor_saved_to_a_json_path_is_refused():
    """SPEC.md:1432 [M21] an output is a tensor: its save needs a .safetensors path (the reference's text)."""
    raw = _ablation()
    raw["steps"]["harvest"]["saves"][0]["file_path"] = "mean.json"
    assert _refusal(raw) == ("steps.harvest.saves.0.file_path",
                             "save 'mean': a tensor, not a table; give it a .safetensors path, not 'mean.json'")


def test_a_metric_saved_to_a_safetensors_path_is_refused():
    """SPEC.md:1432 [M21] a metric is a per-row table: its save needs a .json path (the reference's text)."""
    raw = _ablation()
    raw["steps"]["clean"]["saves"][0]["file_path"] = "clean.safetensors"
    assert _refusal(raw) == ("steps.clean.saves.0.file_path",
                             "save 'logit_diff': a per-row metric table; give it a .json path, not "
                             "'clean.safetensors' (a .safetensors file would drop the example ids, eligibility and "
                             "units)")


def test_generated_ids_are_produced_only_by_a_decoding_intervention():
    """SPEC.md:1425 [M19] `<model>.generated` is something a step produces when its intervention decodes."""
    raw = copy.deepcopy(PATCHING)
    raw["steps"]["score"]["saves"].append({"value": "patched.generated", "file_path": "generated.safetensors"})
    path, message = _refusal(raw)
    assert path == "steps.score.saves.2.value"
    assert message == ("step 'score': saves 'patched.generated', which it does not produce (it produces "
                       "['iia', 'logit_diff'])")
    raw["interventions"]["patching"]["decode"] = 2
    assert validate.document(raw)


def test_an_intervention_written_in_place_is_hoisted_under_the_steps_name():
    """SPEC.md:1436 [M22] an object in a step's `interventions` is validated and named after the step; in a list,
    `<step>[<k>]` beside the named ones."""
    raw = copy.deepcopy(PATCHING)
    body = raw["interventions"].pop("patching")
    raw["steps"]["score"]["interventions"] = body
    doc = validate.document(raw)
    assert [n for n, _ in doc.interventions] == ["score"] and doc.steps[0][1].interventions == ("score",)
    raw = copy.deepcopy(PATCHING)
    raw["steps"]["score"]["interventions"] = ["patching", copy.deepcopy(body)]
    raw["steps"]["score"]["saves"] = [{"value": "score[1]/iia", "file_path": "iia.json"}]
    assert validate.document(raw).steps[0][1].interventions == ("patching", "score[1]")


def test_an_intervention_written_in_place_may_not_take_a_declared_name():
    """SPEC.md:1436 [M22] hoisting under a name `interventions` already declares is refused."""
    raw = copy.deepcopy(PATCHING)
    raw["steps"]["patching"] = dict(raw["steps"].pop("score"), interventions=raw["interventions"]["patching"])
    path, message = _refusal(raw)
    assert path == "steps.patching.interventions"
    assert message.startswith("step 'patching' writes an intervention in place, which is named 'patching'")


# ---------------------------------------------------------------- published values at run


def _execute(raw, engine, out, batch_size=None):
    return run.execute(compiler.compile_document(raw, engine, DATA), engine, out, batch_size=batch_size)


def _tensor(path: Path) -> tuple[dict, dict]:
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}, dict(handle.metadata() or {})


@pytest.fixture(scope="module")
def ablated(llama, tmp_path_factory):
    """mean_ablation.json run whole and in chunks of one row, with the harvested values kept unreduced too."""
    raw = copy.deepcopy(MEAN_ABLATION)
    raw["steps"]["harvest"]["outputs"]["acts_kept"] = "acts"
    raw["steps"]["harvest"]["saves"].append({"value": "acts_kept", "file_path": "acts.safetensors"})
    raw["interventions"]["ablation"]["reads"]["landed"] = {"site": "target", "pos": -1, "model": "ablated",
                                                           "input": "base"}
    raw["steps"]["ablated"]["outputs"] = {"landed_kept": "landed"}
    raw["steps"]["ablated"]["saves"].append({"value": "landed_kept", "file_path": "landed.safetensors"})
    root = tmp_path_factory.mktemp("ablation")
    _execute(raw, llama, root / "whole")
    _execute(raw, llama, root / "chunked", batch_size=1)
    return root


def test_a_mean_ablations_operand_is_the_hand_mean_of_the_harvest(ablated):
    """SPEC.md:1389 [M11] the mean output is the mean over rows of the gathered values, (1, 16) for a
    (4, 1, 16) read, and it is what the ablating write lands on every row."""
    acts, _ = _tensor(ablated / "whole" / "acts.safetensors")
    mean, _ = _tensor(ablated / "whole" / "mean.safetensors")
    landed, _ = _tensor(ablated / "whole" / "landed.safetensors")
    hand = sum(acts["weight"][r] for r in range(4)) / 4
    assert acts["weight"].shape == (4, 1, 16) and mean["weight"].shape == (1, 16)
    torch.testing.assert_close(mean["weight"], hand, atol=1e-6, rtol=0)
    for r in range(4):
        torch.testing.assert_close(landed["weight"][r], hand, atol=1e-6, rtol=0)


def test_a_mean_ablation_does_not_depend_on_the_batch_size(ablated):
    """SPEC.md:1419 [M17] with --batch-size 1 the mean, what the write lands and the scores are the unbatched
    run's: a reduced output is whole in every chunk."""
    for name in ("mean", "landed"):
        whole, _ = _tensor(ablated / "whole" / f"{name}.safetensors")
        chunked, _ = _tensor(ablated / "chunked" / f"{name}.safetensors")
        torch.testing.assert_close(chunked["weight"], whole["weight"], atol=1e-6, rtol=0)
    whole = [r["value"] for r in json.loads((ablated / "whole" / "ablated.json").read_text())]
    chunked = [r["value"] for r in json.loads((ablated / "chunked" / "ablated.json").read_text())]
    assert chunked == pytest.approx(whole, abs=1e-5)


def test_an_unreduced_ref_is_narrowed_to_each_chunk_under_batch_size(llama, tmp_path):
    """SPEC.md:1419 [M17] an unreduced output swapped in over the same rows lands row r's value on row r, with
    and without --batch-size (each chunk takes its own rows)."""
    raw = copy.deepcopy(MEAN_ABLATION)
    raw["steps"]["harvest"]["outputs"] = {"mean": "acts"}
    raw["steps"]["harvest"]["saves"] = [{"value": "mean", "file_path": "acts.safetensors"}]
    raw["interventions"]["ablation"]["reads"]["landed"] = {"site": "target", "pos": -1, "model": "ablated",
                                                           "input": "base"}
    raw["steps"]["ablated"]["outputs"] = {"landed_kept": "landed"}
    raw["steps"]["ablated"]["saves"] = [{"value": "landed_kept", "file_path": "landed.safetensors"}]
    _execute(raw, llama, tmp_path / "w", batch_size=3)
    acts, _ = _tensor(tmp_path / "w" / "acts.safetensors")
    landed, _ = _tensor(tmp_path / "w" / "landed.safetensors")
    torch.testing.assert_close(landed["weight"], acts["weight"], atol=1e-6, rtol=0)


def test_an_output_save_is_one_weight_tensor_with_the_stamp(ablated):
    """SPEC.md:1428 [M20] a saved output is a .safetensors file of one tensor `weight`, its metadata the bundle
    stamp with kind output/mean, d the read's width, no parametrization, and a mean's missing k as JSON's null
    (SPEC.md:1560 [FZ36])."""
    tensors, metadata = _tensor(ablated / "whole" / "mean.safetensors")
    assert list(tensors) == ["weight"] and tensors["weight"].dtype == torch.float32
    assert {k: metadata[k] for k in ("kind", "k", "d", "parametrization", "component", "layer", "site")} == {
        "kind": "output/mean", "k": "null", "d": "16", "parametrization": "", "component": "block_output",
        "layer": "0", "site": "target"}


def test_a_ref_orders_no_forward(llama):
    """SPEC.md:1422 [M18] a step whose write takes {"ref": …} runs only its own forwards: the value is there
    before the pass starts."""
    plan = compiler.compile_document(copy.deepcopy(MEAN_ABLATION), llama, DATA)
    ablated = plan.steps[2]
    assert [(f.model, f.input) for f in ablated.forwards] == [("ablated", "base")]
    assert "swap(mean)" in plan.text() and "outputs=['mean=mean(acts)']" in plan.text()
