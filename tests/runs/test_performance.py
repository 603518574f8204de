"""The run path's shortcuts (SPEC.md §11, issue 33): each gives exactly the answer of the plain computation."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from causalab_ref.positions import locate
from causalab_ref.runs import scoring

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"

SPECIALS = (float("nan"), float("inf"), float("-inf"))


@pytest.mark.fast
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_finite_rows_is_isfinite_all_for_every_special_value_at_every_place(dtype):
    """SPEC.md:1509 [Q25] a NaN, +inf or -inf at the first, a middle, the next-to-last or the last entry of a row, at
    widths around the vector lengths a reduction unrolls by, contiguous or strided: the row, and only it, is not
    finite, exactly as `torch.isfinite(m).all(-1)` says."""
    for width in (1, 2, 7, 8, 9, 31, 32, 33, 65, 1000):
        for special in SPECIALS:
            for place in sorted({0, width // 2, max(0, width - 2), width - 1}):
                m = torch.randn(4, width).to(dtype)
                m[2, place] = special
                for layout in (m, m.t().contiguous().t()):
                    want = torch.isfinite(layout).all(-1)
                    assert torch.equal(scoring.finite_rows(layout), want), (width, special, place)
                    assert want.tolist() == [True, True, False, True]


@pytest.mark.fast
def test_finite_rows_of_rows_wholly_special_or_mixed():
    """SPEC.md:1509 [Q25] a row all NaN, all +inf, +inf beside -inf, NaN beside inf, and the float32 extremes
    (finite): each row's answer is isfinite's."""
    big = torch.finfo(torch.float32).max
    m = torch.tensor([[float("nan")] * 3, [float("inf")] * 3, [float("inf"), 0.0, float("-inf")],
                      [float("nan"), float("inf"), 1.0], [big, -big, 0.0], [1.0, 2.0, 3.0]])
    assert scoring.finite_rows(m).tolist() == torch.isfinite(m).all(-1).tolist() == [False] * 4 + [True] * 2


# ---------------------------------------------------------------- a window's frame is the compiled frame's rows


def _entity_plan(llama):
    from causalab_ref.runs import compile as compiler

    raw = json.loads((ROOT / "documents" / "entity_patch.json").read_text(encoding="utf-8"))
    return compiler.compile_document(raw, llama, DATA)


def test_a_frames_rows_are_the_frame_of_those_rows_alone(llama):
    """SPEC.md:1515 [Q26] rows lo..hi of the frame of a padded batch (anchored rows of different lengths, char maps
    built) equal the frame `frame_of_ids` builds from those rows alone at the same width, for every window."""
    forward = _entity_plan(llama).steps[0].forwards[0]
    whole = locate.frame_of_ids(llama.tokenizer, forward.ids, forward.mask)
    rows = len(forward.ids)
    assert rows >= 4 and len({sum(m) for m in forward.mask}) > 1  # rows of different lengths
    for lo in range(rows):
        for hi in range(lo + 1, rows + 1):
            alone = locate.frame_of_ids(llama.tokenizer, forward.ids[lo:hi], forward.mask[lo:hi])
            assert locate.frame_rows(whole, lo, hi) == alone, (lo, hi)


def test_a_windowed_run_builds_no_frame_and_writes_what_it_wrote_building_them(llama, tmp_path, monkeypatch):
    """SPEC.md:1515 [Q26] with --batch-size 3 the run builds no frame (compile built them over all the rows), and
    its files are byte for byte those of the same run building each window's frame itself."""
    from causalab_ref.runs import passes, placement, run

    plan = _entity_plan(llama)
    built: list = []
    real = placement.build_frame
    monkeypatch.setattr(placement, "build_frame", lambda *a: built.append(1) or real(*a))
    run.execute(plan, llama, tmp_path / "taken", batch_size=3, progress=False)
    assert built == []
    monkeypatch.setattr(passes, "_compiled_frames", lambda step, memo: {})
    run.execute(plan, llama, tmp_path / "built", batch_size=3, progress=False)
    assert built  # the windows built their own frames
    for name in ("iia.json", "logit_diff.json", "document.json"):
        assert (tmp_path / "taken" / name).read_bytes() == (tmp_path / "built" / name).read_bytes(), name
