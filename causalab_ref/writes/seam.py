"""The write seam: what happens to the tensor at one address, the same for every engine.

An engine reaches the tensor at an address (an nnsight envoy, a torch hook) and hands
it here with the actions that fire there, in order; `apply` returns the tensor to put
back and the reads taken. Each write is (SPEC.md E3):

    x  = gather(T, selection)
    f, err = featurizer.featurize(x)          (identity: x, None)
    f' = mechanism(f, operand, params, context)   (mechanisms.TABLE)
    x' = featurizer.inverse(f', err, x)       (identity: f')
    T  = scatter(T, selection, x')

under disabled autocast; each read is the gathered value after all of the tap's writes,
detached, and copied where it is a view of a tensor the forward may still change (`read`).
The decode's per-step placement (`at_step`) and the collection of
per-step reads (`Reads`) are here too, since both engines decode the same way.
SPEC.md §12 How it is built.

Shapes as in select.py: T is the tensor at the address as the model holds it; a gathered x is
(N, W, F') for a rectangular selection or (P, F') for a ragged one; f is x in the featurizer's
k features, (..., k).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import torch

from ..locations import address, select
from ..featurizers import kinds
from . import mechanisms
from ..shapes import Action, Refusal


IDENTITY = kinds.Identity()  # an action with no featurizer is in the site's own space


def _refuse(message: str, path: str):
    raise Refusal(message, path=path, stage="run")


def operand_for(action: Action, f: torch.Tensor):
    """The operand a mechanism sees: a tensor that broadcasts to f's shape (or, with `features`, as many as
    they name) on f's device, a number as a 0-d float32 tensor (it broadcasts), or None."""
    tap, operand = action.tap, action.operand
    if operand is None:
        return None
    if not isinstance(operand, torch.Tensor):
        return torch.tensor(float(operand))
    features = getattr(tap, "features", None)
    if features is not None and operand.shape == f.shape[:-1] + (len(features),):
        return operand.to(f.device)
    try:  # the operand's own shape, or one that broadcasts to it (a mean lands on every row, SPEC.md M11, M14)
        fits = operand.shape == f.shape or torch.broadcast_shapes(operand.shape, f.shape) == f.shape
    except RuntimeError:
        fits = False
    if not fits:
        _refuse(f"write '{tap.name}' lands {tuple(f.shape)} values but its operand '{tap.operand}' holds "
                f"{tuple(operand.shape)}; the site and the operand's site must have the same width",
                f"writes.{tap.name}")
    return operand.to(f.device)


def write(current: torch.Tensor, action: Action, arrived: torch.Tensor, step: int = 0) -> torch.Tensor:
    """One write at a tap: gather -> featurize -> mechanism -> inverse -> scatter. `arrived` is the tensor
    as it came to the tap, before its first write (renormalize's f0)."""
    tap = action.tap
    row = mechanisms.lookup(tap.mechanism, f"writes.{tap.name}")
    featurizer = action.featurizer or IDENTITY
    x = select.gather(current, action.selection, dense=True)  # (N, W, F') or (P, F'); Q13's view serves bare reads
    features, params = getattr(tap, "features", None), row.params(tap.params)
    with torch.autocast(device_type=x.device.type, enabled=False):
        f, err = featurizer.featurize(x)  # (..., F') -> (..., k)
        feature_index = None if features is None else torch.tensor(features)
        context = mechanisms.Context(f0=lambda: kinds.take_features(
            featurizer.featurize(select.gather(arrived, action.selection, dense=True))[0], f.shape[-1], feature_index),
            step=step, draw_offset=action.draw_offset)
        f_new = kinds.change_features(f, features, lambda part, o: row.formula(part, o, params, context),
                                      operand_for(action, f))
        x_new = featurizer.inverse(f_new, err, x)  # (..., k) -> (..., F'), x's shape
    return select.scatter(current, action.selection, x_new)  # T's shape, x_new at the selection


def read(current: torch.Tensor, action: Action, grad: bool = False) -> torch.Tensor:
    """One read at a tap: the gathered value (through the read's featurizer, autocast off); detached unless
    the pass keeps a graph for a fit (`grad`). It is copied where it is a view of a tensor the forward may
    still change, and not where it is its own (a gather that made a new tensor) or the whole of the head's
    output (`address.HEAD`): the last tensor a forward computes, which no write changes in place (SPEC.md Q13)."""
    value = select.gather(current, action.selection, dense=action.featurizer is not None)  # (N, W, F') or (P, F')
    if action.featurizer is not None:
        value = kinds.read(action.featurizer, value)  # (..., k)
    whole_head = action.address.component in address.HEAD and value.numel() == current.numel()
    if _aliases(value, current) and not whole_head:
        value = value.clone()
    return value if grad else value.detach()


def _aliases(value: torch.Tensor, tensor: torch.Tensor) -> bool:
    """Whether `value` lies in `tensor`'s memory (a view of it, not a copy)."""
    return value.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()


@dataclass
class Applied:
    """What `apply` returns: the tensor to put back, whether any write changed it, the reads taken."""

    value: torch.Tensor
    changed: bool
    reads: list[tuple[Action, torch.Tensor]] = field(default_factory=list)


def apply(current: torch.Tensor, actions, step: int = 0, grad: bool = False) -> Applied:
    """Every action at one address, in the order given (writes before reads, R4)."""
    out = Applied(current, False)
    for action in actions:
        if action.tap.kind == "write":
            out.value = write(out.value, action, current, step)
            out.changed = True
        else:
            out.reads.append((action, read(out.value, action, grad)))
    return out


def by_address(actions) -> Iterator[tuple[Any, list[Action]]]:
    """Consecutive actions at one address, with the address: the unit an engine reaches once."""
    same: list[Action] = []
    for action in actions:
        if same and _key(same[0]) != _key(action):
            yield same[0].address, same
            same = []
        same.append(action)
    if same:
        yield same[0].address, same


def _key(action: Action):
    a = action.address
    return (a.component, a.layer)


# ---------------------------------------------------------------- the decode, per step


def at_step(action: Action, here: int, length: int) -> Action:
    """An action placed on the tensor one decode step computes: a continuation tap at the one
    position the step computes (the last), a prompt tap (step 0) right-aligned on `here` positions."""
    selection = action.selection
    if action.tap.pos.frame == "generated":
        windows = tuple((here - 1,) for _ in selection.windows)
        return replace(action, selection=replace(selection, windows=windows, ragged=False))
    return replace(action, selection=right_aligned(action, here, length))


def right_aligned(action: Action, have: int, length: int):
    """A prompt position at step 0 of a decode, where a tensor may hold only the last positions.

    During generation the head is computed at the last prompt position only; a window
    that asks for an earlier one is refused rather than read from a neighbour. The refusal's
    path is the tap's, relative to its intervention (the tap does not know which one).
    """
    tap, selection = action.tap, action.selection
    if have == length:
        return selection
    shift = length - have
    if any(p < shift for window in selection.windows for p in window):
        _refuse(f"{tap.kind} '{tap.name}' at {tap.address.label()}: during a decode the model computes this "
                f"tensor at the last {have} prompt position(s) only, and {tap.pos.spelling()} asks for an "
                "earlier one. Read it at -1, or in an intervention without decode", f"{tap.kind}s.{tap.name}.pos")
    # positions 0..length-1 of the prompt renumbered onto the last `have` the tensor holds
    return replace(selection, windows=tuple(tuple(p - shift for p in w) for w in selection.windows))


def firing(actions, step: int) -> list[Action]:
    """The actions that fire at decode step `step`."""
    return [a for a in actions if step in a.steps]


class Reads:
    """The reads of one forward (or of every step of a decode), collected in order."""

    def __init__(self, actions):
        self.actions = [a for a in actions if a.tap.kind == "read"]
        self.kept: dict[str, list] = {a.name: [] for a in self.actions}

    def keep(self, applied: Applied, keep: Callable = lambda v: v) -> None:
        """Keep an `Applied`'s reads (`keep` wraps each value, e.g. nnsight's `.save()`)."""
        for action, value in applied.reads:
            self.kept[action.name].append(keep(value))

    def result(self, viewed: Callable, unwrap: Callable = lambda v: v, grad: bool = False) -> dict[str, torch.Tensor]:
        """Each read's value on the CPU, its view applied: a stacked read's steps concatenated (rows, steps, F),
        any other read as its one firing gathered it. Detached unless a fit keeps the graph (`grad`)."""
        out = {}
        for action in self.actions:
            parts = [(unwrap(v) if grad else unwrap(v).detach()).cpu() for v in self.kept[action.name]]
            if not parts:
                continue
            value = torch.cat(parts, dim=1) if action.tap.stacked else parts[0]  # steps x (N, 1, F) -> (N, steps, F)
            out[action.name] = viewed(value, action.tap.view)
        return out
