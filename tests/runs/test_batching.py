"""--batch-size: rows split into chunks, each running the whole pass; results are one pass's."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from causalab_ref.runs import compile as compiler
from causalab_ref.runs import run
from causalab_ref.shapes import Refusal

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
ENTITY = json.loads((ROOT / "documents" / "entity_patch.json").read_text())
GENERATED = json.loads((ROOT / "documents" / "generated_answer.json").read_text())


def _step(llama, doc, root=DATA):
    return compiler.compile_document(doc, llama, Path(root)).steps[0]


@pytest.mark.parametrize("size", [1, 3])
def test_batched_results_equal_one_pass(llama, size):
    """SPEC.md:588 [R11] chunks of rows give one pass's positions, tokens, reasons and eligibility, and
    its values to float32 rounding."""
    step = _step(llama, ENTITY)
    whole = run.run_step(llama, step)
    split = run.run_step(llama, step, rows_per_pass=size)
    assert split.positions == whole.positions
    assert split.eligible == whole.eligible
    for name in whole.values:
        assert torch.allclose(split.values[name], whole.values[name], atol=1e-6)
    assert split.scores["iia"] == whole.scores["iia"]
    assert split.scores["logit_diff"] == pytest.approx(whole.scores["logit_diff"], abs=1e-6)


def test_batched_decode_equals_one_pass(llama):
    """SPEC.md:588 [R11] a decoding pass split in chunks keeps its steps, tokens and generated ids."""
    step = _step(llama, GENERATED)
    whole = run.run_step(llama, step)
    split = run.run_step(llama, step, rows_per_pass=3)
    assert split.positions == whole.positions
    assert torch.equal(split.values["original.generated"], whole.values["original.generated"])


def test_batched_refusals_name_the_documents_rows(llama):
    """SPEC.md:588 [R11] a refusal in a later chunk names the row by the document's numbering. Compile places
    the prompt frame of every row (P58), so the run's own check is reached by a plan whose write anchors row 3
    to text its prompt lacks after compile."""
    step = _step(llama, ENTITY)
    base = next(f for f in step.forwards if any(t.name == "patch" for t in f.taps))
    taps = tuple(replace(t, anchors=t.anchors[:3] + ("Tuesday",)) if t.name == "patch" else t for t in base.taps)
    step = replace(step, forwards=tuple(replace(f, taps=taps) if f is base else f for f in step.forwards))
    with pytest.raises(Refusal) as refusal:
        run.run_step(llama, step, rows_per_pass=2)
    assert refusal.value.stage == "run"
    assert refusal.value.message.startswith("write 'patch' has nothing to write on row(s) {3: 'alignment_missing'}")
