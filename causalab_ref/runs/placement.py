"""Placement: where one pass's taps act on its rows, what its writes land, and the state the pass carries.

A `Pass` is one chunk of one observe step's rows with everything its forwards share (the engine, the
featurizers, the memo, the published values, whether gradients flow). Placing a forward resolves each
prompt-frame tap's positions against the model's tokenizer (resolve.py) and applies the refusals of
SPEC.md §2.9 Eligibility: a read may skip a row, a write may not, a fixed-width cut that does not fit is
refused. A write's operand is then a read of this pass (its windows checked row by row), a published
value, a number, or nothing. Compile places every step's prompt frame the same way first (`check_step`,
P58), so what the rows decide is refused before any weights load. The pass loop (passes.py) and the
decode (decode.py) call the rest:

    p = Pass(engine, step, path="interventions.patching")
    resolved = resolve_taps(p, step.forwards[0])           # {tap name: Resolved}
    selection = selection_of(tap, resolved[tap.name])      # what the engine is handed
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..positions import resolve
from . import share
from .plan import Forward, MetricPlan, ObservePlan, Tap, frame_key
from ..shapes import Ref, Refusal, Selection

FIXED_WIDTH = ("{kind} '{name}' at {spelling} has no position on row(s) {rows}. A position of a fixed width "
               "names the same number of tokens on every row, so a row it does not fit is refused rather than "
               "skipped; a position anchored to the row's own text may skip a row, and says why")
NOTHING_TO_WRITE = ("write '{name}' has nothing to write on row(s) {rows}. A read may skip a row; a write may "
                    "not — writing nothing somewhere is not an intervention, and the row would score as if one "
                    "had happened. {why}")
#: what each reason a write's row has nothing means, and what makes the row one (NOTHING_TO_WRITE's last words)
WHY_NOTHING = {
    "alignment_missing": "`alignment_missing` is an anchor the row's prompt does not hold (a variable's text it "
                         "does not contain, a turn it does not have): correct the row, or leave it out of the rows "
                         "the write runs on",
    "alignment_ambiguous": "`alignment_ambiguous` is a value that is in the prompt more than once, and scoping the "
                           "anchor is what makes it one",
    "out_of_range": "`out_of_range` is a cut past the end of the anchored text: a cut within the anchor's tokens "
                    "is what fits every row",
}
RAGGED_MISMATCH = ("write '{name}' covers {want} positions per row but its operand '{operand}' was read over "
                   "{have}; rows {rows} differ. Landing a window of one width in another is a policy this slice "
                   "does not implement — the protocol's `exact_length_buckets` and `padded_masked` — so it refuses")


def refuse(message: str, path: str, stage: str = "run"):
    raise Refusal(message, path=path, stage=stage)


@dataclass(frozen=True)
class Pass:
    """One chunk of one observe step's rows, and what every forward of it shares."""

    engine: Any
    step: ObservePlan  # the chunk's rows of the step (passes.chunk)
    path: str  # `interventions.<name>`: where a refusal points
    lo: int = 0  # the chunk's first row in the document's numbering (rows lo..hi, a --batch-size chunk)
    featurizers: dict = field(default_factory=dict)  # featurizer name -> the sweep point's built featurizer
    grad: bool = False  # a fit's update: keep the graph, share nothing
    memo: Optional[share.Memo] = None  # forwards other steps compute identically (share.py)
    refs: dict = field(default_factory=dict)  # this chunk's part of each published value a ref names
    draw_offsets: dict = field(default_factory=dict)  # each gaussian write's (offset, total) in the whole draw (M4)
    frames: dict = field(default_factory=dict)  # each role's frame, built once per pass (a cache)

    def on_engine(self, call):
        """An engine's refusal names a place relative to the intervention (`reads.<r>.pos`); give it the
        whole document path (`interventions.<i>.reads.<r>.pos`). Site paths are already whole."""
        try:
            return call()
        except Refusal as refusal:
            if refusal.path and not refusal.path.startswith(("sites.", "interventions.", "model.")):
                refusal.path = f"{self.path}.{refusal.path}"
            raise


@dataclass
class Resolved:
    """One tap's positions on this forward's rows."""

    windows: tuple[tuple[int, ...], ...]
    reasons: tuple[str, ...]
    tokens: tuple[str, ...]


def place(frame, taps, dynamic: bool, path: str, lo: int = 0, stage: str = "run") -> dict[str, Resolved]:
    """Every tap's windows on one frame, with the refusals of SPEC.md §2.9 Eligibility (at `stage`: compile
    places the prompt frame of every step before any weights load, check_step).

    `lo` is the frame's first row in the document's numbering (a --batch-size chunk's, as `Pass.lo`)."""
    out = {}
    for tap in taps:
        windows, reasons = resolve.resolve(frame, tap.pos, tap.anchors)
        tokens = tuple(resolve.tokens_of(frame, w, r) if dynamic else "" for r, w in enumerate(windows))
        bad = {r + lo: reason for r, reason in enumerate(reasons) if reason}
        pos_path = f"{path}.{tap.kind}s.{tap.name}.pos"
        if bad and not tap.pos.uneven:
            refuse(FIXED_WIDTH.format(kind=tap.kind, name=tap.name, spelling=tap.pos.spelling(), rows=bad), pos_path,
                   stage)
        if bad and tap.kind == "write":
            why = " ".join(WHY_NOTHING.get(reason, f"`{reason}`") for reason in sorted(set(bad.values())))
            refuse(NOTHING_TO_WRITE.format(name=tap.name, rows=bad, why=why), pos_path, stage)
        out[tap.name] = Resolved(windows=tuple(tuple(w) for w in windows), reasons=tuple(reasons), tokens=tokens)
    return out


def check_step(engine, step: ObservePlan, path: str, frames: dict) -> None:
    """What the run's placement refuses that the rows and the tokenizer decide, refused at compile with the
    run's own lines, so that validate and explain refuse what run would (SPEC.md P58): every row's ids within
    the embedding, every prompt-frame tap placed over the step's rows, each write fed by a read checked
    against the read's windows, each metric's rows. `frames` (compile's, by the run's key) keeps every frame
    built, for the run's memo to start from (share.Memo)."""
    tok, placed = engine.tokenizer, {}
    for forward in step.forwards:
        check_ids(tok, forward, engine.vocab_size)
        key = frame_key(forward, step.dynamic)
        if key not in frames:
            frames[key] = build_frame(tok, forward, step.dynamic)
        taps = [t for t in forward.taps if t.pos.frame == "prompt"]
        placed.update(place(frames[key], taps, False, path, stage="compile"))
        for tap in taps:
            if tap.kind == "write" and isinstance(tap.operand, str) and tap.operand in placed:
                check_operand_windows(tap, placed[tap.name].windows, placed[tap.operand].windows, path, 0, "compile")
    metrics = tuple(m for m in step.metrics if all(r in placed for r in m.reads))
    refuse_metrics_of_nothing(metrics, {m.name: eligible_rows(m, placed) for m in metrics}, path, "compile")


def check_ids(tok, forward: Forward, embedding_rows: int) -> None:
    """Every id a forward feeds the model has a row of its embedding (SPEC.md P59): a tokenizer with more
    ids than the model (an added special token) is refused at compile, not left to torch's index error."""
    bad = [r for r, row in enumerate(forward.ids) if max(row, default=0) >= embedding_rows]
    if bad:
        past = sorted({i for r in bad for i in forward.ids[r] if i >= embedding_rows})
        refuse(f"row(s) {bad[:8]} of '{forward.input}' hold token id(s) {past[:8]} "
               f"({', '.join(repr(tok.convert_ids_to_tokens(i)) for i in past[:3])}), and the model's embedding "
               f"has rows for ids 0-{embedding_rows - 1} only: the tokenizer has more ids than the model. Use the "
               "tokenizer the checkpoint was built with, or a checkpoint whose vocab_size covers the tokenizer",
               "model.key", "compile")


def eligible_rows(metric: MetricPlan, placed: dict, lo: int = 0) -> tuple[bool, ...]:
    """A metric's rows lo.. of a chunk: column-eligible and placed by its read, and by the read it compares
    with when it has one (`placed`: read name -> Resolved; SPEC.md P30, D25)."""
    reads = [placed[name].reasons for name in metric.reads]
    return tuple(col and not any(reasons) for col, *reasons in zip(metric.eligible[lo:lo + len(reads[0])], *reads))


def refuse_metrics_of_nothing(metrics: tuple[MetricPlan, ...], eligible: dict, path: str, stage: str = "run") -> None:
    """A metric no row of which is both column-eligible and placed by its read has no mean (SPEC.md P31)."""
    for metric in metrics:
        if not any(eligible[metric.name]):
            raise Refusal(f"metric '{metric.name}': no row is both column-eligible and placed by its read "
                          f"'{metric.of}'; a metric of nothing has no mean", path=f"{path}.metrics.{metric.name}",
                          stage=stage)


def build_frame(tok, forward: Forward, dynamic: bool):
    return resolve.frame_of_ids(tok, forward.ids, forward.mask, segments=forward.segments, char_map=dynamic)


def resolve_taps(p: Pass, forward: Forward) -> dict[str, Resolved]:
    """The prompt-frame taps of one forward, resolved against the model's tokenizer.

    `p.frames` caches each role's frame within a pass: two forwards on one role share their rows,
    so the character map (the expensive half) is built once; `p.memo` keeps the last few frames
    of the run for the sweep points on the same rows (SPEC.md Q15)."""
    step = p.step
    if forward.input not in p.frames:
        def build():
            return build_frame(p.engine.tokenizer, forward, step.dynamic)
        key = frame_key(forward, step.dynamic)
        p.frames[forward.input] = build() if p.memo is None else p.memo.frame(key, build)
    frame = p.frames[forward.input]
    return place(frame, [t for t in forward.taps if t.pos.frame == "prompt"], step.dynamic, p.path, p.lo)


def selection_of(tap: Tap, resolved: Resolved) -> Selection:
    return Selection(windows=resolved.windows, seq_axis=tap.address.seq_axis, ragged=tap.pos.ragged,
                     groups=tap.groups, take=tap.take)


def check_tokenizer(tok, forward: Forward, path: str) -> None:
    """The run's tokenizer must be the one that encoded the plan: row 0 decoded by both must agree.

    Decoded strings are compared, not re-encodings, because encode(decode(ids)) == ids is not a
    property tokenizers have (SPEC.md P52)."""
    here = tok.decode(list(forward.ids[0]), skip_special_tokens=False)
    if forward.check and here != forward.check:
        refuse(f"the tokenizer at run time decodes row 0 of forward '{forward.model}' on '{forward.input}' as "
               f"{here[:80]!r}, and the plan was encoded by one that decodes it as {forward.check[:80]!r}; "
               "compile and run against the same checkpoint's tokenizer", f"{path}")


# ---------------------------------------------------------------- what a write lands


def fixed_operand(tap: Tap, values: dict[str, torch.Tensor]) -> Any:
    """A write's operand that is not a read of this pass: nothing (None), a published value (`values`
    holds this chunk's part of it, checked at compile), or a number. Callers test `isinstance(tap.operand,
    str)` (a read) first."""
    if isinstance(tap.operand, Ref):
        return values[tap.operand.name]
    return None if tap.operand is None else float(tap.operand)


def operand_value(p: Pass, tap: Tap, resolved: dict[str, Resolved], values: dict[str, torch.Tensor],
                  read_windows: dict[str, tuple]):
    """What a prompt-frame write lands: a read of this intervention (windows checked row by row), or a
    fixed operand."""
    if not isinstance(tap.operand, str):
        return fixed_operand(tap, values)
    mine = resolved[tap.name].windows
    check_operand_windows(tap, mine, read_windows[tap.operand], p.path, p.lo)
    return in_layout(values[tap.operand], tap.pos.ragged, len(mine))


def check_operand_windows(tap: Tap, mine: tuple, theirs: tuple, path: str, lo: int = 0,
                          stage: str = "run") -> None:
    """A write fed by a read lands on each row as many positions as the read took there (SPEC.md P51)."""
    # Row by row whichever side is ragged: a bare write fed by an anchored read is refused here
    # when the read skipped a row, not later as a shape the engine cannot land.
    want = [len(w) for w in mine]
    have = [len(w) for w in theirs]
    rows = [r + lo for r, (a, b) in enumerate(zip(want, have)) if a != b]
    if rows or len(mine) != len(theirs):
        refuse(RAGGED_MISMATCH.format(name=tap.name, want=want, operand=tap.operand, have=have, rows=rows),
               f"{path}.writes.{tap.name}.pos", stage)


def in_layout(value: torch.Tensor, ragged: bool, rows: int) -> torch.Tensor:
    """An operand read in the other layout, per-row widths already equal: a rectangular read
    (rows, w, F) lands in a ragged write as (total, F), and a flat read in a rectangular write
    as (rows, w, F). Row order is the same in both, so this is a reshape (SPEC.md P48)."""
    if ragged and value.dim() == 3:
        return value.reshape(-1, value.shape[-1])  # (rows, w, F) -> (rows * w, F)
    if not ragged and value.dim() == 2 and rows and value.shape[0] % rows == 0:
        return value.reshape(rows, value.shape[0] // rows, value.shape[-1])  # (rows * w, F) -> (rows, w, F)
    return value
