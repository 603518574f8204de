"""Validate: JSON in, frozen `shapes.PointDocument` out, or one Refusal naming the dotted path.

This module walks a document: its header, model block, roles, sites, featurizers,
interventions and steps in that order, then the rules that hold across the steps;
`points_of` lowers the sweeps (sweeps.py) and validates each point once; and `read` is the one
pass a command takes before compile (D21): text read (reader.py), a protocol or steps-first
document lowered to the plan-shaped one it means, then `points_of`. The parts are checked
where they are defined: fields.py (raw JSON values), places.py (sites, reads, writes, positions),
interventions.py (how an intervention's parts name each other), steps.py (rows, saves, observe steps and outputs),
fits.py (fit and weights steps). Everything is decided without a model, a tokenizer or data
(SPEC.md §1 Documents, and the validation rows of §2 Positions and §3 Locations); every
object at every depth rejects unknown keys. JSON text is read by reader.py.

    from causalab_ref.documents import reader, validate
    raw = reader.load_json(Path("documents/patching.json").read_text())
    document = validate.document(raw)   # one document with no sweep in it
    points = validate.points_of(raw)    # every sweep point, each validated once
    read = validate.read("documents/patching.json")   # Document: as given, lowered, its points
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Optional

from ..featurizers import kinds as featurizer_table
from ..writes import outputs
from . import fits, interventions as intervention_parts, places, protocol, reader, steps as step_parts, stepsfirst
from . import sweeps
from .fields import choice, integer, mapping, strict_object, string
from .fields import seed as seed_integer
from ..shapes import PointDocument, Featurizer, Model, Refusal, Role

DTYPES = ("fp32", "bf16")
ATTN = ("eager", "sdpa")


def _fail(path: str, message: str):
    raise Refusal(message, path=path, stage="validation")


# ---------------------------------------------------------------- the document's own blocks


def model_block(raw: Any) -> Model:
    strict_object(raw, "model", ("key", "revision", "dtype", "attn_implementation"), ("key", "revision", "dtype"))
    attn = raw.get("attn_implementation")
    if attn is not None:
        choice(attn, "model.attn_implementation", ATTN)
    return Model(key=string(raw["key"], "model.key"), revision=string(raw["revision"], "model.revision"),
                 dtype=choice(raw["dtype"], "model.dtype", DTYPES), attn_implementation=attn)


def _roles(raw: Any) -> tuple[tuple[str, Role], ...]:
    roles = []
    for k, v in mapping(raw, "roles").items():
        strict_object(v, f"roles.{k}", ("field",), ("field",))
        roles.append((k, Role(field=string(v["field"], f"roles.{k}.field"))))
    if not roles:
        _fail("roles", "a document declares at least one role")
    return tuple(roles)


def featurizer(raw: Any, path: str) -> Featurizer:
    """One declared featurizer (SPEC.md FZ18), with the validator's refusals in the reference's order."""
    strict_object(raw, path, ("kind", "k", "parametrization", "seed", "file_path"), ("kind",))
    kind = choice(raw["kind"], f"{path}.kind", tuple(featurizer_table.KINDS))
    k = raw.get("k")
    if k is not None and (integer(k, f"{path}.k") <= 0):
        _fail(f"{path}.k", f"k={k} is not a positive rank")
    choice(raw.get("parametrization", "cayley"), f"{path}.parametrization", ("cayley",))
    seed = raw.get("seed")
    if seed is not None:
        seed_integer(seed, f"{path}.seed")
    file_path = raw.get("file_path")
    if file_path is not None:
        string(file_path, f"{path}.file_path")
    row = featurizer_table.KINDS[kind]
    if row.k == "refused" and k is not None:
        _fail(f"{path}.k", "a gate masks every unit of its site and takes no k")
    if row.k == "required" and k is None:
        _fail(path, f"a {kind} needs k, the rank of its basis")
    if row.loaded and file_path is None:
        _fail(path, f"a {kind} featurizer is loaded from a file; nothing draws or trains one")
    if kind == "gate" and seed is not None:
        _fail(f"{path}.seed", "a gate starts at θ = 0, not from a draw; it has no seed")
    if file_path is not None and seed is not None:
        _fail(f"{path}.seed", "a loaded featurizer has no seed: its weights are its bytes")
    return Featurizer(kind=kind, k=k, seed=seed, file_path=file_path)


def featurizer_sites(declared: dict, interventions) -> dict[str, str]:
    """Each featurizer's one site: the site of every read and write naming it, across all interventions."""
    used: dict[str, set] = {name: set() for name in declared}
    for _i, intervention in interventions:
        for _n, op in intervention.reads + intervention.writes:
            if op.featurizer in used:
                used[op.featurizer].add(op.site)
    for name, sites in used.items():
        if len(sites) != 1:
            _fail(f"featurizers.{name}", f"featurizer '{name}' is used at {sorted(sites)}; one name is one site")
    return {name: next(iter(sites)) for name, sites in used.items()}


def _step(raw: Any, path: str, interventions: dict, roles: tuple, declared: dict):
    """One step, by its kind: a fit or a weights step (fits.py), else an observe step (steps.py)."""
    kind = raw.get("kind") if isinstance(raw, dict) else None
    if kind == "fit":
        return fits.fit_step(raw, path, interventions, roles, declared)
    if kind == "weights":
        return fits.weights_step(raw, path, declared)
    return step_parts.observe_step(raw, path, interventions, roles)


# ---------------------------------------------------------------- the walk


def document(raw: Any) -> PointDocument:
    """Validate one (already lowered) document."""
    strict_object(raw, "", ("header", "model", "roles", "sites", "featurizers", "interventions", "steps"),
                  ("model", "roles", "sites", "interventions", "steps"))
    for path, _wrapper in sweeps.find_wrappers(raw, ()):
        _fail(".".join(str(p) for p in path), "a sweep wrapper must be lowered before validation")
    header = strict_object(raw.get("header", {}), "header", ("description",))
    string(header.get("description", ""), "header.description")  # authoring metadata: checked, not kept
    model = model_block(raw["model"])
    roles = _roles(raw["roles"])
    role_names = tuple(k for k, _ in roles)
    sites = tuple((k, places.site(v, f"sites.{k}")) for k, v in mapping(raw["sites"], "sites").items())
    declared = {k: featurizer(v, f"featurizers.{k}")
                for k, v in mapping(raw.get("featurizers", {}), "featurizers").items()}
    interventions_raw, steps_raw = step_parts.hoisted(raw["steps"], mapping(raw["interventions"], "interventions"))
    if not interventions_raw:
        _fail("interventions", "a document declares at least one intervention")
    interventions = tuple((k, intervention_parts.intervention(v, f"interventions.{k}", dict(sites), role_names,
                                                              declared))
                          for k, v in interventions_raw.items())
    sites_of = featurizer_sites(declared, interventions)
    declared = {k: replace(f, site=sites_of[k]) for k, f in declared.items()}
    steps_raw = mapping(steps_raw, "steps")
    if not steps_raw:
        _fail("steps", "a document has at least one step")
    steps = tuple((k, _step(v, f"steps.{k}", dict(interventions), role_names, declared))
                  for k, v in steps_raw.items())
    fits.check_order(steps, dict(interventions), declared)
    outputs.check_refs(steps, dict(interventions))
    step_parts.check_save_paths(steps)
    return PointDocument(model=model, roles=roles, sites=sites, interventions=interventions,
                         steps=steps, featurizers=tuple(declared.items()))


@dataclass(frozen=True)
class Point:
    """One sweep point, or the unswept document: its label (its folder under --out, "" when
    unswept), its raw JSON (what is written as document.json) and its digest (produced_by, D19), its
    PointDocument and the coordinates of the point the run writes (PY9; a layer point's are those of the point
    it is folded into: D34 writes the layer as a column of that point's tables, not as a point)."""
    label: str
    raw: Any
    document: PointDocument
    digest: str
    coordinates: dict
    # a document with layers "all" (D34): the point of its other sweeps it is folded into (its folder, "" when
    # none; None without "all"), that point's document with "all" kept and its digest, the layer this point
    # reads at, and the sites whose layers are "all"
    fold_label: Optional[str] = None
    fold_raw: Any = None
    fold_digest: str = ""
    layer: Optional[int] = None
    every_layer: tuple[str, ...] = ()


def points_of(raw: Any, layers: Optional[int] = None) -> list[Point]:
    """The one pass a document takes before compile: lower its sweeps once, validate each point once.
    A `layers: "all"` is lowered with the model's `layers` count, one point per layer of each point of the
    other sweeps, which compile folds into one table per metric (D34); before compile knows the count (None)
    the document is checked as if the model had one layer, so its other refusals need no model (D35)."""
    names = sweeps.every_layer(raw)
    if not names:
        return [Point(label=label, raw=point, document=document(point), digest=reader.digest(point), coordinates=at)
                for label, point, at in sweeps.lowered(raw)]
    count = 1 if layers is None else layers
    sweeps.with_layers(raw, count)  # its refusals: another sweep on the axis `layers`, a model of no layers
    folds = sweeps.lowered(raw)  # the other sweeps: "all" is no wrapper, so it stays in each point
    sweeps.bound_layers(raw, len(folds), count)
    out: list[Point] = []
    for fold_label, fold_raw, fold_at in folds:
        fold_digest = reader.digest(fold_raw)
        for layer, (label, point) in enumerate(sweeps.points(sweeps.with_layers(fold_raw, count))):
            doc = document(point)
            if not out:
                sweeps.every_layer_allows(doc, names)
            out.append(Point(label=",".join(p for p in (fold_label, label) if p), raw=point, document=doc,
                             digest=reader.digest(point), coordinates=fold_at, fold_label=fold_label,
                             fold_raw=fold_raw, fold_digest=fold_digest, layer=layer, every_layer=tuple(names)))
    return out


# ---------------------------------------------------------------- a document as given, read once


@dataclass(frozen=True)
class Document:
    """A read and validated document: as given (`given`), lowered to the plan-shaped document (`raw`), its
    format (plan-shaped, protocol or steps-first), its points (Point, each validated once) and where it came
    from (a path, or `<dict>`). `repath` maps a path of the lowered document back to the given one's;
    `digest` is a protocol or steps-first document's own produced_by (SPEC.md PR15, SF15), "" for a
    plan-shaped one, whose points carry theirs."""

    given: Any
    raw: Any
    format: str
    points: tuple
    source: str
    repath: Optional[Callable[[str], str]] = field(default=None, compare=False, repr=False)
    digest: str = ""

    @property
    def model(self):
        """The document's model block (shapes.Model); never swept."""
        return self.points[0].document.model


@contextlib.contextmanager
def own_paths(document: Optional[Document]) -> Iterator[None]:
    """A refusal raised inside names the document's own paths: a protocol or steps-first document's, not
    those of the plan-shaped document it was lowered to (SPEC.md PR19, SF14)."""
    try:
        yield
    except Refusal as refusal:
        if document is not None and document.repath is not None:
            refusal.path = document.repath(refusal.path)
        raise


def read(document: Any) -> Document:
    """The one pass before compile (D21): a path's text or a dict's JSON read (reader.py), lowered when it
    is a protocol or steps-first document, and each point validated once (points_of)."""
    if isinstance(document, dict):
        given, source = reader.load_json(reader.json_text(document), "document"), "<dict>"
    elif isinstance(document, (str, os.PathLike)):
        source = os.fspath(document)
        given = reader.load_json(reader.file_text(source), source)
    else:
        raise Refusal(f"read takes a path or a dict, got {type(document).__name__}; pass the document's file "
                      "or its JSON as a dict", path="document", stage="validation")
    format_name, raw, repath = lowered(given)  # the lowering's own refusals name the document's own paths
    read_so_far = Document(given=given, raw=raw, format=format_name, points=(), source=source, repath=repath)
    with own_paths(read_so_far):
        points = tuple(points_of(raw))
    own = {"protocol": protocol.digest, "steps-first": stepsfirst.digest}.get(format_name)
    return replace(read_so_far, points=points, digest=own(given) if own else "")


def lowered(given: Any) -> tuple[str, Any, Optional[Callable[[str], str]]]:
    """(format, the plan-shaped document, its paths' map back): a protocol or a steps-first document is
    lowered (protocol.py, SPEC.md §10; stepsfirst.py, §15)."""
    format_name = protocol.format_of(given)
    if format_name == "steps-first":
        lowering = stepsfirst.lower(given)
        return format_name, lowering.plan, lowering.path
    if format_name == "protocol":
        return format_name, protocol.lower(given)[0], protocol.protocol_path
    return format_name, given, None
