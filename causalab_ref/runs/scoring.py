"""Scoring: each metric of a step over the rows both halves admit (SPEC.md P30), per row.

A metric's row is scored when its answer columns are eligible (compile's half) and its read was placed
there (the run's half); the kind scores those rows together (documents/metrics.py), one row's value its
own. The pass loop (passes.py) scores a window or a whole step; a fit keeps the graph (`vector`); which rows
both halves admit is placement.py's (`eligible_rows`, with the refusal of a metric of nothing):

    both = placement.eligible_rows(metric, placed[metric.of])
    table = score(metric, values[metric.of], placed[metric.of], both)    # [float | None per row]

A scored row whose vector or value is not finite gets None; its table row is ineligible with the
reason NON_FINITE (SPEC.md S52), never a null marked eligible.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..documents import metrics
from .placement import Resolved
from .plan import MetricPlan

NON_FINITE = "non_finite"  # a table row's reason when the value it scored, or the vector it read, is not finite


def _row_index(value: torch.Tensor, resolved: Resolved) -> tuple[torch.Tensor, list[Optional[int]]]:
    """The scored vectors as one matrix (m, V), and each row's index into it (None: not placed). A read
    is rectangular (rows, 1, V) or flat (total, V) in resolved-row order."""
    if value.dim() == 3:
        return value[:, 0], list(range(value.shape[0]))  # (rows, 1, V) -> (rows, V)
    out: list[Optional[int]] = []
    k = 0
    for window in resolved.windows:
        out.append(k if window else None)
        k += len(window)
    return value, out


def _scored(metric: MetricPlan, value: torch.Tensor, resolved: Resolved, both: tuple[bool, ...],
            lo: int = 0) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """The rows scored (both eligible and placed), their vectors and their values, scored together by the kind
    (one row's value is that row's alone, metrics.py); `lo` is the window's first row in the answers' numbering."""
    matrix, index = _row_index(value, resolved)
    rows = [r for r, i in enumerate(index) if both[r] and i is not None]
    at = [index[r] for r in rows]
    whole = at == list(range(matrix.shape[0]))  # every row scored: no copy of the logits
    picked = matrix if whole else matrix.index_select(0, torch.tensor(at, dtype=torch.long))  # (len(rows), V)
    ids = {column: torch.tensor([ids[lo + r] for r in rows], dtype=torch.long) for column, ids in metric.answers}
    return rows, picked, metrics.KINDS[metric.kind].score(picked, ids)


def score(metric: MetricPlan, value: torch.Tensor, resolved: Resolved, both: tuple[bool, ...],
          lo: int = 0) -> list[Optional[float]]:
    """Per-row metric values (None where the row is not scored, or its value or any entry of the vector it
    scored is not finite: a match on NaN logits is no measurement); `value`, `resolved` and `both` are rows
    lo.. of the step (a window's)."""
    out: list[Optional[float]] = [None] * len(resolved.windows)
    rows, picked, values = _scored(metric, value.detach().float(), resolved, both, lo)
    for r, v, whole in zip(rows, values.tolist(), finite_rows(picked).tolist()):
        out[r] = v if whole and math.isfinite(v) else None
    return out


def finite_rows(matrix: torch.Tensor) -> torch.Tensor:
    """Whether each row of `matrix` (m, V) is finite throughout: exactly `torch.isfinite(matrix).all(-1)`, read
    from the row's largest and smallest entries (NaN propagates through both, +inf is the largest, -inf the
    smallest), two reductions instead of an (m, V) mask: about 15x less time on a 32,000-wide head (SPEC.md Q25)."""
    return torch.isfinite(matrix.amax(dim=-1)) & torch.isfinite(matrix.amin(dim=-1))  # (m,)


def vector(metric: MetricPlan, value: torch.Tensor, resolved: Resolved, both: tuple[bool, ...]) -> torch.Tensor:
    """A metric over its scored rows as one float32 vector, keeping the graph (a fit's loss term)."""
    return _scored(metric, value.float(), resolved, both)[2]
