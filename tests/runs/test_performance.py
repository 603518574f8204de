"""The run path's shortcuts (SPEC.md §11, issue 33): each gives exactly the answer of the plain computation."""
from __future__ import annotations

import pytest
import torch

from causalab_ref.runs import scoring

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
