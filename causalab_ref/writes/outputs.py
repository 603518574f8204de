"""Step outputs: the values a step publishes and later steps name as `{"ref": name}` operands.

Four moments, one module (SPEC.md §8.2): `declare` reads a step's `outputs` at validation;
`check_refs` holds the document's steps against each other (earlier step only, one publisher
per name, no read's name); `check_ref` is the compile check of a consuming write (its
`RefWrite`) against its output's `PublishedShape` (rows, pca, windows, width); `publish` reduces a
step's reads after its pass and `chunk` narrows an unreduced output to the rows of one
`--batch-size` chunk.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from typing import TYPE_CHECKING

from ..shapes import Lazy

if TYPE_CHECKING:
    import torch
else:
    torch = Lazy("torch")  # imported when a tensor is first made, not when a document is validated (Q17)

from ..shapes import Output, Ref, Refusal

REDUCE = ("none", "mean", "pca")


def _fail(path: str, message: str, stage: str = "validation"):
    raise Refusal(message, path=path, stage=stage)


# ---------------------------------------------------------------- validation


def declare(raw: Any, path: str, step: str, reads: set) -> tuple[tuple[str, Output], ...]:
    """A step's `outputs`: {name: {"read", "reduce", "k"} | "<read>"}, each keeping a read of the step."""
    if not isinstance(raw, dict):
        _fail(path, "expected an object of named outputs")
    out = []
    for name, spec in raw.items():
        entry_path = f"{path}.{name}"
        if isinstance(spec, str):
            spec = {"read": spec}
        if not isinstance(spec, dict):
            _fail(entry_path, "an output is a read's name or {\"read\", \"reduce\", \"k\"}")
        unknown = sorted(set(spec) - {"read", "reduce", "k"})
        if unknown:
            _fail(f"{entry_path}.{unknown[0]}", f"unknown key '{unknown[0]}'; allowed here: ['k', 'read', 'reduce']")
        read, reduce, k = spec.get("read"), spec.get("reduce", "none"), spec.get("k")
        if not isinstance(read, str):
            _fail(f"{entry_path}.read", "an output names the read it keeps")
        if reduce not in REDUCE:
            _fail(f"{entry_path}.reduce", f"'{reduce}' is not one of {list(REDUCE)}")
        if (k is not None) != (reduce == "pca") or (k is not None and (isinstance(k, bool) or not isinstance(k, int)
                                                                         or k <= 0)):
            _fail(f"{entry_path}.k", "`k` is for `reduce: pca`, and pca needs it")
        if read not in reads:
            _fail(f"{entry_path}.read", f"step '{step}': output '{name}' keeps read '{read}', which its intervention "
                                   "does not have")
        out.append((name, Output(read=read, reduce=reduce, k=k)))
    return tuple(out)


def check_refs(steps, interventions: dict) -> None:
    """Across the steps in order: each ref names an output of an earlier step that is visible (a step
    running several interventions publishes to itself only), one publisher per name, no read's name."""
    reads = {r for i in interventions.values() for r, _ in i.reads}
    visible: dict[str, str] = {}
    publisher: dict[str, str] = {}
    for step, observe in steps:
        for i in getattr(observe, "interventions", ()):
            for w, write in interventions[i].writes:
                if isinstance(write.operand, Ref) and write.operand.name not in visible:
                    _fail(f"interventions.{i}.writes.{w}.operand",
                          f"step '{step}': write '{w}' references '{write.operand.name}', which no earlier step "
                          f"outputs (published so far: {sorted(visible)})")
        for name, _output in getattr(observe, "outputs", ()):
            out_path = f"steps.{step}.outputs.{name}"
            if name in publisher:
                _fail(out_path, f"step '{step}': output '{name}' is already published by step '{publisher[name]}'")
            if name in reads:
                _fail(out_path, f"step '{step}': output '{name}' shares its name with a read; an operand names one "
                                "or the other")
            publisher[name] = step
            if len(observe.interventions) == 1:
                visible[name] = step


# ---------------------------------------------------------------- compile


@dataclass(frozen=True)
class PublishedShape:
    """What compile knows of a published output: its step, reduce, rows, positions per row and width."""

    step: str
    output: Output
    rows: int
    per_row: Optional[int]  # positions per row; None when ragged
    width: Optional[int]    # features per position


def check_pca(step: str, name: str, shape: PublishedShape, path: str) -> None:
    """A pca over a fixed-width read: centred, `vectors` vectors hold at most vectors - 1 independent directions."""
    if shape.output.reduce != "pca" or shape.per_row is None or shape.output.k is None:
        return
    vectors = shape.per_row * shape.rows
    if shape.output.k > vectors - 1:
        _fail(path, f"step '{step}': output '{name}' asks for {shape.output.k} principal directions of {vectors} "
                    f"vector(s); centered, they span at most {max(vectors - 1, 0)}. Harvest more rows, or more "
                    "positions per row", "compile")


@dataclass(frozen=True)
class RefWrite:
    """What compile knows of a write whose operand is a ref: its step and name, the rows the step runs
    over, the positions per row it covers (None: ragged) and the features per position it lands."""

    step: str
    write: str
    rows: int
    per_row: Optional[int]
    width: Optional[int]


def check_ref(ref_write: RefWrite, name: str, shape: PublishedShape, path: str) -> None:
    """A write's ref against the shape of what it names, in the reference's order: rows, pca, windows; then widths."""
    step, write, rows, want, width = ref_write.step, ref_write.write, ref_write.rows, ref_write.per_row, ref_write.width
    reduce = shape.output.reduce
    if reduce in ("none", "pca") and shape.rows != rows:
        _fail(path, f"step '{step}': write '{write}' swaps in '{name}', which has {shape.rows} rows, over {rows} "
                    "rows; reduce the output or run over the same rows", "compile")
    if reduce == "pca":
        _fail(path, f"step '{step}': write '{write}' names '{name}', a pca basis, as its operand; a basis is loaded "
                    "as a featurizer, not written at a site", "compile")
    if reduce == "mean":
        fits = shape.per_row is None or want == shape.per_row or (want is None and shape.per_row == 1)
    else:
        fits = shape.per_row is not None and want == shape.per_row
    if not fits:
        covers = want if want is not None else "a varying number of"
        over = shape.per_row if shape.per_row is not None else "a varying number of"
        _fail(path, f"step '{step}': write '{write}' covers {covers} position(s) but '{name}' was read over "
                    f"{over}{', unreduced' if reduce == 'none' else ''}; the windows must match, or reduce the "
                    "output", "compile")
    if width is not None and shape.width is not None and width != shape.width:
        _fail(path, f"step '{step}': write '{write}' lands {width} features per position, and '{name}' holds "
                    f"{shape.width} (read at step '{shape.step}'); a ref lands in a site of its own width",
              "compile")


# ---------------------------------------------------------------- run


@dataclass(frozen=True)
class Published:
    """A published value (detached, CPU) and, when unreduced, the per-row windows it was read over."""

    value: torch.Tensor
    reduce: str
    windows: Optional[tuple[tuple[int, ...], ...]] = None


def reduced(value: torch.Tensor, reduce: str, k: Optional[int], path: str) -> torch.Tensor:
    """mean over the leading axis (rows, or every (row, position) of a flat read); pca's (width, k) basis."""
    value = value.detach().cpu()
    if reduce == "mean":
        return value.mean(dim=0)
    if reduce == "none":
        return value
    flat = value.reshape(-1, value.shape[-1]).float()
    if k is None or not 0 < k <= min(flat.shape):
        _fail(path, f"k={k} principal directions of {tuple(flat.shape)} rows is not a basis", "run")
    _u, _s, vh = torch.linalg.svd(flat - flat.mean(dim=0, keepdim=True), full_matrices=False)
    return vh[:k].T.contiguous()


def publish(outputs, values: dict, windows: dict, path: str) -> dict[str, Published]:
    """Every output of a step after its pass: `outputs` (name, Output) over the pass's read values."""
    out = {}
    for name, output in outputs:
        value = reduced(values[output.read], output.reduce, output.k, f"{path}.outputs.{name}")
        out[name] = Published(value=value, reduce=output.reduce,
                              windows=windows[output.read] if output.reduce == "none" else None)
    return out


def chunk(published: Published, lo: int, hi: int) -> torch.Tensor:
    """The part of a published value rows lo..hi of a pass take: all of a reduced value; rows lo..hi of an
    unreduced rectangle; the positions of rows lo..hi of an unreduced flat read."""
    value, windows = published.value, published.windows
    if windows is None:
        return value
    if value.dim() == 3:
        return value[lo:hi]
    start = sum(len(w) for w in windows[:lo])
    return value[start:start + sum(len(w) for w in windows[lo:hi])]
