"""Featurizers, fit and weights steps in documents: validation and compile refusals, explain (SPEC.md §9)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from safetensors import safe_open

from causalab_ref.featurizers import bundles
from causalab_ref.engines import loading
from causalab_ref.documents import reader, validate
from causalab_ref.runs import run
from causalab_ref.runs import compile as compiler
from causalab_ref.shapes import Model, Refusal

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
IV = "interventions.das"


def das() -> dict:
    return json.loads((ROOT / "documents" / "das.json").read_text())


def refused(raw, call=validate.document) -> Refusal:
    with pytest.raises(Refusal) as e:
        call(raw)
    return e.value


@pytest.fixture(scope="module")
def meta():
    return loading.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"), weights=False)


def compiled(raw, eng):
    return compiler.compile_document(raw, eng, DATA)


@pytest.mark.parametrize("change, path, message", [
    ({"kind": "gate", "k": 4}, "featurizers.rot.k", "a gate masks every unit of its site and takes no k"),
    ({"kind": "pca"}, "featurizers.rot", "a pca needs k, the rank of its basis"),
    ({"kind": "sae"}, "featurizers.rot", "a sae featurizer is loaded from a file; nothing draws or trains one"),
    ({"kind": "gate", "seed": 1}, "featurizers.rot.seed", "a gate starts at θ = 0, not from a draw; it has no seed"),
    ({"kind": "subspace", "k": 4, "seed": 1, "file_path": "x.safetensors"}, "featurizers.rot.seed",
     "a loaded featurizer has no seed: its weights are its bytes"),
])
def test_featurizer_declarations_are_refused_in_the_reference_order(change, path, message):
    """SPEC.md:1505 [FZ18] the validator's featurizer refusals, in order: a gate's k, a basis without k, a loaded kind
    without file_path, a gate's seed, a loaded featurizer's seed."""
    raw = das()
    raw["featurizers"]["rot"] = change
    raw["steps"]["fit"]["params"] = [] if change["kind"] != "subspace" else ["rot"]
    r = refused(raw)
    assert (r.path, r.message) == (path, message)


def test_one_featurizer_name_is_one_site():
    """SPEC.md:1510 [FZ19] the featurizer's site is the one site of every read and write naming it; two sites, or
    none (declared but unused), are refused with the reference's text."""
    raw = das()
    raw["interventions"]["das"]["reads"]["h"] = {"site": "head", "pos": -1, "input": "base", "featurizer": "rot"}
    r = refused(raw)
    assert (r.path, r.message) == ("featurizers.rot", "featurizer 'rot' is used at ['head', 'target']; one name is "
                                                      "one site")
    raw = das()
    raw["featurizers"]["spare"] = {"kind": "gate"}
    assert refused(raw).message == "featurizer 'spare' is used at []; one name is one site"


def test_undeclared_featurizer_and_logits_view_and_metric_of_features_are_refused():
    """SPEC.md:1510 [FZ19] a read or write names 'identity' or a declared featurizer; a logits view and a metric's
    read are via 'identity'."""
    raw = das()
    raw["interventions"]["das"]["writes"]["patch"]["featurizer"] = "rott"
    r = refused(raw)
    assert r.path == f"{IV}.writes.patch.featurizer"
    assert r.message == f"{IV}: write 'patch': undeclared featurizer 'rott'; declared: ['rot']"
    raw = das()
    raw["interventions"]["das"]["reads"]["logits"]["featurizer"] = "rot"
    r = refused(raw)
    assert r.path == f"{IV}.metrics.logit_diff.of"
    assert r.message == (f"{IV}: metric 'logit_diff' reads 'logits' via featurizer 'rot', whose features are not the "
                         "vocabulary's logits; a metric's read is via 'identity'")


def test_fit_refusals_name_what_to_write_instead():
    """SPEC.md:1516 [FZ20] a fit trains declared, trainable featurizers, anneals only gates it trains, watches and
    minimizes metrics of its intervention or `<gate>.mask`, and saves only train/loss and train/eval."""
    cases = [
        (("params",), ["nope"], "steps.fit.params", "step 'fit': trains ['nope'], which is not a declared featurizer"),
        (("early_stop", "metric"), "acc", "steps.fit.early_stop.metric",
         "step 'fit': early_stop watches 'acc', not a metric"),
        (("objective",), [[1.0, "loss"]], "steps.fit.objective.0",
         "step 'fit': objective names 'loss', which is neither a metric nor the mask of a gate this fit trains "
         "(one of ['ce', 'logit_diff'])"),
        (("anneal",), {"rot": {"start": 1.0, "end": 0.1}}, "steps.fit.anneal",
         "step 'fit': anneals ['rot']; only a gate this fit trains has a temperature (those are [])"),
        (("saves",), [{"value": "rot", "file_path": "r.safetensors"}], "steps.fit.saves.0.value",
         "step 'fit': saves 'rot', which it does not produce (it produces ['train/eval', 'train/loss'])"),
        (("saves",), [{"value": "train/loss", "file_path": "loss.json"}], "steps.fit.saves.0.file_path",
         "save 'train/loss': a tensor, not a table; give it a .safetensors path, not 'loss.json'"),
        (("eval", "saves"), [{"value": "x", "file_path": "x.json"}], "steps.fit.eval.saves.0.value",
         "step 'fit'.eval: saves 'x', which that pass does not produce"),
    ]
    for keys, value, path, message in cases:
        raw = das()
        target = raw["steps"]["fit"]
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
        r = refused(raw)
        assert (r.path, r.message) == (path, message)
    raw = das()
    del raw["steps"]["fit"]["eval"]["rows"]["counterfactual"]
    assert refused(raw).message == "step 'fit'.eval: no rows for role 'counterfactual'"


def test_fixed_kinds_are_not_trained_and_loaded_dictionaries_not_published():
    """SPEC.md:1516 [FZ20] pca, sae and linear are fixed by definition; a weights step publishes no loaded sae/linear."""
    raw = das()
    raw["featurizers"]["rot"] = {"kind": "pca", "k": 4, "file_path": "b.safetensors"}
    assert refused(raw).message == ("step 'fit': trains 'rot', a pca, which is fixed by definition — a pca basis can "
                                    "be fine-tuned as a subspace loaded from it")
    raw["featurizers"]["rot"] = {"kind": "sae", "file_path": "b.safetensors"}
    del raw["steps"]["fit"]
    assert refused(raw).message == ("step 'weights': 'rot' is a loaded sae; its tensors are the file it came from, "
                                    "and there is no fitted weight to publish")
    raw["steps"]["weights"]["names"] = ["nope"]
    assert refused(raw).message == "step 'weights': names ['nope'], which is not a declared featurizer"


def test_a_featurizer_used_before_its_fit_is_refused():
    """SPEC.md:1521 [FZ21] no step uses a featurizer before the fit that trains it: the reference's sentence."""
    raw = das()
    steps = raw["steps"]
    raw["steps"] = {"score": steps["score"], "fit": steps["fit"], "weights": steps["weights"]}
    r = refused(raw)
    assert r.path == "steps.score"
    assert r.message == ("step 'score' uses featurizer 'rot' before step 'fit' trains it, so it would run on the "
                         "untrained parameter. Move it after the fit — or, for a deliberate untrained baseline, "
                         "declare a second featurizer that no fit names")


def test_k_past_the_site_width_is_refused_at_compile(meta):
    """SPEC.md:1524 [FZ22] `k` of a subspace or pca is at most the site's width d (after heads/units)."""
    raw = das()
    raw["featurizers"]["rot"]["k"] = 999
    r = refused(raw, lambda d: compiled(d, meta))
    assert (r.stage, r.path, r.message) == ("compile", "featurizers.rot.k",
                                            "featurizer 'rot': k=999 is not a subspace of the 16-wide site 'target'")


def test_units_narrow_a_featurizers_width(meta):
    """SPEC.md:1524 [FZ22] d is the site's width after heads/units: a gate at 4 units of block_output is 4 wide."""
    raw = das()
    raw["sites"]["target"]["units"] = [0, 1, 2, 3]
    raw["featurizers"]["rot"] = {"kind": "gate"}
    plan = compiled(raw, meta)
    assert "rot: gate d=4 θ=0 trained=True" in plan.text()


def test_a_place_with_no_width_refuses_a_featurizer():
    """SPEC.md:1527 [FZ23] a featurizer at a place with no width (the pattern's key axis, an `extra` name) is refused
    at compile with the seed's sentence (L23)."""
    eager = loading.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32",
                              attn_implementation="eager"), weights=False)
    raw = das()
    raw["model"]["attn_implementation"] = "eager"
    raw["sites"]["target"] = {"component": "attention_scores", "layers": [0]}
    raw["featurizers"]["rot"] = {"kind": "gate"}
    r = refused(raw, lambda d: compiled(d, eager))
    assert (r.stage, r.path) == ("compile", "featurizers.rot")
    assert r.message == ("the width of 'attention_scores' is not a fact about the model: it depends on the batch "
                         "(the attention pattern's key axis) or is not a tensor's")


def test_features_out_of_range_are_refused_at_compile(meta):
    """SPEC.md:1529 [FZ24] `features` are distinct indices below the feature space's width (the featurizer's k, or the
    site's width for identity), refused at compile with the reference's text."""
    raw = das()
    raw["interventions"]["das"]["writes"]["patch"]["features"] = [8]
    r = refused(raw, lambda d: compiled(d, meta))
    assert (r.stage, r.path) == ("compile", f"{IV}.writes.patch.features")
    assert r.message == (f"{IV}: write 'patch': features [8] of a 8-dimensional feature space; they are distinct "
                         "indices below 8")
    raw["interventions"]["das"]["writes"]["patch"]["features"] = [1, 1]
    assert "features [1, 1] of a 8-dimensional" in refused(raw, lambda d: compiled(d, meta)).message


def test_explain_shows_featurizers_fit_and_weights(meta):
    """SPEC.md:1533 [FZ25] explain prints the plan's featurizers first (`rot: subspace k=8 d=16 cayley seed=0
    trained=True`, the seed taken from the fit), the fit with its first update and its eval pass, reads and
    writes via their featurizer, and the weights step."""
    text = compiled(das(), meta).text().splitlines()
    assert text[1:3] == ["  featurizers: Featurizers", "      rot: subspace k=8 d=16 cayley seed=0 trained=True"]
    assert text[3] == ("  fit: Fit  6 epochs x 1 update  lr=0.05 objective=((1.0, 'ce'),) params=('rot',)  "
                       "early_stop='logit_diff' patience=3")
    assert text[4].startswith("      epochs[0][0]: Observe") and any(t.startswith("      evaluation: Observe")
                                                                      for t in text)
    assert "            write 'patch' at block_output[0] pos={index:-1} swap(v_cf) via 'rot'" in text
    assert text[-1] == "  weights: Weights  names=['rot']  saves=['rot.safetensors']"


def test_eval_rows_must_not_share_rows_with_the_fit(meta):
    """SPEC.md:1538 [FZ26] fit and eval rows from different refs share no base row; the same ref is allowed."""
    raw = das()
    raw["steps"]["fit"]["eval"]["rows"] = {"base": "weekdays/pairs", "counterfactual": "weekdays/pairs"}
    r = refused(raw, lambda d: compiled(d, meta))
    assert (r.stage, r.message) == ("compile", "the eval rows share 8 row(s) with the fitted rows; the two must be "
                                               "endpoint-disjoint")
    raw["steps"]["fit"]["eval"]["rows"] = copy.deepcopy(raw["steps"]["fit"]["rows"])
    compiled(raw, meta)


def test_a_bundle_of_another_layer_is_refused_at_compile(meta, tmp_path):
    """SPEC.md:1541 [FZ27] a loaded bundle's stamp is checked against the document key by key at compile."""
    raw = das()
    del raw["steps"]["fit"]
    file = tmp_path / "rot.safetensors"
    bundles.write(file, {"weight": torch.zeros(16, 8)}, {"layer": "1", "kind": "subspace", "k": "8"})
    raw["featurizers"]["rot"] = {"kind": "subspace", "k": 8, "file_path": str(file)}
    r = refused(raw, lambda d: compiled(d, meta))
    assert (r.stage, r.path) == ("compile", "featurizers.rot.file_path")
    assert r.message == f"featurizer 'rot': '{file}' is not this featurizer — layer: bundle says '1', document says '0'"


def test_a_tensor_file_compares_as_tensors_and_metadata(tmp_path):
    """SPEC.md:1565 [FZ32] the conformance runner reads a .safetensors file as dtype, shape and values per tensor plus
    the metadata without `engine`, so another implementation's bundle compares with this one's."""
    from causalab_ref.conformance import conform
    file = tmp_path / "rot.safetensors"
    bundles.write(file, {"weight": torch.tensor([[1.0, 2.0]])}, {"engine": "other", "k": "2"})
    assert conform.tensor_file(file) == {"metadata": {"k": "2"}, "tensors": {
        "weight": {"dtype": "float32", "shape": [1, 2], "values": [[1.0, 2.0]]}}}
    case = json.loads((ROOT / "causalab_ref" / "conformance" / "corpus" / "run_tiny_das_fit.json").read_text())
    curve = case["expect"]["tables"]["train_loss.safetensors"]["tensors"]["weight"]
    assert curve["shape"] == [3] and curve["values"][2] < curve["values"][0]


# ---------------------------------------------------------------- pca_harvest.json -> pca_control.json (FZ33, FZ34)

PCA_FILE = "documents/artifacts/pca.safetensors"


def shipped(name: str) -> dict:
    return json.loads((ROOT / "documents" / f"{name}.json").read_text())


def execute(raw, eng, out: Path) -> Path:
    run.execute(compiler.compile_document(raw, eng, DATA), eng, out, progress=False)
    return out


def tensor(path: Path):
    with safe_open(str(path), "pt") as handle:
        return handle.get_tensor("weight"), handle.metadata()


@pytest.fixture(scope="module")
def harvest(llama, tmp_path_factory):
    """pca_harvest.json run as shipped, plus its read saved unreduced for a hand computation."""
    raw = shipped("pca_harvest")
    raw["steps"]["harvest"]["outputs"]["vectors"] = "acts"
    raw["steps"]["harvest"]["saves"].append({"value": "vectors", "file_path": "vectors.safetensors"})
    return execute(raw, llama, tmp_path_factory.mktemp("pca") / "harvest")


def test_pca_harvest_publishes_the_top_principal_directions(harvest):
    """SPEC.md:1578 [FZ34] pca_harvest.json's basis is the top 4 right singular vectors of the centred vectors
    of block_output[0] at every content token of weekdays/train, (16, 4), stamped as a pca of that site."""
    basis, stamp = tensor(harvest / "pca.safetensors")
    vectors = tensor(harvest / "vectors.safetensors")[0]
    assert vectors.shape[1] == 16 and vectors.shape[0] > 4 * 4  # ragged: every content token of four prompts
    centred = vectors - vectors.mean(dim=0)
    hand = torch.linalg.svd(centred, full_matrices=False)[2][:4].T
    assert basis.shape == (16, 4)
    assert torch.allclose((hand.T @ basis).abs(), torch.eye(4), atol=1e-5)  # the same columns, up to sign
    assert {k: stamp[k] for k in ("kind", "k", "d", "component", "layer", "heads", "units")} == {
        "kind": "pca", "k": "4", "d": "16", "component": "block_output", "layer": "0", "heads": "null",
        "units": "null"}


def test_the_shipped_pca_basis_is_what_pca_harvest_writes(harvest):
    """SPEC.md:1578 [FZ34] documents/artifacts/pca.safetensors is pca_harvest.json's save: the same tensor and the
    same stamp (shipped, never hand-edited)."""
    got, stamp = tensor(harvest / "pca.safetensors")
    ship, ship_stamp = tensor(ROOT / PCA_FILE)
    assert ship_stamp.pop("produced_by") == reader.digest(shipped("pca_harvest"))  # the harvest ran here with a
    stamp.pop("produced_by")  # second output, so its digest is another
    assert stamp == ship_stamp
    # an SVD's float32 rounding depends on the CPU's kernels: 1.2e-6 measured on an AMD EPYC machine against the
    # basis shipped from another; the basis's entries are up to 0.66, so 1e-5 still tells another basis apart
    assert torch.allclose(got, ship, atol=1e-5, rtol=0)


def test_pca_control_swaps_in_the_harvested_basis(harvest, llama, tmp_path):
    """SPEC.md:1572 [FZ33] SPEC.md:1578 [FZ34] pca_control.json loads the harvested basis Q as its pca featurizer:
    the base activation x at block_output[0] becomes x + ((y - x)·Q)·Qᵀ with y the counterfactual's (the base keeps
    its 12-dimensional complement), and its weights step publishes Q unchanged."""
    raw = shipped("pca_control")
    das_iv = raw["interventions"]["das"]
    for name, model, role in (("x", "original", "base"), ("y", "original", "counterfactual"),
                              ("after", "patched", "base")):
        das_iv["reads"][name] = {"site": "target", "pos": -1, "model": model, "input": role}
    score = raw["steps"]["score"]
    score["outputs"] = {f"{n}_out": n for n in ("x", "y", "after")}
    score["saves"] += [{"value": f"{n}_out", "file_path": f"{n}.safetensors"} for n in ("x", "y", "after")]
    out = execute(raw, llama, tmp_path / "control")
    q = tensor(harvest / "pca.safetensors")[0]
    x, y, after = (tensor(out / f"{n}.safetensors")[0] for n in ("x", "y", "after"))
    assert torch.allclose(after, x + ((y - x) @ q) @ q.T, atol=1e-5)
    assert not torch.allclose(after, y, atol=1e-3)  # not a plain swap: k = 4 of 16
    assert torch.equal(tensor(out / "basis.safetensors")[0], tensor(ROOT / PCA_FILE)[0])
    assert [r["value"] for r in json.loads((out / "logit_diff.json").read_text())] != [None] * 4


@pytest.mark.parametrize("change, wrong", [
    (lambda f, s: f.update(k=3), "k: bundle says '4', document says '3'"),
    (lambda f, s: s.update(layers=[1]), "layer: bundle says '0', document says '1'"),
    (lambda f, s: f.update(kind="subspace"),
     "kind: bundle says 'pca', document says 'subspace'; parametrization: bundle says '', document says 'cayley'"),
])
def test_a_pca_basis_loads_only_as_the_pca_of_its_place(meta, change, wrong):
    """SPEC.md:1572 [FZ33] the harvested basis's stamp is checked key by key: another k, another layer, or another
    kind (a pca basis is not a Cayley parameter) is refused at compile."""
    raw = shipped("pca_control")
    del raw["steps"]["weights"]
    change(raw["featurizers"]["basis"], raw["sites"]["target"])
    r = refused(raw, lambda d: compiled(d, meta))
    assert (r.stage, r.path) == ("compile", "featurizers.basis.file_path")
    assert r.message == f"featurizer 'basis': '{PCA_FILE}' is not this featurizer — {wrong}"
