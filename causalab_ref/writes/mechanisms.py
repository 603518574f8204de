"""Mechanisms: the table of what a write does to the values it lands on (plain data).

A row names a mechanism and holds its formula, whether it takes an operand, and its
params. The write seam looks the write's mechanism up here and calls

    formula(f, operand, params, context) -> f'

with `f` the gathered, featurized current value (`(rows, w, width)` or flat
`(total, width)`), `operand` the resolved operand (a tensor broadcastable to `f`, a 0-d
float32 tensor for a number, or None), `params` the write's params over the row's
defaults, and `context` what only the seam knows at that tap (`Context`). Validation
calls `check` on each write of a document (params by name both ways, the reference's
refusal texts). Adding a mechanism is adding a row to TABLE. SPEC.md §8 Mechanisms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

from typing import TYPE_CHECKING

from ..shapes import Lazy

if TYPE_CHECKING:
    import torch
else:
    torch = Lazy("torch")  # imported when a tensor is first made, not when a document is validated (Q17)

from ..shapes import Refusal

SEED_RANGE = (-(2 ** 63), 2 ** 64 - 1)  # what torch.Generator.manual_seed accepts
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max, written out so validation imports no torch (Q17)
NORM_FLOOR = 1e-12


def _no_f0() -> torch.Tensor:
    raise RuntimeError("this tap's seam supplies no pre-write value")


@dataclass(frozen=True)
class Context:
    """What the seam knows at one tap besides the value and the operand.

    `f0()` is the tap's value as it arrived, before this tap's first write, gathered over
    the same selection and featurized by the write's own featurizer (renormalize's f0,
    SPEC.md M6); it is computed only when asked. `step` is the decode step
    (0 for the prompt's own forward). `draw_offset` is (offset, total) of `f`'s leading axis within
    the whole pass over the step's rows (rows when rectangular, positions when flat), so a
    row's gaussian noise does not depend on --batch-size; None means `f` is the whole pass."""

    f0: Callable[[], torch.Tensor] = _no_f0
    step: int = 0
    draw_offset: Optional[tuple[int, int]] = None


def swap(f, o, params, context):
    """f' = o, in f's dtype, broadcast over f (a number lands everywhere)."""
    return o.to(f.dtype).expand_as(f)


def add_scaled(f, o, params, context):
    """f' = f + scale·o."""
    return f + params["scale"] * o


def lerp(f, o, params, context):
    """f' = (1 − t)·f + t·o."""
    t = params["t"]
    return (1 - t) * f + t * o


def noise(shape: tuple, seed: int, draw_offset: Optional[tuple[int, int]] = None) -> torch.Tensor:
    """The gaussian draw: `torch.randn` from a new CPU generator seeded with `seed`, float32, in the
    whole pass's shape (`draw_offset` = (offset, total) of the leading axis), narrowed to this chunk's part."""
    offset, total = draw_offset if draw_offset is not None else (0, shape[0])
    draw = torch.randn((total, *shape[1:]), generator=torch.Generator().manual_seed(seed))
    return draw[offset:offset + shape[0]]


def gaussian(f, o, params, context):
    """f' = f + scale·ε, ε the seed's draw (`noise`) moved to f's dtype and device."""
    return f + params["scale"] * noise(tuple(f.shape), int(params["seed"]), context.draw_offset).to(f)


def clamp(f, o, params, context):
    """f' = min(max(f, lo), hi); a missing bound is no bound."""
    return torch.clamp(f, min=params.get("lo"), max=params.get("hi"))


def renormalize(f, o, params, context):
    """f' = f·‖f0‖ / max(‖f‖, 1e-12), L2 norms over the feature axis per row and position."""
    restored = torch.linalg.vector_norm(context.f0().to(f), dim=-1, keepdim=True)
    return f * restored / torch.clamp(torch.linalg.vector_norm(f, dim=-1, keepdim=True), min=NORM_FLOOR)


@dataclass(frozen=True)
class Mechanism:
    """One row: `formula(f, operand, params, context) -> f'`; `operand` says whether the mechanism takes one;
    `required` are the params a write must give, `optional` the others with their defaults (None: no default)."""

    name: str
    formula: Callable[[torch.Tensor, Optional[torch.Tensor], dict, Context], torch.Tensor]
    operand: bool
    required: tuple[str, ...] = ()
    optional: tuple[tuple[str, Optional[float]], ...] = ()

    def params(self, given) -> dict:
        """The write's params over this row's defaults."""
        return {**{k: v for k, v in self.optional if v is not None}, **dict(given or ())}


TABLE: dict[str, Mechanism] = {m.name: m for m in (
    Mechanism("swap", swap, operand=True),
    Mechanism("add_scaled", add_scaled, operand=True, optional=(("scale", 1.0),)),
    Mechanism("lerp", lerp, operand=True, required=("t",)),
    Mechanism("gaussian", gaussian, operand=False, required=("seed",), optional=(("scale", 1.0),)),
    Mechanism("clamp", clamp, operand=False, optional=(("lo", None), ("hi", None))),
    Mechanism("renormalize", renormalize, operand=False),
)}


def lookup(name: str, path: str) -> Mechanism:
    """The table's row for `name`; a name the table lacks is refused at run (`path` is the write's)."""
    if name not in TABLE:
        raise Refusal(f"mechanism '{name}' is not implemented", path=f"{path}.mechanism", stage="run")
    return TABLE[name]


def describe() -> dict[str, str]:
    """Each mechanism as `vocab` prints it: its operand and params, required ones bare, optional ones with
    their default (clamp's bounds optional, at least one)."""
    out = {}
    for name, row in TABLE.items():
        args = (["operand"] if row.operand else []) + list(row.required) \
            + [k if v is None else f"{k}={v}" for k, v in row.optional]
        out[name] = f"{name}({', '.join(args)})"
    return out


def check(mechanism: str, has_operand: bool, params: dict, path: str) -> None:
    """A write's mechanism, operand and params, checked by name both ways in the reference's order
    (language reference §2.2); then each param a finite number, within float32's range but for gaussian's
    seed, which is an integer a generator takes; clamp's lo at most its hi (SPEC.md S50)."""
    row = TABLE[mechanism]
    missing = sorted(set(row.required) - set(params))
    if missing:
        _fail(f"{path}.params", f"mechanism '{mechanism}' needs params {missing}")
    extra = sorted(set(params) - set(row.required) - {k for k, _ in row.optional})
    if extra:
        _fail(f"{path}.params", f"mechanism '{mechanism}' takes no params {extra}")
    if has_operand and not row.operand:
        _fail(f"{path}.operand", f"mechanism '{mechanism}' takes no operand")
    if not has_operand and row.operand:
        _fail(f"{path}.operand", f"mechanism '{mechanism}' needs an operand")
    if mechanism == "clamp" and not params:
        _fail(f"{path}.params", "mechanism 'clamp' needs a bound: params lo, hi or both")
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
            _fail(f"{path}.params.{key}", f"mechanism '{mechanism}': param '{key}' is a finite number, "
                                          f"got {value!r:.40}")
        if key != "seed" and abs(value) > FLOAT32_MAX:
            _fail(f"{path}.params.{key}", f"mechanism '{mechanism}': param '{key}' is {value!r:.40}, past float32's "
                                          f"range (|x| <= {FLOAT32_MAX:.6g}), the values it acts on")
    if mechanism == "clamp" and "lo" in params and "hi" in params and params["lo"] > params["hi"]:
        _fail(f"{path}.params", f"mechanism 'clamp': lo {params['lo']!r} is above hi {params['hi']!r}, so no value "
                                "lies between them; write lo <= hi")
    if mechanism == "gaussian" and (params["seed"] != int(params["seed"])
                                    or not SEED_RANGE[0] <= int(params["seed"]) <= SEED_RANGE[1]):
        _fail(f"{path}.params.seed", f"mechanism 'gaussian': seed {params['seed']!r} is not an integer a torch "
                                     f"generator takes; write a whole number in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]")


def _finite(value) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past a float
        return False


def _fail(path: str, message: str):
    raise Refusal(message, path=path, stage="validation")
