"""Featurizers, fit and weights steps run on the Llama fixture (SPEC.md §9)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from causalab_ref.runs import compile as compiler
from causalab_ref.engines import loading
from causalab_ref.featurizers import kinds
from causalab_ref.runs import run
from causalab_ref.shapes import Model

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"


def das(epochs=3) -> dict:
    raw = json.loads((ROOT / "documents" / "das.json").read_text())
    raw["steps"]["fit"]["epochs"] = epochs
    return raw


def execute(raw, llama, out: Path) -> Path:
    run.execute(compiler.compile_document(raw, llama, DATA), llama, out, progress=False)
    return out


def table(path: Path) -> list:
    return [row["value"] for row in json.loads(path.read_text())]


def tensor(path: Path):
    with safe_open(str(path), "pt") as handle:
        return handle.get_tensor("weight"), handle.metadata()


@pytest.fixture(scope="module")
def fitted(llama, tmp_path_factory):
    return execute(das(), llama, tmp_path_factory.mktemp("das") / "out")


def test_das_fit_lowers_its_loss_and_trains_the_rotation(fitted):
    """SPEC.md:1544 [FZ28] the DAS fit on the Llama fixture lowers its training loss from the first epoch to the last;
    the saved bundle holds the Cayley parameter (16, 8), moved from the seed-0 draw, with the stamp."""
    loss, meta = tensor(fitted / "train_loss.safetensors")
    assert loss.shape == (3,) and loss.dtype == torch.float32 and meta is None
    assert loss[2] < loss[1] < loss[0]  # one update per epoch over the same eight pairs
    weight, stamp = tensor(fitted / "rot.safetensors")
    assert weight.shape == (16, 8) and not torch.equal(weight, kinds.initial_draw(16, 8, 0))
    q = kinds.cayley(weight)
    assert torch.allclose(q.T @ q, torch.eye(8), atol=1e-5)
    assert {k: stamp[k] for k in ("kind", "k", "d", "site", "component", "layer", "parametrization", "model_dtype")} \
        == {"kind": "subspace", "k": "8", "d": "16", "site": "target", "component": "block_output", "layer": "0",
            "parametrization": "cayley", "model_dtype": "fp32"}
    assert stamp["produced_by"] == json.loads((fitted / "held_out_logit_diff.json").read_text())[0]["produced_by"]


def test_a_reloaded_bundle_reproduces_the_last_eval_exactly(fitted, llama, tmp_path):
    """SPEC.md:1550 [FZ29] SPEC.md:1541 [FZ27] the saved bundle, loaded by `file_path` into a run over the
    eval rows, reproduces the fit's final eval metric bit for bit."""
    raw = das()
    raw["featurizers"]["rot"] = {"kind": "subspace", "k": 8, "file_path": str(fitted / "rot.safetensors")}
    raw["steps"] = {"apply": {"kind": "observe", "interventions": "das",
                              "rows": raw["steps"]["fit"]["eval"]["rows"],
                              "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"}]}}
    out = execute(raw, llama, tmp_path / "apply")
    assert table(out / "logit_diff.json") == table(fitted / "held_out_logit_diff.json")


def test_two_fits_with_one_seed_write_byte_identical_bundles(fitted, llama, tmp_path):
    """SPEC.md:1552 [FZ30] a fit is deterministic on CPU: the same document writes byte-identical bundle and curve
    files; another seed fits another rotation."""
    again = execute(das(), llama, tmp_path / "again")
    for name in ("rot.safetensors", "train_loss.safetensors"):
        assert (again / name).read_bytes() == (fitted / name).read_bytes()
    other = das(epochs=1)
    other["steps"]["fit"]["seed"] = 1
    out = execute(other, llama, tmp_path / "other")
    assert not torch.equal(tensor(out / "rot.safetensors")[0], tensor(fitted / "rot.safetensors")[0])


def test_a_fit_on_the_hooks_engine_trains_what_the_nnterp_engine_trains(fitted, tmp_path):
    """SPEC.md:1586 [FZ35] the DAS fit run on the hooks engine trains the nnterp engine's rotation and writes its
    train/loss curve and held-out table (allclose 1e-6): a fit reaches the model only through the contract."""
    hooks = loading.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"), "hooks")
    out = execute(das(), hooks, tmp_path / "hooks")
    assert json.loads((out / "run.json").read_text())["engine"] == "HooksEngine"
    for name in ("rot.safetensors", "train_loss.safetensors"):
        got, want = tensor(out / name)[0], tensor(fitted / name)[0]
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-6, rtol=0), name
    assert not torch.allclose(tensor(out / "rot.safetensors")[0], kinds.initial_draw(16, 8, 0), atol=1e-3)
    assert table(out / "held_out_logit_diff.json") == pytest.approx(table(fitted / "held_out_logit_diff.json"), abs=1e-6)


def _patching(llama, tmp_path, name, change):
    raw = json.loads((ROOT / "documents" / "patching.json").read_text())
    change(raw)
    return table(execute(raw, llama, tmp_path / name) / "logit_diff.json")


def test_a_full_rank_subspace_swap_is_a_plain_swap(llama, tmp_path):
    """SPEC.md:1458 [FZ4] through the engine, a subspace swap with k = d (an untrained seeded rotation) gives the
    plain swap's numbers (to float32 rounding)."""
    def full(raw):
        raw["featurizers"] = {"rot": {"kind": "subspace", "k": 16, "seed": 3}}
        raw["interventions"]["patching"]["reads"]["v_cf"]["featurizer"] = "rot"
        raw["interventions"]["patching"]["writes"]["patch"]["featurizer"] = "rot"
    plain = _patching(llama, tmp_path, "plain", lambda raw: None)
    assert _patching(llama, tmp_path, "full", full) == pytest.approx(plain, abs=1e-5)


def test_an_unfitted_gate_writes_nothing_in_a_run(llama, tmp_path):
    """SPEC.md:1471 [FZ8] through the engine, a swap via an unfitted gate (θ = 0, hard mask zero) leaves the base
    run's numbers; a features subset of identity touches only those units."""
    def gate(raw):
        raw["featurizers"] = {"mask": {"kind": "gate"}}
        raw["interventions"]["patching"]["writes"]["patch"]["featurizer"] = "mask"

    def unwritten(raw):
        raw["interventions"]["patching"]["models"]["patched"]["writes"] = []
    base = _patching(llama, tmp_path, "base", unwritten)
    assert _patching(llama, tmp_path, "gate", gate) == base

    def all_units(raw):
        raw["interventions"]["patching"]["writes"]["patch"]["features"] = list(range(16))
    assert _patching(llama, tmp_path, "all", all_units) == _patching(llama, tmp_path, "plain", lambda raw: None)


def test_the_shipped_sae_is_its_deterministic_build():
    """SPEC.md:1554 [FZ31] documents/artifacts/sae.safetensors is exactly what bundles.example_sae builds (seeded,
    canonical bytes): shipped, never hand-edited."""
    from causalab_ref.featurizers import bundles
    assert (ROOT / bundles.EXAMPLE_SAE).read_bytes() == bundles.example_sae()


def test_an_sae_write_of_its_own_latents_changes_nothing(llama, tmp_path):
    """SPEC.md:1464 [FZ6] through the engine, swapping the SAE's latents with themselves returns decode(f) + err = x:
    the numbers are the unwritten model's; zeroing an active latent moves them, an inactive one does not."""
    raw = json.loads((ROOT / "documents" / "sae_ablation.json").read_text())
    raw["interventions"]["ablation"]["writes"]["zero"]["features"] = [0]
    raw["steps"]["ablate"]["saves"] = raw["steps"]["ablate"]["saves"][:1]
    zeroed = table(execute(raw, llama, tmp_path / "zero") / "zeroed.json")
    raw["interventions"]["ablation"]["writes"]["zero"]["operand"] = "latents"
    same = table(execute(raw, llama, tmp_path / "same") / "zeroed.json")
    raw["interventions"]["ablation"]["models"]["zeroed"]["writes"] = []
    base = table(execute(raw, llama, tmp_path / "base") / "zeroed.json")
    assert same == pytest.approx(base, abs=1e-6)
    assert zeroed != pytest.approx(base, abs=1e-4)  # latent 0 is active on every row; latent 1 on none:
    raw["interventions"]["ablation"]["models"]["zeroed"]["writes"] = ["zero"]
    raw["interventions"]["ablation"]["writes"]["zero"].update(operand=0.0, features=[1])
    assert table(execute(raw, llama, tmp_path / "one") / "zeroed.json") == pytest.approx(base, abs=1e-6)
