"""Shapes: the stdlib frozen dataclasses every other module speaks in.

A document becomes these (validate.py), a plan is built of them (compile.py), and
resolve.py resolves a `Where` against a `Frame`. Nothing here imports torch or any
model library, so the resolver and the validator can both depend on it.
SPEC.md §1 Documents and §2.2 The cut describe the fields.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol

if TYPE_CHECKING:  # annotations only: nothing here imports torch at run time
    import torch


class Lazy:
    """A module imported on the first use of one of its names, so that a refusal at the read or validation
    stage never waits for torch (SPEC.md Q17): `torch = Lazy("torch")`, then `torch.zeros(2)` imports it."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        import importlib

        value = getattr(importlib.import_module(self._name), attr)
        setattr(self, attr, value)  # looked up once; later uses find it on the instance
        return value

# ---------------------------------------------------------------- refusals


class Refusal(Exception):
    """A document (or its data, or its model) asked for something the language refuses.

    `path` is the dotted document path (`interventions.patching.writes.patch.pos`),
    `stage` is where it was decided: validation, compile or run. The CLI prints
    `<stage>: <path>: <message>` on one line and exits 2.
    """

    def __init__(self, message: str, path: str = "", stage: str = "validation"):
        super().__init__(message)
        self.message = message
        self.path = path
        self.stage = stage

    def __str__(self) -> str:
        """The CLI's line (`line`), so that a caller of the Python API sees what the CLI prints (SPEC.md PY4)."""
        return self.line()

    def line(self) -> str:
        """The one line the CLI prints, `<stage>: <path>: <message>` (SPEC.md D4, S76)."""
        return printable(f"{self.stage}: {self.path + ': ' if self.path else ''}{self.message}")


#: a run of characters (between white space, dots and the marks that frame a name) longer than this is
#: shortened in a printed line (SPEC.md S76)
LONG_RUN = 300
#: how many of a shortened run's first characters are kept
KEPT = 64
#: what a line never prints raw: C0 and C1 controls, DEL, the line and paragraph separators, and the
#: bidirectional controls (marks, embeddings, overrides, isolates) that reorder what a terminal shows, and
#: lone surrogates (a JSON `"\ud800"`), which no UTF-8 output can hold
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_RUN = re.compile(f"[^\\s.:;,'\"()\\[\\]{{}}=]{{{LONG_RUN + 1},}}")


def printable(text: str, shorten_runs: bool = True) -> str:
    """`text` as one line safe to print on a terminal (SPEC.md S76): each run of more than LONG_RUN characters
    between white space, dots and the marks that frame a name (`:;,'"()[]{}=`) shortened to its first KEPT and
    `…(<n> chars)` (unless `shorten_runs` is False: conform's report lines), then every character of _UNSAFE
    written as its escape (`\\n`, `\\x1b`, `\\u202e`, `\\ud800`); other text is unchanged."""
    short = _RUN.sub(lambda m: f"{m.group()[:KEPT]}\u2026({len(m.group())} chars)", text) if shorten_runs else text
    return _UNSAFE.sub(lambda m: _NAMED.get(m.group()) or (f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                                          else f"\\u{ord(m.group()):04x}"), short)


def nearest(name: Any, known) -> str:
    """A refusal's tail for a name it does not know: `; did you mean 'x'?` naming the known names closest to
    it (difflib's, at most three, best first), or '' when none is close (SPEC.md D22)."""
    import difflib

    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, [str(k) for k in known], n=3)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def read_json(path: Any) -> Any:
    """The JSON value of the file at `path`, or None when there is none to read: missing, unreadable, not
    UTF-8, not JSON, or nested past what Python's reader takes (a RecursionError, not a ValueError). It reads
    the files whose damage means "not there" (an export's manifest, a cache record, run.json, a results
    folder's tables, a checkpoint's config.json), so a damaged one is never an internal error (SPEC.md S23,
    S28, S29); a file whose fault must be named (a document, a data table, a case) has its own reader."""
    import json
    import pathlib

    try:
        return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None


# ---------------------------------------------------------------- positions

FRAMES = ("prompt", "generated")
CUTS = ("index", "span", "last", "all")


@dataclass(frozen=True)
class Anchor:
    """Which run of the frame: a variable's text, a segment, or a variable inside a segment."""

    variable: Optional[str] = None
    segment: Optional[str] = None

    def spelling(self) -> str:
        parts = []
        if self.segment is not None:
            parts.append(f"segment:{self.segment}")
        if self.variable is not None:
            parts.append(f"variable:{self.variable}")
        return "{" + " ".join(parts) + "}"


@dataclass(frozen=True)
class Where:
    """A position spec: frame, scope, and exactly one cut (index, span, last, all)."""

    index: Optional[int] = None
    span: Optional[tuple[int, int]] = None
    last: Optional[int] = None
    all: bool = False
    scope: Optional[Anchor] = None
    frame: str = "prompt"

    def __post_init__(self) -> None:
        """Exactly one cut, as the validator requires of a document (SPEC.md P57): no spec is built without one."""
        named = [name for name, value in (("index", self.index), ("span", self.span), ("last", self.last))
                 if value is not None] + (["all"] if self.all else [])
        if len(named) != 1:
            raise ValueError(f"a position names exactly one of index/span/last/all, got {named}")

    @property
    def cut(self) -> str:
        """The name of the one cut this spec makes."""
        if self.index is not None:
            return "index"
        if self.span is not None:
            return "span"
        if self.last is not None:
            return "last"
        return "all"

    @property
    def per_row(self) -> Optional[int]:
        """How many positions the cut names in each row, or None when only a row knows."""
        if self.index is not None:
            return 1
        if self.last is not None:
            return self.last
        if self.span is not None:
            a, b = self.span
            if (a < 0) == (b < 0):
                return b - a
            return None
        return None

    @property
    def uneven(self) -> bool:
        """Whether some row may keep a window of its run the other rows do not have: the count is left to the
        row, or the run is anchored. In the prompt frame that is a window of positions; in the continuation,
        the decode steps a row keeps once the decode has finished (SPEC.md P47)."""
        return self.per_row is None or self.scope is not None

    @property
    def ragged(self) -> bool:
        """Whether the tap gathers flat at its address: an uneven prompt-frame spec. A continuation-frame spec
        never is, because a decode step processes one position; its cut happens over the steps (SPEC.md P47)."""
        return self.frame == "prompt" and self.uneven

    @property
    def dynamic(self) -> bool:
        """Whether the document leaves where it acts to the row: anything but a bare `index` cut of
        the prompt (a scope, the continuation, or a last/span/all cut of a row's own content)."""
        return self.scope is not None or self.frame == "generated" or self.cut != "index"

    def spelling(self) -> str:
        parts = []
        if self.frame == "generated":
            parts.append("generated")
        if self.index is not None:
            parts.append(f"index:{self.index}")
        elif self.span is not None:
            parts.append(f"span:[{self.span[0]}, {self.span[1]}]")
        elif self.last is not None:
            parts.append(f"last:{self.last}")
        else:
            parts.append("all")
        if self.scope is not None:
            parts.append(f"scope:{self.scope.spelling()}")
        return "{" + " ".join(parts) + "}"


@dataclass(frozen=True)
class Frame:
    """The rows of one batch as the resolver sees them.

    `starts[r]`/`ends[r]` are the half-open content range of row r inside the padded
    ids (after padding and after the tokenizer's special prefix). `texts[r]` is the
    decoded content, `offsets[r][k]` the character where content token k starts,
    with a final entry len(texts[r]). `segments[r]` maps a segment name to its
    half-open character range in texts[r]. Offsets are empty when no character map
    was built (a pass whose positions are all bare integers).
    """

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    texts: tuple[str, ...] = ()
    offsets: tuple[tuple[int, ...], ...] = ()
    segments: tuple[dict, ...] = ()
    name: str = "prompt"  # which frame: "prompt" or "generated" (a position's `Where.frame`)


# ---------------------------------------------------------------- documents


@dataclass(frozen=True)
class Model:
    key: str
    revision: str
    dtype: str
    attn_implementation: Optional[str] = None


@dataclass(frozen=True)
class Role:
    field: str


@dataclass(frozen=True)
class Site:
    component: str
    layers: Optional[tuple[int, ...]] = None
    heads: Optional[tuple[int, ...]] = None
    units: Optional[tuple[int, ...]] = None

    @property
    def layer(self) -> Optional[int]:
        return self.layers[0] if self.layers else None


@dataclass(frozen=True)
class Read:
    site: str
    pos: Where
    input: str
    model: str = "original"
    featurizer: str = "identity"
    view: str = "raw"


@dataclass(frozen=True)
class Ref:
    """An operand `{"ref": name}`: a value an earlier step published (SPEC.md §8.2)."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Output:
    """A step output: the read it keeps and how it is reduced (none, mean, pca with k)."""

    read: str
    reduce: str = "none"
    k: Optional[int] = None


@dataclass(frozen=True)
class Write:
    site: str
    pos: Where
    mechanism: str
    operand: Any = None  # a read name (str), a number, a Ref, or None
    featurizer: str = "identity"
    features: Optional[tuple[int, ...]] = None
    params: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class IntervenedModel:
    input: str
    writes: tuple[str, ...]


@dataclass(frozen=True)
class Metric:
    kind: str
    of: str
    columns: tuple[tuple[str, str], ...]  # (field name, column name), e.g. ("expected", "cf_answer")
    token_form: str = "space_prefixed"
    against: Optional[str] = None  # the reference read of logits (kl, js, top_k)
    k: Optional[int] = None  # top_k's number of tokens

    def column(self, name: str) -> str:
        return dict(self.columns)[name]


@dataclass(frozen=True)
class Intervention:
    reads: tuple[tuple[str, Read], ...]
    writes: tuple[tuple[str, Write], ...] = ()
    models: tuple[tuple[str, IntervenedModel], ...] = ()
    metrics: tuple[tuple[str, Metric], ...] = ()
    decode: int = 0


@dataclass(frozen=True)
class Save:
    value: str
    file_path: str


@dataclass(frozen=True)
class Observe:
    rows: tuple[tuple[str, str], ...]
    interventions: tuple[str, ...]
    saves: tuple[Save, ...] = ()
    kind: str = "observe"
    outputs: tuple[tuple[str, Output], ...] = ()
    # each intervention's (name, the saves of its child step as (value, file_path)): what it produces, bare
    child_saves: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()


@dataclass(frozen=True)
class Featurizer:
    """A declared featurizer: its kind, rank, initial seed or the bundle it is loaded from (SPEC.md FZ18), and
    the one site its reads and writes name ("" until the document's interventions are read)."""

    kind: str
    k: Optional[int] = None
    parametrization: str = "cayley"
    seed: Optional[int] = None
    file_path: Optional[str] = None
    site: str = ""


@dataclass(frozen=True)
class Fit:
    """A fit step (SPEC.md FZ20): train `params` on `rows` through `interventions`, judged on `eval_rows`."""

    rows: tuple[tuple[str, str], ...]
    interventions: tuple[str, ...]
    params: tuple[str, ...]
    objective: tuple[tuple[float, str], ...]
    epochs: int
    pairs: int
    lr: float
    early_stop: tuple[str, str, int]  # (metric, mode, patience)
    eval_rows: tuple[tuple[str, str], ...]
    eval_saves: tuple[Save, ...] = ()
    saves: tuple[Save, ...] = ()
    anneal: tuple[tuple[str, float, float], ...] = ()
    seed: int = 0
    weight_decay: float = 0.0
    kind: str = "fit"


@dataclass(frozen=True)
class Weights:
    """A weights step: publish featurizers' fitted tensors, saved as stamped bundles."""

    names: tuple[str, ...]
    saves: tuple[Save, ...] = ()
    kind: str = "weights"


@dataclass(frozen=True)
class PointDocument:
    """One plan-shaped document with no sweep in it, validated (validate.document): a sweep point's document.
    The document a user gives, read and lowered with all its points, is api.Document."""

    model: Model
    roles: tuple[tuple[str, Role], ...]
    sites: tuple[tuple[str, Site], ...]
    interventions: tuple[tuple[str, Intervention], ...]
    steps: tuple[tuple[str, Any], ...]  # Observe, Fit or Weights
    featurizers: tuple[tuple[str, Featurizer], ...] = ()


# ---------------------------------------------------------------- addresses


@dataclass(frozen=True)
class Address:
    """Where a component lands on one loaded checkpoint (address.py builds these).

    `module` is relative to the layer for a per-layer place and to the model for a
    whole-model one ('' is the layer itself, or the model root); an interior has no
    module and carries `op`, the `.source` operation inside the attention forward.
    `io` is 'input' or 'output' at a module boundary. `rank` orders reads in the
    forward pass. `seq_axis` is the sequence axis of the tensor held there.
    """

    component: str
    layer: Optional[int]
    module: Optional[str]
    io: Optional[str]
    rank: tuple[int, int]
    op: Optional[str] = None
    seq_axis: int = 1
    width: Optional[int] = None
    heads: Optional[int] = None  # the head count at this address, for a per-head tensor

    def label(self) -> str:
        return self.component if self.layer is None else f"{self.component}[{self.layer}]"


@dataclass(frozen=True)
class Selection:
    """Which part of the tensor at an address a tap touches.

    `windows[r]` are row r's positions along `seq_axis` (absolute, padded batch).
    Features are viewed as (groups, -1) and the groups in `take` are kept; both are
    None when the whole feature axis is meant. A ragged selection gathers flat,
    (total, features); a rectangular one (rows, w, features).
    """

    windows: tuple[tuple[int, ...], ...]
    seq_axis: int = 1
    ragged: bool = False
    groups: Optional[int] = None
    take: Optional[tuple[int, ...]] = None


def features_label(groups: Optional[int], take: Optional[tuple[int, ...]]) -> str:
    """`features=[0]/4` as explain prints a heads/units selection."""
    if groups is None or take is None:
        return ""
    return f" features=[{', '.join(str(t) for t in take)}]/{groups}"


# ---------------------------------------------------------------- what crosses into an engine (SPEC.md §12)


class FeatureMap(Protocol):
    """A change of basis around a write: `featurize(x) -> (f, err)`, `inverse(f', err, x) -> x'`
    (SPEC.md E3; featurizers plug in here, identity is the default)."""

    def featurize(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]: ...

    def inverse(self, f: torch.Tensor, err: Any, x: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class Action:
    """One tap of a forward made concrete for this batch of rows.

    `tap` is the plan's tap (plan.Tap); `selection` the rows' positions and features;
    `operand` what a write lands (a tensor, a number, or None); `steps` the decode steps
    it fires at (0 is the prompt's own forward); `featurizer` None is identity."""

    tap: Any
    selection: Selection
    operand: Any = None
    steps: tuple[int, ...] = (0,)
    featurizer: Optional[FeatureMap] = None
    draw_offset: Optional[tuple[int, int]] = None  # gaussian: (offset, total) of this chunk in the whole pass's draw

    @property
    def name(self) -> str:
        return self.tap.name

    @property
    def address(self) -> Address:
        return self.tap.address


@dataclass(frozen=True)
class Batch:
    """One forward of the plan on one chunk of rows: left-padded ids and mask, the actions in
    rank order (writes before reads at one address), and the decode bound (0: no decode)."""

    ids: tuple[tuple[int, ...], ...]
    mask: tuple[tuple[int, ...], ...]
    actions: tuple[Action, ...]
    decode: int = 0
    grad: bool = False  # a fit's update: keep the autograd graph from the featurizers' leaves to the reads
