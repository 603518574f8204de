"""Passes: one observe step run over its rows, chunk by chunk, and what it produced (`StepResult`).

A step's rows run in chunks of --batch-size (or the memory budget's rows per pass), each chunk the
whole pass: its forwards in dependency order at the batch's full padded width, each forward's taps placed
(placement.py), a decoding forward handed to decode.py, a forward that other steps compute identically
run once for all of them (share.py). The chunks are stitched back in row order, scored (scoring.py) and
the step's outputs published (writes/outputs.py). SPEC.md §4 Runs, §11 Performance (Q5-Q11):

    result = run_step(engine, plan.steps[0], rows_per_pass=2)
    result.scores["iia"]          # one float (or None) per row
    result.values["logits"]       # (rows, 1, V): what the read `logits` read
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch

from ..positions import resolve
from ..writes import outputs
from ..writes.outputs import Published
from . import share
from .decode import decode_forward
from .placement import (Pass, Resolved, check_tokenizer, eligible_rows, operand_value, place,
                        refuse_metrics_of_nothing, resolve_taps, selection_of)
from .plan import Forward, ObservePlan, frame_key
from .scoring import score
from ..shapes import Action, Batch, Refusal


@dataclass(frozen=True)
class StepResult:
    """What one observe step produced over all its rows, its chunks stitched in row order.

    `positions`: tap name -> {"rows", "reason", "tokens"}, one entry per row; empty when nothing in the
    pass is dynamic (SPEC.md P32-P33). `eligible`: metric name -> each row column-eligible and placed by
    its read (P30). `values`: read name (and `<model>.generated`) -> what it read; a run that scores as it
    goes (`score_as_you_go`) keeps no value of a read only metrics use (Q10). `scores`: metric name -> each
    row's value (None: not scored). `placed`: tap name -> its windows, reasons and tokens. `outputs`: output
    name -> what the step publishes for later steps (SPEC.md §8.2)."""

    positions: dict[str, dict[str, tuple]]
    eligible: dict[str, tuple[bool, ...]]
    values: dict[str, torch.Tensor]
    scores: dict[str, list[Optional[float]]]
    placed: dict[str, Resolved]
    outputs: dict[str, Published]


@dataclass(frozen=True)
class RunContext:
    """What a step's passes take from the run around them: the sweep point's built featurizers and what its
    earlier steps published, whether gradients flow (a fit's update), and the progress bar (a tick a chunk)."""

    featurizers: dict = field(default_factory=dict)  # featurizer name -> the built featurizer
    published: dict[str, Published] = field(default_factory=dict)
    grad: bool = False
    bar: Any = None


def run_step(engine, step: ObservePlan, rows_per_pass: Optional[int] = None, memo: Optional[share.Memo] = None,
             score_as_you_go: bool = False, context: Optional[RunContext] = None) -> StepResult:
    """One observe step: forwards, then metrics, then the step's outputs.

    With `rows_per_pass`, the rows are split into chunks of that many and each chunk runs the
    whole pass (its forwards, in order) at the batch's full padded width, so positions and
    values are those of one pass; row numbers in refusals are the document's. Each chunk takes
    its rows of an unreduced published value and the whole of a reduced one (SPEC.md M17). With
    `memo`, a forward that other steps compute identically runs once for all of them (share.py).
    `score_as_you_go` (the run's own passes) scores a read that only metrics use chunk by chunk, as each chunk
    runs, and keeps its scores, not its values (SPEC.md Q10). `context` is what the run around the step gives
    it (none alone).
    """
    context = context or RunContext()
    path = f"interventions.{step.intervention}"
    for forward in step.forwards:
        check_tokenizer(engine.tokenizer, forward, path)
    rows = len(step.example_ids)
    size = rows_per_pass or rows
    scored_only = _scored_only(step) if score_as_you_go else set()
    parts: list = []
    scored: dict[str, list] = {m.name: [] for m in step.metrics if set(m.reads) <= scored_only}
    lengths = _noise_lengths(engine, step, path) if size < rows else {}
    compiled = _compiled_frames(step, memo) if size < rows else {}
    for lo in range(0, rows, size):
        hi = min(lo + size, rows)
        refs = {name: outputs.chunk(value, lo, hi) for name, value in context.published.items()}
        draw_offsets = {name: (lo, rows) if n is None else (sum(n[:lo]), sum(n)) for name, n in lengths.items()}
        frames = {role: resolve.frame_chunk(frame, lo, hi) for role, frame in compiled.items()}
        values, placed = run_pass(Pass(engine, chunk(step, lo, hi), path, lo, featurizers=context.featurizers,
                                       grad=context.grad, memo=memo, refs=refs, draw_offsets=draw_offsets,
                                       frames=frames))
        finite: dict = {}  # each read's finite rows, asked once for this chunk's metrics (Q33)
        for metric in (m for m in step.metrics if m.name in scored):
            scored[metric.name] += score(metric, values, placed, eligible_rows(metric, placed, lo), lo, finite)
        parts.append(({k: v for k, v in values.items() if k not in scored_only}, placed))
        if context.bar is not None:
            context.bar.update(1)
    return _stitched(step, parts, scored)


def _stitched(step: ObservePlan, parts: list, scored: dict[str, list]) -> StepResult:
    """The chunks' (values, placed) joined in row order, scored (but for what `scored` holds already), and
    the step's outputs published."""
    first_values, first_placed = parts[0]
    # Each value is (rows, w, F) or flat (total, F) in row order: chunks join along the leading axis.
    values = first_values if len(parts) == 1 else {k: torch.cat([p[0][k] for p in parts], dim=0) for k in first_values}
    placed = {k: Resolved(*(sum((getattr(p[1][k], f) for p in parts), ()) for f in ("windows", "reasons", "tokens")))
              for k in first_placed}
    # A pass of bare integers reports nothing (SPEC.md P32-P33): no "positions" entry at all.
    positions = ({name: {"rows": r.windows, "reason": r.reasons, "tokens": r.tokens} for name, r in placed.items()}
                 if step.dynamic else {})
    eligible = {m.name: eligible_rows(m, placed) for m in step.metrics}
    refuse_metrics_of_nothing(step.metrics, eligible, f"interventions.{step.intervention}")
    finite: dict = {}  # each read's finite rows, asked once for the step's metrics (Q33)
    tables = {m.name: scored[m.name] if m.name in scored else score(m, values, placed, eligible[m.name], 0, finite)
              for m in step.metrics}
    published = outputs.publish(step.outputs, values, {k: v.windows for k, v in placed.items()},
                           f"steps.{step.name.split('/')[0]}")
    return StepResult(positions=positions, eligible=eligible, values=values, scores=tables, placed=placed,
                      outputs=published)


def _compiled_frames(step: ObservePlan, memo: Optional[share.Memo]) -> dict:
    """Each role's frame compile built over all the step's rows (the plan keeps them, Q15), from which every
    --batch-size chunk takes its rows rather than building its own (SPEC.md Q26)."""
    if memo is None:
        return {}
    keys = {forward.input: frame_key(forward, step.dynamic) for forward in step.forwards}
    return {role: memo.compiled[key] for role, key in keys.items() if key in memo.compiled}


def _scored_only(step: ObservePlan) -> set[str]:
    """The reads only metrics use (no output keeps them), and only metrics each of whose reads is one of
    them (a metric and its `against` are scored in the same chunks; SPEC.md Q10)."""
    only = {r for m in step.metrics for r in m.reads} - {o.read for _name, o in step.outputs}
    while any(0 < len(only & set(m.reads)) < len(set(m.reads)) for m in step.metrics):
        only -= {r for m in step.metrics if not set(m.reads) <= only for r in m.reads}
    return only


def _noise_lengths(engine, step: ObservePlan, path: str) -> dict[str, Optional[list[int]]]:
    """Each gaussian write's leading axis over the whole pass, so a chunk draws its own part of the
    whole pass's noise (SPEC.md M4): None for a rectangular write (its rows), else each row's positions."""
    whole = Pass(engine, step, path)
    out: dict[str, Optional[list[int]]] = {}
    for forward in step.forwards:
        taps = [t for t in forward.taps if t.kind == "write" and t.mechanism == "gaussian"]
        ragged = [t for t in taps if t.pos.ragged and t.pos.frame == "prompt"]
        resolved = resolve_taps(whole, forward) if ragged else {}
        for tap in taps:
            out[tap.name] = [len(w) for w in resolved[tap.name].windows] if tap in ragged else None
    return out


def chunk(step: ObservePlan, lo: int, hi: int) -> ObservePlan:
    """Rows lo..hi of a step: every forward's ids, masks, segments and anchors sliced, width kept."""
    if (lo, hi) == (0, len(step.example_ids)):
        return step
    forwards = tuple(replace(f, ids=f.ids[lo:hi], mask=f.mask[lo:hi],
                             segments=None if f.segments is None else f.segments[lo:hi],
                             taps=tuple(replace(t, anchors=None if t.anchors is None else t.anchors[lo:hi])
                                        for t in f.taps))
                     for f in step.forwards)
    return replace(step, forwards=forwards, example_ids=step.example_ids[lo:hi])


# ---------------------------------------------------------------- one chunk: the pass loop


def run_pass(p: Pass) -> tuple[dict[str, torch.Tensor], dict[str, Resolved]]:
    """The forwards of one chunk of rows: (values read, where each tap acted). The value table starts
    with this chunk's part of each published value, so a ref is resolved like a read (SPEC.md M13);
    `p.draw_offsets` places a gaussian write's chunk in the whole pass's draw."""
    values: dict[str, torch.Tensor] = dict(p.refs)
    placed: dict[str, Resolved] = {}
    for forward in p.step.forwards:
        resolved = resolve_taps(p, forward)
        if forward.decode:
            resolved, read = decode_forward(p, forward, resolved, values, placed)
        else:
            read = _forward(p, forward, resolved, values, placed)
        values.update(read)
        placed.update({tap.name: resolved[tap.name] for tap in forward.taps})
    return {k: v for k, v in values.items() if k not in p.refs}, placed


def _forward(p: Pass, forward: Forward, resolved: dict[str, Resolved], values: dict[str, torch.Tensor],
             placed: dict[str, Resolved]) -> dict[str, torch.Tensor]:
    """A forward that does not decode: every tap over its windows, each write's operand from what this pass
    read so far; shared with the steps that compute it identically, unless gradients flow."""
    windows = {k: v.windows for k, v in placed.items()}
    actions = tuple(Action(tap=tap, selection=selection_of(tap, resolved[tap.name]),
                           operand=operand_value(p, tap, resolved, values, windows) if tap.kind == "write" else None,
                           featurizer=p.featurizers.get(tap.featurizer),
                           draw_offset=p.draw_offsets.get(tap.name))
                    for tap in forward.taps)
    if p.memo is not None and forward.computation and not p.grad:
        return _shared_forward(p, forward, actions, p.memo)
    batch = Batch(ids=forward.ids, mask=forward.mask, actions=actions, grad=p.grad)
    return p.on_engine(lambda: p.engine.forward(batch))


def _shared_forward(p: Pass, forward: Forward, actions: tuple, memo: share.Memo) -> dict[str, torch.Tensor]:
    """A forward other steps compute identically (SPEC.md Q5): the reads an earlier one kept, or one
    run with every user's reads added, kept for the others. A read of another step that cannot be
    placed on these rows is left to that step, which then runs the forward itself (Q7)."""
    first_to_run = memo.first_to_run(forward, p.lo)
    taken = None if first_to_run else memo.take(forward, p.lo)
    if taken is not None:
        return taken
    frame = p.frames[forward.input]
    extra, names = [], {}
    others = memo.others(forward, p.lo, p.lo + len(forward.ids)) if first_to_run else []
    for k, (identity, tap) in enumerate(others):
        named = replace(tap, name=f"shared:{k}")
        if tap.pos.scope is not None and not frame.offsets:  # this pass built no character map
            continue
        try:
            resolved = place(frame, [named], False, p.path, p.lo)[named.name]
        except Refusal:
            continue
        extra.append(Action(tap=named, selection=selection_of(named, resolved)))
        names[identity] = named.name
    ordered = tuple(sorted(actions + tuple(extra), key=lambda a: (a.tap.address.rank, a.tap.kind != "write")))
    all_reads = p.on_engine(lambda: p.engine.forward(Batch(ids=forward.ids, mask=forward.mask, actions=ordered)))
    if first_to_run:
        mine = {share.read_identity(a.tap): all_reads[a.name] for a in actions if a.tap.kind == "read"}
        memo.keep(forward, p.lo, mine | {identity: all_reads[name] for identity, name in names.items()})
    return {a.name: all_reads[a.name] for a in actions if a.tap.kind == "read"}
