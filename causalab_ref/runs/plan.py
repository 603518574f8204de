"""The plan: what compile produces and every later stage reads, and its two renderings.

The dataclasses (Tap, Forward, MetricPlan, ObservePlan, Plan) are plain data: strings,
integers, tuples, resolved addresses and positions (FitPlan.later, which plans a fit's later
epochs, is the one callable). `Plan.text()` is `explain`'s text (SPEC.md §4 Runs, R5);
`plan_json` is the structured plan `explain --json` prints, part of the CLI contract (SPEC.md
§6 Conformance, C3). cli and conform both import this module.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Optional

from ..positions import resolve
from ..shapes import Address, Output, Ref, Where, features_label


def narrowed_width(width: Optional[int], groups: Optional[int], take: Optional[tuple[int, ...]]) -> Optional[int]:
    """Features per position: an address's width narrowed by heads or units, the features viewed as
    (groups, width // groups) and `take` of the groups kept (None: the address has no width)."""
    if width is None or not groups or take is None:
        return width
    return width // groups * len(take)


def operand_json(operand: Any) -> Any:
    """A write's operand as explain --json prints it: a read name, a number, {"ref": name}, or null."""
    return {"ref": operand.name} if isinstance(operand, Ref) else operand


@dataclass(frozen=True)
class Tap:
    kind: str  # "read" or "write"
    name: str
    site: str
    address: Address
    pos: Where
    groups: Optional[int] = None
    take: Optional[tuple[int, ...]] = None
    mechanism: Optional[str] = None
    operand: Any = None
    params: tuple[tuple[str, float], ...] = ()  # a write's mechanism params (mechanisms.TABLE)
    anchors: Optional[tuple[Optional[str], ...]] = None
    view: str = "raw"
    stacked: int = 0  # decode steps a continuation read is buffered over (0: not stacked)
    featurizer: str = "identity"
    features: Optional[tuple[int, ...]] = None  # dimensions of the feature space a write touches
    space: Optional[int] = None  # width of the feature space (the featurizer's k, or the site's width)

    @property
    def width(self) -> Optional[int]:
        """Features per position the tap touches at its address (narrowed by heads or units)."""
        return narrowed_width(self.address.width, self.groups, self.take)

    def line(self) -> str:
        placed = f"at {self.address.label()} pos={self.pos.spelling()}"
        features = features_label(self.groups, self.take)
        if self.kind == "write":
            coords = f" features={list(self.features)}" if self.features is not None else ""
            args = ([] if self.operand is None else [str(self.operand)]) + [f"{k}={v}" for k, v in self.params]
            return (f"write '{self.name}' {placed}{features} {self.mechanism}({', '.join(args)}) "
                    f"via '{self.featurizer}'{coords}")
        tail = " as logits" if self.view == "logits" else ""
        if self.stacked:
            tail += f"  (stacked over {self.stacked} decode steps, cut against the continuation)"
        return f"read  '{self.name}' {placed}{features} via '{self.featurizer}'{tail}"


@dataclass(frozen=True)
class Forward:
    model: str
    input: str
    ids: tuple[tuple[int, ...], ...]
    mask: tuple[tuple[int, ...], ...]
    taps: tuple[Tap, ...]
    segments: Optional[tuple[dict, ...]] = None
    sample: str = ""
    check: str = ""  # row 0 decoded by the tokenizer that encoded the plan
    decode: int = 0
    computation: str = ""  # set when other steps compute this forward identically (share.py)
    shared: tuple[str, ...] = ()  # those steps, `<point>/<step>`, this one included

    def line(self) -> str:
        tail = f", then {self.decode} decode steps" if self.decode else ""
        return f"forward '{self.model}' on '{self.input}'  ({len(self.ids)} rows x {len(self.ids[0])} tokens{tail})"


def frame_key(forward: Forward, dynamic: bool) -> tuple:
    """What a forward's frame depends on: its rows' ids and mask, their chat segments, whether a character map
    is built (a dynamic step's; SPEC.md P32)."""
    return (forward.ids, forward.mask, repr(forward.segments), dynamic)


@dataclass(frozen=True)
class MetricPlan:
    name: str
    kind: str
    of: str
    answers: tuple[tuple[str, tuple[Optional[int], ...]], ...]  # column field -> per-row token id
    eligible: tuple[bool, ...]  # the column half
    unit: str
    estimand_version: str
    against: Optional[str] = None  # the reference read (kl, js, top_k), placed on the rows `of` is
    k: Optional[int] = None  # top_k's number of tokens
    # a listed kind's (top_k's) speller of one token id, the run's tokenizer's (metrics.spelled; SPEC.md D28)
    spell: Optional[Callable[[int], str]] = field(default=None, compare=False, repr=False)
    layer: Optional[int] = None  # a metric of a read at every layer: this part's layer, on each row (D34)

    @property
    def reads(self) -> tuple[str, ...]:
        """The reads this metric scores: `of`, then `against` when it has one."""
        return (self.of,) if self.against is None else (self.of, self.against)

    def given(self, values: dict) -> dict:
        """What the kind takes beside `of`'s logits and the columns' ids: `against`'s rows, `k` (metrics.py)."""
        extra: dict = {} if self.against is None else {"against": values[self.against]}
        return extra if self.k is None else {**extra, "k": self.k}


@dataclass(frozen=True)
class ObservePlan:
    name: str
    intervention: str
    forwards: tuple[Forward, ...]
    metrics: tuple[MetricPlan, ...]
    saves: tuple[tuple[str, str], ...]
    example_ids: tuple[str, ...]
    dynamic: bool
    kind: str = "observe"
    outputs: tuple[tuple[str, Output], ...] = ()  # what the step publishes (SPEC.md §8.2)
    publishes: bool = True  # False for the child of a step running several interventions (M13)
    stamps: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()  # each output's .safetensors metadata
    output_shapes: tuple = ()  # (output name, outputs.PublishedShape): what compile knows of each, for later steps
    layer: Optional[int] = None  # in a document with layers "all", the layer this step reads at (SPEC.md D34)

    @property
    def shown(self) -> str:
        """The step's name, and in a document with layers "all" its layer: `score@layer=1`."""
        return self.name if self.layer is None else f"{self.name}@layer={self.layer}"

    def lines(self, indent: str) -> list[str]:
        metrics = [f"{m.name}/{m.kind}" for m in self.metrics]
        saves = [path for _, path in self.saves]
        shown = [f"{n}={o.read}" if o.reduce == "none" else f"{n}=mean({o.read})" if o.reduce == "mean"
                 else f"{n}=pca(k={o.k}, {o.read})" for n, o in self.outputs]
        outs = f"  outputs={shown}" if shown else ""  # metrics, then outputs, then saves; none empty (R23)
        kept = f"  saves={saves}" if saves else ""
        out = [f"{indent}{self.shown}: Observe  metrics={metrics}{outs}{kept}"]
        for forward in self.forwards:
            out.append(f"{indent}    {forward.line()}")
            out += [f"{indent}      {tap.line()}" for tap in forward.taps]
        return out


@dataclass(frozen=True)
class FeaturizerPlan:
    """A featurizer as the run builds it: kind, site, width d, rank k, and its seed or its bundle's bytes
    (checked at compile). `trained` says some fit of this plan lists it; `stamp` is what a weights step writes."""

    name: str
    kind: str
    site: str
    d: int
    k: int
    seed: Optional[int]
    file_path: Optional[str]
    bundle: Optional[bytes]
    trained: bool
    stamp: tuple[tuple[str, str], ...]

    def line(self) -> str:
        rank = "" if self.kind == "gate" else f" k={self.k}"
        cayley = " cayley" if self.kind == "subspace" else ""
        if self.file_path is not None:
            start = f" loaded from {self.file_path}"
        else:
            start = " θ=0" if self.kind == "gate" else f" seed={self.seed}"
        return f"{self.name}: {self.kind}{rank} d={self.d}{cayley}{start} trained={self.trained}"


def _no_later_epochs() -> Iterator[tuple]:
    return iter(())


@dataclass(frozen=True)
class FitPlan:
    """A fit step: its updates (per epoch, each an observe pass over one minibatch) and its eval pass.

    Only the first epoch is planned with the plan (`first`); `later()` plans epochs 1.. one at a time as
    the run reaches them (a fresh iterator per call), so the plan's size and validate's cost do not grow
    with `epochs` (SPEC.md S49). The one field that is not plain data."""

    name: str
    intervention: str
    params: tuple[str, ...]
    objective: tuple[tuple[float, str], ...]
    lr: float
    weight_decay: float
    anneal: tuple[tuple[str, float, float], ...]
    early_stop: tuple[str, str, int]
    epochs: int
    first: tuple[ObservePlan, ...]  # epoch 0's updates
    evaluation: ObservePlan
    saves: tuple[tuple[str, str], ...]
    kind: str = "fit"
    later: Callable[[], Iterator[tuple[ObservePlan, ...]]] = field(default=_no_later_epochs, compare=False,
                                                                   repr=False)

    def updates(self) -> Iterator[tuple[ObservePlan, ...]]:
        """Every epoch's updates in order, the later ones planned as they are reached."""
        yield self.first
        yield from itertools.islice(self.later(), self.epochs - 1)

    @property
    def eval_saves(self) -> tuple[tuple[str, str], ...]:
        """The eval pass's saves, as a document's fit names them (`validate.all_saves` reads both)."""
        return self.evaluation.saves

    def lines(self, indent: str) -> list[str]:
        metric, _mode, patience = self.early_stop
        head = (f"{indent}{self.name}: Fit  {self.epochs} epochs x {len(self.first)} update  lr={self.lr} "
                f"objective={self.objective!r} params={self.params!r}  early_stop='{metric}' patience={patience}")
        if self.anneal:
            head += f"  anneal={self.anneal!r}"
        return [head] + self.first[0].lines(indent + "    ") + self.evaluation.lines(indent + "    ")


@dataclass(frozen=True)
class WeightsPlan:
    """A weights step: publish featurizers' tensors; each save is a stamped bundle."""

    name: str
    names: tuple[str, ...]
    saves: tuple[tuple[str, str], ...]
    kind: str = "weights"

    def lines(self, indent: str) -> list[str]:
        return [f"{indent}{self.name}: Weights  names={list(self.names)}  saves={[p for _, p in self.saves]}"]


@dataclass(frozen=True)
class Plan:
    label: str
    digest: str
    document_json: Any  # what the plan's document.json holds: the point's, or the document as given
    steps: tuple = ()  # ObservePlan, FitPlan, WeightsPlan
    points: tuple["Plan", ...] = ()
    featurizers: tuple[FeaturizerPlan, ...] = ()
    rows_per_pass: int = 0  # rows per pass when --batch-size is not given: the memory budget's (0: no bound; Q11)
    coordinates: dict = field(default_factory=dict)  # the root's: each point's label -> its coordinates (PY9)
    # the frames compile built to place the prompt frame (placement.check_step), by the run's key; not data of
    # the plan, a cache the run's memo starts from (SPEC.md Q15)
    frames: dict = field(default_factory=dict, compare=False, repr=False)

    def lines(self, indent: str = "") -> list[str]:
        out = [f"{indent}{self.label or '<root>'}: Plan"]
        for point in self.points:
            out += point.lines(indent + "  ")
        if self.featurizers:
            out.append(f"{indent}  featurizers: Featurizers")
            out += [f"{indent}      {f.line()}" for f in self.featurizers]
        for step in self.steps:
            out += step.lines(indent + "  ")
        return out

    def text(self) -> str:
        return "\n".join(self.lines() + self.shared_lines() + self.rows_per_pass_lines())

    def rows_per_pass_lines(self) -> list[str]:
        """The rows per pass, when the memory budget splits some step's rows (SPEC.md Q11)."""
        rows = max((len(s.example_ids) for leaf in self.leaves() for s in leaf.steps if hasattr(s, "example_ids")),
                   default=0)
        if not self.rows_per_pass or self.rows_per_pass >= rows:
            return []
        return [f"  rows per pass: {self.rows_per_pass} (the memory budget's; --batch-size overrides it)"]

    def shared_lines(self) -> list[str]:
        """After the points: each forward that runs once for several steps, and which (SPEC.md Q6)."""
        seen: dict[str, Forward] = {}
        for leaf in self.leaves():
            for step in leaf.steps:
                for forward in getattr(step, "forwards", ()):  # a fit or weights step has none of its own
                    if forward.computation:
                        seen.setdefault(forward.computation, forward)
        if not seen:
            return []
        return ["  shared forwards (each runs once, its reads serve every step named):"] + [
            f"    '{f.model}' on '{f.input}'  ({len(f.ids)} rows x {len(f.ids[0])} tokens): {', '.join(f.shared)}"
            for f in seen.values()]

    def leaves(self) -> list["Plan"]:
        return [self] if not self.points else [p for point in self.points for p in point.leaves()]


# ---------------------------------------------------------------- explain's structured plan


def with_digest(plan: Plan, digest: str, document_json: Any) -> Plan:
    """The plan of a document read in another format, carrying that format's own digest and text (SPEC.md
    PR15, SF15): on its root and, unswept, on every output's stamp too, so a table and a tensor file it writes
    name one produced_by (a sweep point keeps its point's)."""
    def restamped(step):
        stamps = tuple((name, tuple((k, digest if k == "produced_by" and v == plan.digest else v) for k, v in meta))
                       for name, meta in getattr(step, "stamps", ()))
        return replace(step, stamps=stamps) if stamps else step
    steps = plan.steps if plan.points else tuple(restamped(step) for step in plan.steps)
    return replace(plan, digest=digest, document_json=document_json, steps=steps)


def plan_json(plan, engine) -> list[dict]:
    """The compiled plan as plain data: per leaf (sweep point), per step, per forward, per tap.

    Prompt-frame taps carry their resolved positions (absolute indices into the padded
    batch), each row's reason and the repr of the slice of the row's decoded text that the
    character map gives the window (P34), resolved exactly as the run resolves them but with
    no refusal; a continuation tap's positions are only known after the decode, so they are null.
    """
    return [{"label": leaf.label, "produced_by": leaf.digest,
             "steps": [_step_json(step, engine.tokenizer) for step in leaf.steps]} for leaf in plan.leaves()]


def _step_json(step, tok) -> dict:
    if not isinstance(step, ObservePlan):
        return {"name": step.name, "kind": step.kind, "saves": [list(s) for s in step.saves]}
    return {"name": step.name, **({} if step.layer is None else {"layer": step.layer}),
            "intervention": step.intervention, "dynamic": step.dynamic,
            "example_ids": list(step.example_ids),
            "metrics": [{"name": m.name, "kind": m.kind, "of": m.of, "unit": m.unit,
                         "estimand_version": m.estimand_version, "eligible": list(m.eligible)} for m in step.metrics],
            "saves": [list(s) for s in step.saves], "forwards": [_forward_json(f, tok) for f in step.forwards]}


def _forward_json(forward: Forward, tok) -> dict:
    frame = resolve.frame_of_ids(tok, forward.ids, forward.mask, segments=forward.segments)
    segments = ([{k: None if v is None else list(v) for k, v in s.items()} for s in forward.segments]
                if forward.segments is not None else None)
    return {"model": forward.model, "input": forward.input, "rows": len(forward.ids),
            "tokens": len(forward.ids[0]), "decode": forward.decode, "starts": list(frame.starts),
            "segments": segments, "taps": [_tap_json(tap, frame) for tap in forward.taps]}


def _tap_json(tap: Tap, frame) -> dict:
    a = tap.address
    entry = {"kind": tap.kind, "name": tap.name, "site": tap.site, "component": a.component,
             "layer": a.layer, "module": a.module, "io": a.io, "op": a.op, "width": a.width,
             "heads": a.heads, "pos": tap.pos.spelling(),
             "features": features_label(tap.groups, tap.take).split("=", 1)[-1] or None,
             "view": tap.view, "stacked": tap.stacked,
             "operand": operand_json(tap.operand) if tap.kind == "write" else None}
    if tap.pos.frame == "prompt":
        windows, reasons = resolve.resolve(frame, tap.pos, tap.anchors)
        entry["positions"] = [list(w) for w in windows]
        entry["reasons"] = list(reasons)
        entry["tokens"] = [resolve.tokens_of(frame, w, r) for r, w in enumerate(windows)]
    else:
        entry["positions"] = entry["reasons"] = entry["tokens"] = None
    return entry
