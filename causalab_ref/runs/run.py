"""Run: walk a compiled plan on an engine, score the metrics, hand the tables to the results folder.

Per observe step, each forward in dependency order: resolve every tap's positions
against the model's tokenizer (locate.py), decide eligibility (a read may skip a
row, a write may not, a fixed-width cut that does not fit is refused), hand the
engine its selections and operands, keep what it read. Then each metric over the
rows both halves admit. The tables go to results.py's folder, which knows about files
(staging, confinement, the move into place). SPEC.md §4 Runs.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import torch

from ..featurizers import bundles, kinds, fit
from ..positions import locate
from ..documents import metrics
from ..writes import outputs
from . import results, share
from .plan import Forward, ObservePlan, Plan, Tap
from ..shapes import Action, Batch, Ref, Refusal, Selection

FIXED_WIDTH = ("{kind} '{name}' at {spelling} has no position on row(s) {rows}. A position of a fixed width "
               "names the same number of tokens on every row, so a row it does not fit is refused rather than "
               "skipped; a position anchored to the row's own text may skip a row, and says why")
NOTHING_TO_WRITE = ("write '{name}' has nothing to write on row(s) {rows}. A read may skip a row; a write may "
                    "not — writing nothing somewhere is not an intervention, and the row would score as if one "
                    "had happened. `alignment_ambiguous` is a value that is in the prompt more than once, and "
                    "scoping the anchor is what makes it one")
RAGGED_MISMATCH = ("write '{name}' covers {want} positions per row but its operand '{operand}' was read over "
                   "{have}; rows {rows} differ. Landing a window of one width in another is a policy this slice "
                   "does not implement — the protocol's `exact_length_buckets` and `padded_masked` — so it refuses")

PAST_STOP = "past_stop"  # a continuation write's reason on a row that stopped before some of its steps


def _refuse(message: str, path: str):
    raise Refusal(message, path=path, stage="run")


@dataclass
class Resolved:
    """One tap's positions on this forward's rows."""

    windows: tuple[tuple[int, ...], ...]
    reasons: tuple[str, ...]
    tokens: tuple[str, ...]


def place(frame, taps, dynamic: bool, path: str, offset: int = 0) -> dict[str, Resolved]:
    """Every tap's windows on one frame, with the run-time refusals of SPEC.md §2.9 Eligibility.

    `offset` is the frame's first row in the document's numbering (a --batch-size window)."""
    out = {}
    for tap in taps:
        windows, reasons = locate.locate(frame, tap.pos, tap.anchors)
        tokens = tuple(locate.tokens_of(frame, w, r) if dynamic else "" for r, w in enumerate(windows))
        bad = {r + offset: reason for r, reason in enumerate(reasons) if reason}
        where = f"{path}.{tap.kind}s.{tap.name}.pos"
        if bad and not tap.pos.uneven:
            _refuse(FIXED_WIDTH.format(kind=tap.kind, name=tap.name, spelling=tap.pos.spelling(), rows=bad), where)
        if bad and tap.kind == "write":
            _refuse(NOTHING_TO_WRITE.format(name=tap.name, rows=bad), where)
        out[tap.name] = Resolved(windows=tuple(tuple(w) for w in windows), reasons=tuple(reasons), tokens=tokens)
    return out


def resolve_taps(engine, step: ObservePlan, forward: Forward, path: str, offset: int = 0,
                 frames: Optional[dict] = None, memo: Optional[share.Memo] = None) -> dict[str, Resolved]:
    """The prompt-frame taps of one forward, resolved against the model's tokenizer.

    `frames` caches each role's frame within a pass: two forwards on one role share their rows,
    so the character map (the expensive half) is built once; `memo` keeps the last few frames
    of the run for the sweep points on the same rows (SPEC.md Q15)."""
    frames = {} if frames is None else frames
    if forward.input not in frames:
        def build():
            return locate.frame_of_ids(engine.tokenizer, forward.ids, forward.mask, segments=forward.segments,
                                       char_map=step.dynamic)
        key = (forward.ids, forward.mask, repr(forward.segments), step.dynamic)
        frames[forward.input] = build() if memo is None else memo.frame(key, build)
    frame = frames[forward.input]
    return place(frame, [t for t in forward.taps if t.pos.frame == "prompt"], step.dynamic, path, offset)


def selection_of(tap: Tap, resolved: Resolved) -> Selection:
    return Selection(windows=resolved.windows, seq_axis=tap.address.seq_axis, ragged=tap.pos.ragged,
                     groups=tap.groups, take=tap.take)


def operand_value(tap: Tap, resolved: dict[str, Resolved], values: dict[str, torch.Tensor],
                  read_windows: dict[str, tuple], path: str, offset: int = 0):
    """What a write lands: a read of this intervention (windows checked row by row), a published value
    (`values` holds this window's part of it, checked at compile), a number, or nothing."""
    if tap.operand is None or isinstance(tap.operand, Ref):
        return None if tap.operand is None else values[tap.operand.name]
    if not isinstance(tap.operand, str):
        return float(tap.operand)
    mine = resolved[tap.name].windows
    theirs = read_windows[tap.operand]
    # Row by row whichever side is ragged: a bare write fed by an anchored read is refused here
    # when the read skipped a row, not later as a shape the engine cannot land.
    want = [len(w) for w in mine]
    have = [len(w) for w in theirs]
    rows = [r + offset for r, (a, b) in enumerate(zip(want, have)) if a != b]
    if rows or len(mine) != len(theirs):
        _refuse(RAGGED_MISMATCH.format(name=tap.name, want=want, operand=tap.operand, have=have, rows=rows),
                f"{path}.writes.{tap.name}.pos")
    return _in_layout(values[tap.operand], tap.pos.ragged, len(mine))


def _in_layout(value: torch.Tensor, ragged: bool, rows: int) -> torch.Tensor:
    """An operand read in the other layout, per-row widths already equal: a rectangular read
    (rows, w, F) lands in a ragged write as (total, F), and a flat read in a rectangular write
    as (rows, w, F). Row order is the same in both, so this is a reshape (SPEC.md P48)."""
    if ragged and value.dim() == 3:
        return value.reshape(-1, value.shape[-1])
    if not ragged and value.dim() == 2 and rows and value.shape[0] % rows == 0:
        return value.reshape(rows, value.shape[0] // rows, value.shape[-1])
    return value


def run_step(engine, step: ObservePlan, batch_size: Optional[int] = None, bar=None, live: Optional[dict] = None,
             grad: bool = False, memo: Optional[share.Memo] = None, published: Optional[dict] = None,
             lean: bool = False) -> dict:
    """One observe pass: forwards, then metrics, then the step's outputs. Returns the step's results
    (plain data + tensors); `published` holds the outputs of earlier steps its refs name.

    With `batch_size`, the rows are split into windows of that many and each window runs the
    whole pass (its forwards, in order) at the batch's full padded width, so positions and
    values are those of one pass; row numbers in refusals are the document's. Each window takes
    its rows of an unreduced published value and the whole of a reduced one (SPEC.md M17). With
    `memo`, a forward that other steps compute identically runs once for all of them (share.py).
    `lean` (the run's own passes) scores a read that only metrics use window by window and keeps its
    scores, not its values (SPEC.md Q10).
    """
    path = f"interventions.{step.intervention}"
    for forward in step.forwards:
        check_tokenizer(engine.tokenizer, forward, path)
    rows = len(step.example_ids)
    size = batch_size or rows
    scored_only = _scored_only(step) if lean else set()
    parts: list = []
    scored: dict[str, list] = {m.name: [] for m in step.metrics if m.of in scored_only}
    lengths = _noise_lengths(engine, step, path) if size < rows else {}
    for lo in range(0, rows, size):
        hi = min(lo + size, rows)
        refs = {name: outputs.window(value, lo, hi) for name, value in (published or {}).items()}
        leads = {name: (lo, rows) if n is None else (sum(n[:lo]), sum(n)) for name, n in lengths.items()}
        got, where = _pass(engine, window(step, lo, hi), path, lo, live or {}, grad, memo, refs, leads)
        for metric in (m for m in step.metrics if m.name in scored):
            read = where[metric.of]
            scored[metric.name] += score(metric, got[metric.of], read, _both(metric, read, lo), lo)
        parts.append(({k: v for k, v in got.items() if k not in scored_only}, where))
        if bar is not None:
            bar.update(1)
    values = parts[0][0] if len(parts) == 1 else {k: torch.cat([p[0][k] for p in parts], dim=0) for k in parts[0][0]}
    placed = {k: Resolved(*(sum((getattr(p[1][k], f) for p in parts), ()) for f in ("windows", "reasons", "tokens")))
              for k in parts[0][1]}
    # A pass of bare integers reports nothing (SPEC.md P32-P33): no "positions" entry at all.
    positions = ({name: {"rows": r.windows, "reason": r.reasons, "tokens": r.tokens} for name, r in placed.items()}
                 if step.dynamic else {})
    eligible = {m.name: _both(m, placed[m.of]) for m in step.metrics}
    _refuse_metrics_of_nothing(step, eligible, path)
    tables = {m.name: scored[m.name] if m.name in scored else score(m, values[m.of], placed[m.of], eligible[m.name])
              for m in step.metrics}
    made = outputs.publish(step.outputs, values, {k: v.windows for k, v in placed.items()},
                           f"steps.{step.name.split('/')[0]}")
    return {"positions": positions, "eligible": eligible, "values": values, "scores": tables, "placed": placed,
            "outputs": made}


def _refuse_metrics_of_nothing(step: ObservePlan, eligible: dict, path: str) -> None:
    """A metric no row of which is both column-eligible and placed by its read has no mean (SPEC.md P30)."""
    for metric in step.metrics:
        if not any(eligible[metric.name]):
            _refuse(f"metric '{metric.name}': no row is both column-eligible and placed by its read "
                    f"'{metric.of}'; a metric of nothing has no mean", f"{path}.metrics.{metric.name}")


def _scored_only(step: ObservePlan) -> set[str]:
    """The reads only metrics use: no output keeps them (SPEC.md Q10)."""
    return {m.of for m in step.metrics} - {o.read for _name, o in step.outputs}


def _both(metric, read: Resolved, lo: int = 0) -> tuple[bool, ...]:
    """A metric's rows lo.. of a window: column-eligible and placed by its read (SPEC.md P30)."""
    return tuple(col and not reason for col, reason in zip(metric.eligible[lo:lo + len(read.reasons)], read.reasons))


def _noise_lengths(engine, step: ObservePlan, path: str) -> dict[str, Optional[list[int]]]:
    """Each gaussian write's leading axis over the whole pass, so a window draws its own part of the
    whole pass's noise (SPEC.md M4): None for a rectangular write (its rows), else each row's positions."""
    out: dict[str, Optional[list[int]]] = {}
    for forward in step.forwards:
        taps = [t for t in forward.taps if t.kind == "write" and t.mechanism == "gaussian"]
        ragged = [t for t in taps if t.pos.ragged and t.pos.frame == "prompt"]
        resolved = resolve_taps(engine, step, forward, path) if ragged else {}
        for tap in taps:
            out[tap.name] = [len(w) for w in resolved[tap.name].windows] if tap in ragged else None
    return out


def check_tokenizer(tok, forward: Forward, path: str) -> None:
    """The run's tokenizer must be the one that encoded the plan: row 0 decoded by both must agree.

    Decoded strings are compared, not re-encodings, because encode(decode(ids)) == ids is not a
    property tokenizers have (SPEC.md P52)."""
    here = tok.decode(list(forward.ids[0]), skip_special_tokens=False)
    if forward.check and here != forward.check:
        _refuse(f"the tokenizer at run time decodes row 0 of forward '{forward.model}' on '{forward.input}' as "
                f"{here[:80]!r}, and the plan was encoded by one that decodes it as {forward.check[:80]!r}; "
                "compile and run against the same checkpoint's tokenizer", f"{path}")


def window(step: ObservePlan, lo: int, hi: int) -> ObservePlan:
    """Rows lo..hi of a step: every forward's ids, masks, segments and anchors sliced, width kept."""
    if (lo, hi) == (0, len(step.example_ids)):
        return step
    forwards = tuple(replace(f, ids=f.ids[lo:hi], mask=f.mask[lo:hi],
                             segments=None if f.segments is None else f.segments[lo:hi],
                             taps=tuple(replace(t, anchors=None if t.anchors is None else t.anchors[lo:hi])
                                        for t in f.taps))
                     for f in step.forwards)
    return replace(step, forwards=forwards, example_ids=step.example_ids[lo:hi])


def _pass(engine, step: ObservePlan, path: str, offset: int, live: dict, grad: bool = False,
          memo: Optional[share.Memo] = None, refs: Optional[dict] = None, leads: Optional[dict] = None):
    """The forwards of one window of rows: (values read, where each tap acted). The value table starts
    with this window's part of each published value, so a ref is resolved like a read (LR§5.3);
    `leads` places a gaussian write's window in the whole pass's draw."""
    refs, leads = refs or {}, leads or {}
    values: dict[str, torch.Tensor] = dict(refs)
    placed: dict[str, Resolved] = {}
    frames: dict = {}
    for forward in step.forwards:
        resolved = resolve_taps(engine, step, forward, path, offset, frames, memo)
        if forward.decode:
            resolved, read = decode_forward(engine, forward, resolved, values, placed, path, offset, live, leads)
        else:
            windows = {k: v.windows for k, v in placed.items()}
            actions = tuple(Action(tap=tap, selection=selection_of(tap, resolved[tap.name]),
                                   operand=operand_value(tap, resolved, values, windows, path, offset)
                                   if tap.kind == "write" else None, featurizer=live.get(tap.featurizer),
                                   lead=leads.get(tap.name))
                            for tap in forward.taps)
            if memo is not None and forward.computation and not grad:
                read = _shared_forward(engine, forward, actions, frames[forward.input], memo, path, offset)
            else:
                batch = Batch(ids=forward.ids, mask=forward.mask, actions=actions, grad=grad)
                read = _in_document(lambda: engine.forward(batch), path)
        values.update(read)
        placed.update({tap.name: resolved[tap.name] for tap in forward.taps})
    return {k: v for k, v in values.items() if k not in refs}, placed


def _shared_forward(engine, forward: Forward, actions: tuple, frame, memo: share.Memo, path: str,
                    offset: int) -> dict[str, torch.Tensor]:
    """A forward other steps compute identically (SPEC.md Q5): the reads an earlier one kept, or one
    run with every user's reads added, kept for the others. A read of another step that cannot be
    placed on these rows is left to that step, which then runs the forward itself (Q7)."""
    lead = memo.leads(forward, offset)
    taken = None if lead else memo.take(forward, offset)
    if taken is not None:
        return taken
    extra, names = [], {}
    for k, (identity, tap) in enumerate(memo.others(forward, offset, offset + len(forward.ids)) if lead else ()):
        named = replace(tap, name=f"shared:{k}")
        if tap.pos.scope is not None and not frame.offsets:  # this pass built no character map
            continue
        try:
            where = place(frame, [named], False, path, offset)[named.name]
        except Refusal:
            continue
        extra.append(Action(tap=named, selection=selection_of(named, where)))
        names[identity] = named.name
    ordered = tuple(sorted(actions + tuple(extra), key=lambda a: (a.tap.address.rank, a.tap.kind != "write")))
    got = _in_document(lambda: engine.forward(Batch(ids=forward.ids, mask=forward.mask, actions=ordered)), path)
    if lead:
        mine = {share.read_identity(a.tap): got[a.name] for a in actions if a.tap.kind == "read"}
        memo.keep(forward, offset, mine | {identity: got[name] for identity, name in names.items()})
    return {a.name: got[a.name] for a in actions if a.tap.kind == "read"}


def _in_document(call, path: str):
    """An engine's refusal names a place relative to the intervention (`reads.<r>.pos`); give it the
    whole document path (`interventions.<i>.reads.<r>.pos`). Site paths are already whole."""
    try:
        return call()
    except Refusal as refusal:
        if refusal.path and not refusal.path.startswith(("sites.", "interventions.", "model.")):
            refusal.path = f"{path}.{refusal.path}"
        raise


def _steps_of(tap: Tap, decode: int) -> tuple[int, ...]:
    """The decode steps a tap fires at: 0 for the prompt frame, k for {"index": k}, all otherwise."""
    if tap.pos.frame == "prompt":
        return (0,)
    if not tap.stacked and tap.pos.index is not None:
        return (tap.pos.index,)
    return tuple(range(decode))


def _decode_actions(forward: Forward, resolved: dict, values: dict, placed: dict, path: str,
                   offset: int, live: dict, leads: dict) -> tuple[Action, ...]:
    """A decoding forward's actions: prompt taps over their windows at step 0, continuation taps at
    their steps (the engine places them on the one position each step computes)."""
    rows = len(forward.ids)
    windows = {k: v.windows for k, v in placed.items()}
    actions = []
    for tap in forward.taps:
        prompt = tap.pos.frame == "prompt"
        if prompt:
            selection = selection_of(tap, resolved[tap.name])
        else:
            selection = Selection(windows=tuple((0,) for _ in range(rows)), seq_axis=tap.address.seq_axis,
                                  groups=tap.groups, take=tap.take)
        operand = None
        if tap.kind == "write":
            operand = (operand_value(tap, resolved, values, windows, path, offset) if prompt
                       else _continuation_operand(tap, values, placed, rows, path))
        actions.append(Action(tap=tap, selection=selection, operand=operand, steps=_steps_of(tap, forward.decode),
                              featurizer=live.get(tap.featurizer), lead=leads.get(tap.name)))
    return tuple(actions)


def decode_forward(engine, forward: Forward, resolved: dict, values: dict, placed: dict, path: str,
                   offset: int = 0, live: Optional[dict] = None, leads: Optional[dict] = None):
    """A forward that decodes: prompt taps at step 0, continuation taps at their steps, then the cut.

    A stacked read comes back (rows, steps, features) and is cut per row against the
    continuation frame (generated ids cut at each row's first stop token) afterwards.
    """
    rows = len(forward.ids)
    batch = Batch(ids=forward.ids, mask=forward.mask, decode=forward.decode,
                  actions=_decode_actions(forward, resolved, values, placed, path, offset, live or {}, leads or {}))
    read, generated = _in_document(lambda: engine.generate(batch), path)
    frame = locate.frame_of_continuation(engine.tokenizer, generated, engine.stop_ids())
    continuation = [t for t in forward.taps if t.pos.frame == "generated"]
    cut = place(frame, [t for t in continuation if t.kind == "read"], True, path, offset)
    for tap in continuation:
        if tap.kind == "write":
            cut[tap.name] = continuation_write(frame, _steps_of(tap, forward.decode), rows)
        elif tap.stacked:
            read[tap.name] = _cut_stack(read[tap.name], cut[tap.name].windows, tap.pos.uneven)
    resolved = {**resolved, **cut}
    read[f"{forward.model}.generated"] = generated
    return resolved, read


def continuation_write(frame, steps: tuple[int, ...], rows: int) -> Resolved:
    """A continuation write's provenance: its positions are the decode steps it fired at and its tokens what
    the model produced there. On a row whose continuation stopped before some of those steps the write still
    fired at them (the decode runs to its bound), on tokens the frame no longer holds: the tokens end at the
    stop and the reason is `past_stop` (SPEC.md P54)."""
    reasons, tokens = [], []
    for r in range(rows):
        inside = tuple(k for k in steps if k < frame.ends[r])
        reasons.append("" if len(inside) == len(steps) else PAST_STOP)
        tokens.append(locate.tokens_of(frame, inside, r))
    return Resolved(windows=tuple(steps for _ in range(rows)), reasons=tuple(reasons), tokens=tuple(tokens))


def _continuation_operand(tap: Tap, values: dict, placed: dict, rows: int, path: str):
    """A continuation write lands a number, a published value, or a read of width 1 on every row, at each
    step it fires at."""
    if tap.operand is None or isinstance(tap.operand, Ref):
        return None if tap.operand is None else values[tap.operand.name]
    if not isinstance(tap.operand, str):
        return float(tap.operand)
    windows = placed[tap.operand].windows
    if any(len(w) != 1 for w in windows):
        _refuse(f"write '{tap.name}' lands one position per decode step, and its operand '{tap.operand}' was not "
                f"read over one position on every row ({[len(w) for w in windows]})", f"{path}.writes.{tap.name}")
    value = values[tap.operand]
    return value if value.dim() == 3 else value.unsqueeze(1)


def _cut_stack(stack: torch.Tensor, windows, ragged: bool) -> torch.Tensor:
    """(rows, steps, F) cut by each row's window of steps: flat (total, F) when ragged, else (rows, w, F).
    A cut that keeps every step of every row is the stack itself, reshaped (SPEC.md Q13)."""
    every = tuple(range(stack.shape[1]))
    if len(windows) == stack.shape[0] and all(tuple(w) == every for w in windows):
        return stack.reshape(-1, stack.shape[-1]) if ragged else stack
    parts = [stack[r, list(w)] for r, w in enumerate(windows)]
    if ragged:
        return torch.cat(parts, dim=0) if parts else stack.new_zeros((0, stack.shape[-1]))
    return torch.stack(parts, dim=0)


def _row_index(value: torch.Tensor, resolved: Resolved) -> tuple[torch.Tensor, list[Optional[int]]]:
    """The scored vectors as one matrix (m, V), and each row's index into it (None: not placed). A read
    is rectangular (rows, 1, V) or flat (total, V) in resolved-row order."""
    if value.dim() == 3:
        return value[:, 0], list(range(value.shape[0]))
    out: list[Optional[int]] = []
    k = 0
    for window in resolved.windows:
        out.append(k if window else None)
        k += len(window)
    return value, out


def _scores(metric, value: torch.Tensor, resolved: Resolved, both: tuple[bool, ...],
            lo: int = 0) -> tuple[list[int], torch.Tensor]:
    """The rows scored (both eligible and placed) and their values, scored together by the kind (one row's
    value is that row's alone, metrics.py); `lo` is the window's first row in the answers' numbering."""
    matrix, index = _row_index(value, resolved)
    rows = [r for r, i in enumerate(index) if both[r] and i is not None]
    at = [index[r] for r in rows]
    whole = at == list(range(matrix.shape[0]))  # every row scored: no copy of the logits
    picked = matrix if whole else matrix.index_select(0, torch.tensor(at, dtype=torch.long))
    ids = {column: torch.tensor([ids[lo + r] for r in rows], dtype=torch.long) for column, ids in metric.answers}
    return rows, metrics.KINDS[metric.kind].score(picked, ids)


def score(metric, value: torch.Tensor, resolved: Resolved, both: tuple[bool, ...],
          lo: int = 0) -> list[Optional[float]]:
    """Per-row metric values (None where the row is not scored, or its value is not finite); `value`,
    `resolved` and `both` are rows lo.. of the step (a window's)."""
    out: list[Optional[float]] = [None] * len(resolved.windows)
    rows, values = _scores(metric, value.detach().float(), resolved, both, lo)
    for r, v in zip(rows, values.tolist()):
        out[r] = v if math.isfinite(v) else None
    return out


def metric_vectors(step: ObservePlan, results: dict) -> dict[str, torch.Tensor]:
    """Each metric over its eligible rows as one float32 vector, keeping the graph (a fit's loss terms)."""
    return {metric.name: _scores(metric, results["values"][metric.of].float(), results["placed"][metric.of],
                                 results["eligible"][metric.name])[1]
            for metric in step.metrics}


# ---------------------------------------------------------------- fit and weights steps (SPEC.md §9)


def fit_step(engine, step, live: dict, batch_size: Optional[int] = None) -> dict:
    """A fit: every update an observe pass with gradient, the eval pass after each epoch (fit.train).
    Returns the curves and the last eval pass's results."""
    metric, mode, patience = step.early_stop
    settings = fit.Settings(params=step.params, objective=step.objective, epochs=len(step.updates), lr=step.lr,
                            weight_decay=step.weight_decay, anneal=step.anneal, early_stop=metric, mode=mode,
                            patience=patience)
    last: dict = {}

    def update(plan):
        return lambda: metric_vectors(plan, run_step(engine, plan, batch_size, live=live, grad=True))

    def evaluate():
        last["results"] = run_step(engine, step.evaluation, batch_size, live=live)
        return metric_vectors(step.evaluation, last["results"])
    with engine.frozen():  # the model is not trained: only the featurizers' leaves get a gradient (E8)
        curves = fit.train(live, settings, [[update(p) for p in epoch] for epoch in step.updates], evaluate)
    return {"curves": curves, "evaluation": last["results"]}


def _leaf_step(engine, step, live: dict, leaf: Plan, batch_size, bar, memo=None,
               published: Optional[dict] = None) -> list[tuple[str, Any]]:
    """Run one step of a leaf; returns its files in write order as (file_path, content): a metric table
    (a list), or (tensors, metadata) for a .safetensors file. An observe step's outputs join `published`."""
    if step.kind == "weights":
        stamps = {f.name: dict(f.stamp) for f in leaf.featurizers}
        return [(path, ({"weight": live[name].tensors()["weight"]}, stamps[name])) for name, path in step.saves]
    if step.kind == "fit":
        results = fit_step(engine, step, live, batch_size)
        files: list[tuple[str, Any]] = [(path, ({"weight": results["curves"][name]}, {})) for name, path in step.saves]
        return files + [(path, metric_table(step.evaluation, results["evaluation"], name, leaf.digest))
                        for name, path in step.evaluation.saves]
    results = run_step(engine, step, batch_size, bar, live=live, memo=memo, published=published, lean=True)
    if step.publishes and published is not None:
        published.update(results["outputs"])
    return [(path, _saved(step, results, name, leaf.digest)) for name, path in step.saves]


def _every_save(step) -> tuple:
    """A step's files: its own saves, then (a fit) its eval pass's."""
    evaluation = getattr(step, "evaluation", None)
    return tuple(step.saves) + (tuple(evaluation.saves) if evaluation is not None else ())


def metric_table(step: ObservePlan, results: dict, name: str, digest: str) -> list[dict]:
    """The saved table: every row of the step's base data, excluded rows included, in row order."""
    metric = next(m for m in step.metrics if m.name == name)
    where = results["positions"].get(metric.of)
    rows = []
    for r, example_id in enumerate(step.example_ids):
        rows.append({
            "example_id": example_id,
            "metric": name,
            "value": results["scores"][name][r],
            "eligible": results["eligible"][name][r],
            "positions": list(where["rows"][r]) if step.dynamic else None,
            "reason": where["reason"][r] if step.dynamic else "",
            "tokens": where["tokens"][r] if step.dynamic else "",
            "unit": metric.unit,
            "estimand_version": metric.estimand_version,
            "produced_by": digest,
        })
    return rows


def execute(plan: Plan, engine, out: Path, batch_size: Optional[int] = None, replace: bool = False,
            progress: bool = True) -> list[str]:
    """Run every leaf of the plan and hand its tables to the results folder; returns the written
    paths in write order (results.py writes them, and moves the folder into place at the end)."""
    started = time.perf_counter()
    given, batch_size = batch_size, batch_size or plan.window or None  # --batch-size wins (SPEC.md Q11)
    leaves = plan.leaves()
    with results.Folder(out, replace) as folder:
        # Every destination is checked before any forward runs (SPEC.md R12).
        for leaf in leaves:
            if leaf.label:
                folder.confine(leaf.label, f"sweep point '{leaf.label}'")
            for step in leaf.steps:
                for k, (_value, file_path) in enumerate(_every_save(step)):
                    folder.confine(_within(leaf.label, file_path), f"steps.{step.name}.saves.{k}.file_path")
        passes = sum(-(-len(step.example_ids) // (batch_size or len(step.example_ids) or 1))
                     for leaf in leaves for step in leaf.steps if isinstance(step, ObservePlan))
        bar = results.progress(passes, progress, "run")
        memo = share.Memo(plan)
        try:
            folder.write("document.json", plan.raw)
            for leaf in leaves:
                if leaf.label:
                    folder.write(_within(leaf.label, "document.json"), leaf.raw)
                live = kinds.build(leaf.featurizers)
                published: dict = {}  # each sweep point has its own (SPEC.md M13)
                for step in leaf.steps:
                    for file_path, content in _leaf_step(engine, step, live, leaf, batch_size, bar, memo,
                                                         published):
                        where, path = _within(leaf.label, file_path), f"steps.{step.name}.saves"
                        if isinstance(content, tuple):
                            folder.write_bytes(where, bundles.encode(*content), path=path)
                        else:
                            folder.write(where, content, path=path)
            record = engine.run_record(given) | {"rows_per_pass": batch_size, "causalab_ref": results.package_digest(),
                                                      "versions": results.versions()}
            record["dtype"] = record.get("served_dtype") or record.get("model", {}).get("dtype")
            record["wall_seconds"] = round(time.perf_counter() - started, 3)
            folder.write("run.json", record, at=1)
        finally:
            if bar is not None:
                bar.close()
        return folder.commit()


def _saved(step: ObservePlan, outcome: dict, value: str, digest: str):
    """One save's content: a metric's table, or (tensors, metadata) for an output or `<model>.generated`
    (one tensor `weight`; an output stamped, generated ids not; SPEC.md M20)."""
    if any(m.name == value for m in step.metrics):
        return metric_table(step, outcome, value, digest)
    if value in outcome["outputs"]:
        return {"weight": outcome["outputs"][value].value}, dict(dict(step.stamps)[value])
    return {"weight": outcome["values"][value]}, {}


def _within(label: str, file_path: str) -> str:
    """A file's name inside the results folder: under its sweep point's folder, if it has one."""
    return f"{label}/{file_path}" if label else file_path
