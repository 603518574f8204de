"""Decode: a forward that generates, its taps on the prompt and on the continuation, and the stacked reads cut
afterwards.

Prompt taps act at step 0 over their windows; continuation taps at the decode steps they name, on the
one position each step computes. After the decode the generated ids are a frame of their own (each row's
ids end at its first stop token), against which continuation reads are placed and a stacked read is cut
(SPEC.md §2 Positions, P54; §11 Q13). The pass loop (passes.py) hands a decoding forward here:

    resolved, read = decode_forward(p, forward, resolved, values, placed)
    read[f"{forward.model}.generated"]   # (rows, decode) token ids
"""
from __future__ import annotations

import torch

from ..positions import resolve
from .placement import Pass, Resolved, fixed_operand, operand_value, place, selection_of
from .plan import Forward, Tap
from ..shapes import Action, Batch, Refusal, Selection

PAST_STOP = "past_stop"  # a continuation write's reason on a row that stopped before some of its steps


def decode_forward(p: Pass, forward: Forward, resolved: dict, values: dict, placed: dict):
    """A forward that decodes: prompt taps at step 0, continuation taps at their steps, then the stacked
    reads cut.

    A stacked read comes back (rows, steps, features) and is cut per row against the
    continuation frame (each row's generated ids up to its first stop token) afterwards.
    """
    rows = len(forward.ids)
    batch = Batch(ids=forward.ids, mask=forward.mask, decode=forward.decode,
                  actions=_decode_actions(p, forward, resolved, values, placed))
    read, generated = p.on_engine(lambda: p.engine.generate(batch))
    frame = resolve.frame_of_continuation(p.engine.tokenizer, generated, p.engine.stop_ids())
    continuation = [t for t in forward.taps if t.pos.frame == "generated"]
    after = place(frame, [t for t in continuation if t.kind == "read"], True, p.path, p.lo)
    for tap in continuation:
        if tap.kind == "write":
            after[tap.name] = continuation_write(frame, steps_of(tap, forward.decode), rows)
        elif tap.stacked:
            read[tap.name] = cut_stack(read[tap.name], after[tap.name].windows, tap.pos.uneven)
    resolved = {**resolved, **after}  # the continuation taps, placed on the frame the decode produced
    read[f"{forward.model}.generated"] = generated  # (rows, decode)
    return resolved, read


def steps_of(tap: Tap, decode: int) -> tuple[int, ...]:
    """The decode steps a tap fires at: 0 for the prompt frame, k for {"index": k}, all otherwise."""
    if tap.pos.frame == "prompt":
        return (0,)
    if not tap.stacked and tap.pos.index is not None:
        return (tap.pos.index,)
    return tuple(range(decode))


def _decode_actions(p: Pass, forward: Forward, resolved: dict, values: dict, placed: dict) -> tuple[Action, ...]:
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
            operand = (operand_value(p, tap, resolved, values, windows) if prompt
                       else _continuation_operand(p, tap, values, placed))
        actions.append(Action(tap=tap, selection=selection, operand=operand, steps=steps_of(tap, forward.decode),
                              featurizer=p.featurizers.get(tap.featurizer),
                              draw_offset=p.draw_offsets.get(tap.name)))
    return tuple(actions)


def continuation_write(frame, steps: tuple[int, ...], rows: int) -> Resolved:
    """A continuation write's provenance: its positions are the decode steps it fired at and its tokens what
    the model produced there. On a row whose continuation stopped before some of those steps the write still
    fired at them (the decode runs to its bound), on tokens the frame no longer holds: the tokens end at the
    stop and the reason is `past_stop` (SPEC.md P54)."""
    reasons, tokens = [], []
    for r in range(rows):
        inside = tuple(k for k in steps if k < frame.ends[r])
        reasons.append("" if len(inside) == len(steps) else PAST_STOP)
        tokens.append(resolve.tokens_of(frame, inside, r))
    return Resolved(windows=tuple(steps for _ in range(rows)), reasons=tuple(reasons), tokens=tuple(tokens))


def _continuation_operand(p: Pass, tap: Tap, values: dict, placed: dict):
    """A continuation write lands a fixed operand, or a read of width 1 on every row, at each step it
    fires at."""
    if not isinstance(tap.operand, str):
        return fixed_operand(tap, values)
    windows = placed[tap.operand].windows
    if any(len(w) != 1 for w in windows):
        raise Refusal(f"write '{tap.name}' lands one position per decode step, and its operand '{tap.operand}' was not "
                      f"read over one position on every row ({[len(w) for w in windows]})",
                      path=f"{p.path}.writes.{tap.name}", stage="run")
    value = values[tap.operand]
    return value if value.dim() == 3 else value.unsqueeze(1)  # (rows, F) -> (rows, 1, F)


def cut_stack(stack: torch.Tensor, windows, ragged: bool) -> torch.Tensor:
    """(rows, steps, F) cut by each row's window of steps (the read's position, resolved on the continuation
    frame, SPEC.md P40): flat (total, F) when ragged, else (rows, w, F). A cut that keeps every step of every
    row is the stack itself, reshaped (SPEC.md Q13)."""
    every = tuple(range(stack.shape[1]))
    if len(windows) == stack.shape[0] and all(tuple(w) == every for w in windows):
        return stack.reshape(-1, stack.shape[-1]) if ragged else stack  # (rows * steps, F) or (rows, steps, F)
    parts = [stack[r, list(w)] for r, w in enumerate(windows)]  # each (w_r, F)
    if ragged:
        return torch.cat(parts, dim=0) if parts else stack.new_zeros((0, stack.shape[-1]))  # (total, F)
    return torch.stack(parts, dim=0)  # (rows, w, F)
