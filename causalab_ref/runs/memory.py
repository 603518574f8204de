"""Memory: what one pass of a plan holds at once, the budget it must fit, and the rows per pass that fit it.

A pass's estimate is linear in its rows: each row costs, in bytes, the largest working set of one of its
forwards plus every read the pass keeps for that row (SPEC.md Q10). Compile divides the budget
(`--memory-budget`, default 1 GiB) by the costliest pass's per-row cost to get the rows per pass the run uses
when `--batch-size` is not given (Q11), and refuses a pass one row of which does not fit (Q12). Nothing here
runs a model: it reads the plan, the config and the rows' masks.
"""
from __future__ import annotations

import math
import re
from typing import Optional

from ..locations import address
from ..positions import resolve
from .plan import Forward, ObservePlan, Tap, frame_key
from ..shapes import Refusal

DEFAULT_BUDGET = 1 << 30  # 1 GiB
BYTE_SIZES = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
MIB = 1 << 20


def parse_budget(text: Optional[str]) -> int:
    """`--memory-budget`: a number of bytes, or a number followed by KiB, MiB or GiB (None: the default)."""
    if text is None:
        return DEFAULT_BUDGET
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB)?\s*", str(text))
    size = float(match.group(1)) * BYTE_SIZES[match.group(2) or ""] if match else 0.0
    if not 1 <= size < math.inf:  # 400 digits read as a float are infinite, which no int is (SPEC.md S47)
        raise Refusal(f"--memory-budget '{text}' is not a size; write a number of bytes, or a number with KiB, "
                      "MiB or GiB (the default is 1GiB)", path="--memory-budget", stage="validation")
    return int(size)


def _config(engine, *names: str, default: int = 0) -> int:
    config = getattr(engine.config, "get_text_config", lambda: engine.config)()
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return default


def _positions(tap: Tap, forward: Forward, frame) -> int:
    """Positions per row a prompt tap takes, at most: exact for an unanchored cut (resolved on the rows'
    masks), the whole padded width for an anchored one; a continuation read holds one per decode step."""
    length = len(forward.ids[0])
    if tap.pos.frame == "generated":
        return max(tap.stacked, 1)
    if tap.pos.scope is not None:
        return length
    windows, _reasons = resolve.resolve(frame, tap.pos, tap.anchors)
    return max((len(w) for w in windows), default=0)


def _head_positions(taps: list[Tap], forward: Forward, frame) -> int:
    """How many positions the head computes in this forward (SPEC.md Q8): the union of its taps' windows."""
    if forward.decode:
        return 1 if taps else 0  # transformers' generate keeps the last position per step (Q9)
    if any(t.pos.scope is not None for t in taps):
        return len(forward.ids[0])
    return len({p for t in taps for w in resolve.resolve(frame, t.pos, t.anchors)[0] for p in w})


def _width(engine, tap: Tap, length: int) -> int:
    """Features per position a read keeps: the vocabulary for a logits view, the attention pattern's heads x
    keys where the site has no fixed width, else the site's width narrowed by heads or units."""
    if tap.view == "logits":
        return _config(engine, "vocab_size")
    width = tap.width  # None exactly when the address has no width
    if width is None:
        return _config(engine, "num_attention_heads", "n_head", default=1) * length
    return width


def forward_cost(engine, forward: Forward, frame=None) -> tuple[int, int, str]:
    """(working set, kept reads, how) in bytes per row for one forward (SPEC.md Q10); `frame` is the forward's
    frame when compile has built it (its content ranges are what is read here), else the ranges are built."""
    if frame is None:
        frame = resolve.frame_of_ids(engine.tokenizer, forward.ids, forward.mask, segments=forward.segments,
                                    char_map=False)
    length, b = len(forward.ids[0]), 2 if engine.spec.dtype == "bf16" else 4
    hidden, vocab = _config(engine, "hidden_size", "n_embd"), _config(engine, "vocab_size")
    inner = _config(engine, "intermediate_size", "n_inner", default=4 * hidden)
    heads = _config(engine, "num_attention_heads", "n_head", default=1)
    head_positions = _head_positions([t for t in forward.taps if t.address.component in address.HEAD], forward, frame)
    work = b * (2 * head_positions * vocab + length * (4 * hidden + 3 * inner) + heads * length * length)
    if forward.decode:
        kv = _config(engine, "num_key_value_heads", default=heads) * _config(
            engine, "head_dim", default=hidden // max(heads, 1))
        work += b * 2 * engine.num_layers * kv * (length + forward.decode)
    kept = sum(4 * _positions(t, forward, frame) * _width(engine, t, length) for t in forward.taps
               if t.kind == "read")
    how = (f"forward '{forward.model}' on '{forward.input}' ({length} tokens): the head at {head_positions} "
           f"position(s) x {vocab} logits, activations and the attention pattern {work // 1024} KiB, reads kept "
           f"{kept // 1024} KiB")
    return work, kept, how


def pass_cost(engine, step: ObservePlan, frames: Optional[dict] = None) -> tuple[int, str]:
    """(bytes per row, the costliest forward described) of one observe pass: the largest working set of its
    forwards plus every read it keeps (reads accumulate over the pass; working sets do not). `frames` holds
    the frames compile built, by `plan.frame_key` (SPEC.md Q37)."""
    frames = frames or {}
    costs = [forward_cost(engine, f, frames.get(frame_key(f, step.dynamic))) for f in step.forwards]
    if not costs:
        return 0, ""
    work, _kept, how = max(costs, key=lambda c: c[0] + c[1])
    return max(c[0] for c in costs) + sum(c[1] for c in costs), how


def rows_per_pass(engine, passes: list, budget: int, path: str, frames: Optional[dict] = None) -> int:
    """The most rows each of `passes` (one document step's) can run at once within `budget` bytes (0: no
    bound); a pass one row of which does not fit is refused at `path` (SPEC.md Q11, Q12). `frames` as for
    `pass_cost`."""
    most = 0
    for step in passes:
        bytes_per_row, how = pass_cost(engine, step, frames)
        if bytes_per_row > budget:
            raise Refusal(f"step '{path.split('.')[1]}': one row of this pass needs about {bytes_per_row} bytes "
                          f"({bytes_per_row / MIB:.1f} MiB; {how}), above the memory budget of {budget} bytes "
                          f"({budget / MIB:.1f} MiB); raise --memory-budget, read fewer positions or a narrower "
                          "site, or use shorter rows", path=path, stage="compile")
        if bytes_per_row:
            most = budget // bytes_per_row if not most else min(most, budget // bytes_per_row)
    return most
