"""Mechanisms: the table of what a write does to the values it lands on (plain data).

A row names a mechanism and holds its formula, whether it takes an operand, and its
params. The write seam (seam.py) looks the write's mechanism up here and calls

    formula(f, operand, params, context) -> f'

with `f` the gathered, featurized current value (`(rows, w, width)` or flat
`(total, width)`), `operand` the resolved operand (a tensor of `f`'s shape, a 0-d
float32 tensor for a number, or None), `params` the write's params over the row's
defaults, and `context` what only the seam knows at that tap (`Context`: the
pre-write value for renormalize's `f0`, the decode step). Adding a mechanism is
adding a row to TABLE; both engines land every write through the same seam.
SPEC.md §8 Mechanisms, §12 How it is built (E-rules).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .shapes import Refusal


@dataclass(frozen=True)
class Context:
    """What the seam knows at one tap besides the value and the operand.

    `f0()` is the tap's value as it arrived, before this tap's first write, gathered over
    the same selection and featurized by the write's own featurizer (renormalize's f0,
    language-reference §2.7); it is computed only when asked. `step` is the decode step
    (0 for the prompt's own forward)."""

    f0: Callable[[], torch.Tensor]
    step: int = 0


@dataclass(frozen=True)
class Mechanism:
    """One row: `formula(f, operand, params, context) -> f'`; `operand` says whether the mechanism takes one;
    `required` are the params a write must give, `optional` the others with their defaults."""

    name: str
    formula: Callable[[torch.Tensor, Optional[torch.Tensor], dict, Context], torch.Tensor]
    operand: bool
    required: tuple[str, ...] = ()
    optional: tuple[tuple[str, float], ...] = ()

    def params(self, given) -> dict:
        """The write's params over this row's defaults."""
        return {**dict(self.optional), **dict(given or ())}


def _swap(f: torch.Tensor, operand: Optional[torch.Tensor], params: dict, context: Context) -> torch.Tensor:
    """f' = o: the operand in f's dtype, broadcast over f (a number lands everywhere)."""
    assert operand is not None
    return operand.to(f.dtype).expand_as(f)


TABLE: dict[str, Mechanism] = {
    "swap": Mechanism(name="swap", formula=_swap, operand=True),
}


def lookup(name: str, path: str) -> Mechanism:
    """The table's row for `name`; a name the table lacks is refused at run (`path` is the write's)."""
    if name not in TABLE:
        raise Refusal(f"mechanism '{name}' is not implemented", path=f"{path}.mechanism", stage="run")
    return TABLE[name]
