"""Scoring: each metric of a step over the rows both halves admit (SPEC.md P30), per row.

A metric's row is scored when its answer columns are eligible (compile's half) and its read was placed
there (the run's half); the kind scores those rows together (documents/metrics.py), one row's value its
own. The pass loop (passes.py) scores a chunk of rows or a whole step; a fit keeps the graph (`vector`); which rows
both halves admit is placement.py's (`eligible_rows`, with the refusal of a metric of nothing):

    both = placement.eligible_rows(metric, placed)      # placed: read name -> Resolved
    table = score(metric, values, placed, both)          # [float | None per row]; values: read name -> tensor

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


def _scored(metric: MetricPlan, values: dict, placed: dict, both: tuple[bool, ...],
            lo: int = 0) -> tuple[list[int], list[tuple[torch.Tensor, list[int]]], torch.Tensor]:
    """The rows scored (both eligible and placed), for each read the metric scores (`of`'s first, then
    `against`'s) its matrix and the matrix rows those rows are, and their values, scored together by the kind
    (one row's value is that row's alone, metrics.py); `lo` is the chunk's first row in the answers' numbering."""
    rows = [r for r, ok in enumerate(both) if ok]
    picked = []
    for name in metric.reads:
        matrix, index = _row_index(values[name], placed[name])
        rows = [r for r in rows if index[r] is not None]
        picked.append((matrix, index))
    at = [(matrix, [int(index[r] or 0) for r in rows]) for matrix, index in picked]
    vectors = [_rows_of(matrix, indices) for matrix, indices in at]  # (len(rows), V)
    ids = {column: torch.tensor([ids[lo + r] for r in rows], dtype=torch.long) for column, ids in metric.answers}
    given = {**ids, **metric.given(dict(zip(metric.reads, vectors)))}
    return rows, at, metrics.KINDS[metric.kind].score(vectors[0], given)


def _rows_of(matrix: torch.Tensor, at: list[int]) -> torch.Tensor:
    """The matrix's rows `at`, with no copy when they are all of its rows in order."""
    if at == list(range(matrix.shape[0])):
        return matrix
    return matrix.index_select(0, torch.tensor(at, dtype=torch.long))


def score(metric: MetricPlan, values: dict, placed: dict, both: tuple[bool, ...],
          lo: int = 0, finite: Optional[dict] = None) -> list:
    """Per-row metric values (None where the row is not scored, or its value or any entry of a vector it
    scored, `of`'s or `against`'s, is not finite: a match on NaN logits is no measurement); `values` and
    `placed` hold each read's rows lo.. of the step (a chunk's), by read name, and `both` those rows'
    eligibility. `finite`, when given, keeps each read's `finite_rows` over all its rows for the other metrics
    of the same `values` (the metrics of one read ask it once, SPEC.md Q33)."""
    out: list[Optional[float]] = [None] * len(placed[metric.of].windows)
    rows, at, scored = _scored(metric, {n: values[n].detach().float() for n in metric.reads}, placed, both, lo)
    memo = {} if finite is None else finite
    all_finite = torch.ones(len(rows), dtype=torch.bool)  # (len(rows),)
    for name, (matrix, rows_at) in zip(metric.reads, at):  # `against`'s too: every vector a row reads is finite
        if name not in memo:
            memo[name] = finite_rows(matrix)  # (matrix rows,)
        all_finite &= _rows_of(memo[name], rows_at)
    for r, v, ok in zip(rows, _values(metric, scored), all_finite.tolist()):
        out[r] = v if ok and (isinstance(v, list) or math.isfinite(v)) else None
    return out


def _values(metric: MetricPlan, scored) -> list:
    """Each scored row's value: a number, or for a listed kind (top_k) its `[[token, probability], ...]`, most
    likely first, each token spelled by the run's tokenizer (metrics.spelled; SPEC.md D28)."""
    if not metrics.KINDS[metric.kind].listed:
        return scored.tolist()
    probabilities, ids = scored
    spell = metric.spell if metric.spell is not None else str
    return [[[spell(int(i)), p] for i, p in zip(row_ids, row_p)]
            for row_ids, row_p in zip(ids.tolist(), probabilities.tolist())]


def finite_rows_plain(matrix: torch.Tensor) -> torch.Tensor:
    """The definition: whether each row of `matrix` (m, V) is finite throughout (SPEC.md S52). (m, V) -> (m,)."""
    return torch.isfinite(matrix).all(-1)


def finite_rows(matrix: torch.Tensor) -> torch.Tensor:
    """An optimisation of `finite_rows_plain`, equal to it on every input (a test checks each special value at
    every place). A row
    whose sum is finite is finite throughout (a NaN or an infinity in a sum leaves it NaN or infinite, whatever
    the order of the additions), so one sum answers most rows; a row whose sum is not finite (a non-finite entry,
    or finite entries whose sum overflows) is answered by its largest and smallest entries, which are both finite
    exactly when every entry is (NaN propagates through both, +inf is the largest, -inf the smallest). No
    (m, V) mask is made (SPEC.md Q25, Q33)."""
    finite = torch.isfinite(matrix.sum(dim=-1))  # (m,)
    if not bool(finite.all()):
        doubt = (~finite).nonzero()[:, 0]  # (d,): the rows the sum cannot answer
        rest = matrix.index_select(0, doubt)  # (d, V)
        finite[doubt] = torch.isfinite(rest.amax(dim=-1)) & torch.isfinite(rest.amin(dim=-1))
    return finite


def vector(metric: MetricPlan, values: dict, placed: dict, both: tuple[bool, ...]) -> torch.Tensor:
    """A metric over its scored rows as one float32 vector, keeping the graph (a fit's loss term)."""
    return _scored(metric, {n: values[n].float() for n in metric.reads}, placed, both)[2]
