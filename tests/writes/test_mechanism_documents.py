"""The shipped documents of the mechanisms and step outputs run as the README says (SPEC.md §8).

Each runs through compile and run.execute, what `python -m causalab_ref run DOC --out DIR` calls, on the
session's Llama engine (the knockout on an eager one)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from causalab_ref.runs import compile as compiler
from causalab_ref.engines import loading
from causalab_ref.runs import run
from causalab_ref.documents import sweeps, validate

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"


def _run(name: str, out: Path, eng, batch_size=None) -> Path:
    """What `python -m causalab_ref run documents/<name>.json --out <out>` does, on a loaded engine."""
    raw = json.loads((ROOT / "documents" / f"{name}.json").read_text())
    run.execute(compiler.compile_document(raw, eng, DATA), eng, out, batch_size=batch_size, progress=False)
    return out


def _weight(path: Path) -> torch.Tensor:
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as handle:
        assert list(handle.keys()) == ["weight"]
        return handle.get_tensor("weight")


def _values(path: Path) -> list:
    return [row["value"] for row in json.loads(path.read_text())]


def test_steering_saves_the_steered_continuation(llama, tmp_path):
    """SPEC.md:1425 [M19] steering.json decodes 3 tokens with add_scaled + renormalize at every step and saves
    `steered.generated`: int64 ids (rows, decode), the prompt stripped."""
    out = _run("steering", tmp_path / "steering", llama)
    ids = _weight(out / "generated.safetensors")
    assert ids.dtype == torch.int64 and tuple(ids.shape) == (4, 3)
    assert len(_values(out / "p_answer.json")) == 4


def test_causal_tracing_noise_moves_the_answer_and_only_an_earlier_layer_restores_it(llama, tmp_path):
    """SPEC.md:1358 [M3] causal_tracing.json: the seeded noise on the entity's embeddings changes the base
    answer's probability; restoring block_output[0] at the entity's last token moves it, while restoring the
    last layer there cannot (no later block carries that position to the last token)."""
    out = _run("causal_tracing", tmp_path / "tracing", llama)
    clean, corrupted = _values(out / "layers=0" / "p_clean.json"), _values(out / "layers=0" / "p_corrupted.json")
    assert all(a != b for a, b in zip(clean, corrupted))
    assert all(a != b for a, b in zip(_values(out / "layers=0" / "p_restored.json"), corrupted))
    assert _values(out / "layers=1" / "p_restored.json") == pytest.approx(corrupted, rel=1e-6)


def test_noise_on_a_ragged_window_does_not_depend_on_the_batch_size(llama, tmp_path):
    """SPEC.md:1365 [M4] the entity's tokens are a ragged (flat) window; with --batch-size 1 each row takes its
    own positions of the whole pass's draw, so the noised scores equal the unbatched run's."""
    whole = _run("causal_tracing", tmp_path / "whole", llama)
    chunked = _run("causal_tracing", tmp_path / "chunked", llama, batch_size=1)
    for point in ("layers=0", "layers=1"):
        assert _values(chunked / point / "p_corrupted.json") == pytest.approx(
            _values(whole / point / "p_corrupted.json"), rel=1e-5)


def test_attention_knockout_publishes_the_clean_pattern(tmp_path):
    """SPEC.md:1428 [M20] attention_knockout.json saves each head's clean pattern at the last token as an
    unreduced output (rows, 1, keys), stamped output/none."""
    raw = json.loads((ROOT / "documents" / "attention_knockout.json").read_text())
    eager = loading.load(validate.document(sweeps.points(raw)[0][1]).model, weights=True)
    out = _run("attention_knockout", tmp_path / "knockout", eager)
    for head in range(4):
        pattern = _weight(out / f"heads={head}" / "pattern.safetensors")
        assert pattern.shape[:2] == (4, 1)
        torch.testing.assert_close(pattern.sum(-1), torch.ones(4, 1), atol=1e-5, rtol=0)


def test_clamp_and_mean_ablation_change_the_scores(llama, tmp_path):
    """SPEC.md:1350 [M1] clamp.json and mean_ablation.json run; each intervention moves logit_diff off the clean
    run's on every row."""
    out = _run("clamp", tmp_path / "clamp", llama)
    assert all(a != b for a, b in zip(_values(out / "logit_diff.json"), _values(out / "clean_logit_diff.json")))
    out = _run("mean_ablation", tmp_path / "mean", llama)
    assert sorted(p.name for p in out.iterdir()) == ["ablated.json", "clean.json", "document.json",
                                                     "mean.safetensors", "run.json"]
    assert all(a != b for a, b in zip(_values(out / "ablated.json"), _values(out / "clean.json")))
