"""Sweep lowering: a document with `{"sweep": ...}` wrappers -> one (label, document) per point.

A wrapper is any object whose keys are `sweep` and optionally `as`, anywhere but in `model`
and `header`. Independent wrappers form a cross product in reading order, wrappers sharing an
`as` axis move together, and each point is labelled `<name>=<value>` joined by `,` (its folder
under --out). Lowering happens once, before validation: every point is an ordinary document.
A site's `"layers": "all"` is a sweep whose length only the model knows: `with_layers(raw, n)` writes it
as `{"sweep": [[0], ..., [n-1]], "as": "layers"}` once compile knows the model's n layers (validate.py
checks the document before that with n = 1). SPEC.md §1 Documents (D17, D18, D34-D37).

    sweeps.with_layers({"sites": {"resid": {"component": "block_output", "layers": "all"}}, ...}, 2)
    # sites.resid.layers == {"sweep": [[0], [1]], "as": "layers"}: the points layers=0 and layers=1
"""
from __future__ import annotations

import itertools
import json
from typing import Any, NoReturn

from .names import inside_out
from .reader import type_name
from ..shapes import Refusal

MAX_POINTS = 10_000
ALL = "all"  # a site's layers: every layer of the model, one sweep point each (D34)
AXIS = "layers"  # the axis those points are on, so they are labelled layers=0, layers=1, ... (D18)


def _fail(path: str, message: str) -> NoReturn:
    raise Refusal(message, path=path, stage="validation")


def is_wrapper(raw: Any) -> bool:
    """A `{"sweep": ..., "as"?: ...}` wrapper (D17)."""
    return isinstance(raw, dict) and "sweep" in raw and set(raw) <= {"sweep", "as"}


def find_wrappers(raw: Any, path: tuple) -> list:
    found = []
    if is_wrapper(raw):
        return [(path, raw)]
    if isinstance(raw, dict):
        for key, value in raw.items():
            found += find_wrappers(value, path + (key,))
    elif isinstance(raw, list):
        for k, value in enumerate(raw):
            found += find_wrappers(value, path + (k,))
    return found


def _sweep_values(wrapper: dict, swept: str) -> list:
    values = wrapper["sweep"]
    if isinstance(values, dict):
        for key in values:
            if key != "range":
                _fail(f"{swept}.sweep.{key}", f"unknown key '{key}'; allowed here: ['range']")
        if "range" not in values:
            _fail(f"{swept}.sweep.range", "required field is missing")
        bounds = values["range"]
        if (not isinstance(bounds, list) or len(bounds) not in (2, 3)
                or any(isinstance(b, bool) or not isinstance(b, int) for b in bounds)
                or (len(bounds) == 3 and bounds[2] == 0)):
            _fail(f"{swept}.sweep.range", "a range is [start, stop] or [start, stop, step] of integers, step not 0")
        try:
            count = len(range(*bounds))
        except OverflowError:  # more values than a C integer counts
            count = MAX_POINTS + 1
        if count > MAX_POINTS:
            _fail(f"{swept}.sweep.range", f"a range of more than {MAX_POINTS} values; a sweep has at most "
                                          f"{MAX_POINTS} points")
        values = list(range(*bounds))
    if not isinstance(values, list) or not values:
        _fail(f"{swept}.sweep", "a sweep lists at least one value")
    if "as" in wrapper and not isinstance(wrapper["as"], str):
        _fail(f"{swept}.as", f"expected a string, got {type_name(wrapper['as'])}")
    return values


def _label_value(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return json.dumps(value, separators=(",", ":"))


def _replace(raw: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    copy: Any = dict(raw) if isinstance(raw, dict) else list(raw)
    copy[head] = _replace(raw[head], rest, value)
    return copy


def points(raw: Any) -> list[tuple[str, Any]]:
    """Lower sweep wrappers: one (label, document) per point; an unswept document is [("", raw)]."""
    return [(label, point) for label, point, _at in lowered(raw)]


def lowered(raw: Any) -> list[tuple[str, Any, dict[str, Any]]]:
    """Each point as (label, document, coordinates: axis -> value as the label shows it, SPEC.md PY9)."""
    if not isinstance(raw, dict):
        _fail("", f"a document is a JSON object, got {type_name(raw)}")
    wrappers = find_wrappers(raw, ())
    if not wrappers:
        return [("", raw, {})]
    axes: dict[str, list] = {}
    order: list[str] = []
    for path, wrapper in wrappers:
        swept = ".".join(str(p) for p in path)
        if not path:
            _fail("", "the document itself is a sweep wrapper; sweep a field inside it")
        if path[0] in ("model", "header"):
            _fail(swept, f"{swept} is swept; a sweep may not change the model or the header — "
                         "those are the identity of the run, not a coordinate in it")
        values = _sweep_values(wrapper, swept)
        name = wrapper.get("as") or next(str(p) for p in reversed(path) if isinstance(p, str))
        key = f"as:{wrapper['as']}" if "as" in wrapper else f"path:{swept}"
        if key not in axes:
            axes[key] = []
            order.append(key)
        members = axes[key]
        if members and len(members[0][2]) != len(values):
            _fail(swept, f"the axis '{name}' moves {len(members[0][2])} values here and {len(values)} there; "
                         "wrappers on one axis have equal lengths")
        members.append((path, name, values))
    total = 1
    for key in order:
        total *= len(axes[key][0][2])
    if total > MAX_POINTS:
        _fail(".".join(str(p) for p in wrappers[0][0]), f"the sweeps make {total} points; a sweep has at most "
                                                         f"{MAX_POINTS} points")
    result = []
    for choice in itertools.product(*(range(len(axes[k][0][2])) for k in order)):
        point, labels = raw, []
        at: dict[str, Any] = {}
        for key, k in zip(order, choice):
            members = axes[key]
            name = members[0][1]
            at[name if name not in at else f"{name}_{len(at) + 1}"] = json.loads(_label_value(members[0][2][k]))
            labels.append(f"{members[0][1]}={_label_value(members[0][2][k])}")
            inside_out(labels[-1], ".".join(str(p) for p in members[0][0]), "the sweep point's folder", True)
            for path, _name, values in members:
                point = _replace(point, path, values[k])
        label = ",".join(labels)
        # The label is the point's folder under --out (SPEC.md R6, R12).
        inside_out(label, ".".join(str(p) for p in axes[order[0]][0][0]), "the sweep point's folder", True)
        result.append((label, point, at))
    return result


def every_layer(raw: Any) -> list[str]:
    """The declared sites whose `layers` is "all", in order (D34)."""
    sites = raw.get("sites") if isinstance(raw, dict) else None
    if not isinstance(sites, dict):
        return []
    return [name for name, site in sites.items() if isinstance(site, dict) and site.get("layers") == ALL]


def with_layers(raw: Any, count: int) -> Any:
    """The document with each `layers: "all"` written as a sweep over the model's `count` layers, every such
    site on the one axis `layers` (D34-D36); a document without one is returned as it is."""
    names = every_layer(raw)
    if not names:
        return raw
    for path, wrapper in find_wrappers(raw, ()):
        name = wrapper.get("as") or next((p for p in reversed(path) if isinstance(p, str)), "")
        if name == AXIS:
            _fail(".".join(str(p) for p in path), f'site \'{names[0]}\' has layers "all", which sweeps the axis '
                                                  f"'{AXIS}' itself; this sweep is on that axis too: sweep the "
                                                  "layers one way, or name this axis otherwise with \"as\"")
    if count < 1:
        _fail(f"sites.{names[0]}.layers", f'layers "all" needs a model with layers; this one has {count}')
    wrapper = {"sweep": [[layer] for layer in range(count)], "as": AXIS}
    return dict(raw, sites={name: dict(site, layers=wrapper) if name in names else site
                            for name, site in raw["sites"].items()})


def bound_layers(raw: Any, folds: int, count: int) -> None:
    """The points a document with layers "all" compiles, each point of its other sweeps at every layer, are at
    most MAX_POINTS (D17, D36), counted before any is made."""
    if folds * count > MAX_POINTS:
        _fail(f"sites.{every_layer(raw)[0]}.layers", f"the sweeps make {folds * count} points; a sweep has at most "
                                                     f"{MAX_POINTS} points")


def every_layer_allows(doc: Any, names: list[str]) -> None:
    """What a read at every layer may not be (D34): it is read and scored, one value with a layer axis. A write
    at an "all" site, a featurized read of one, an operand or a step output of one, and a featurizer or a fit in
    the document are each refused at their path, naming the sweep that writes one experiment per layer."""
    every = set(names)
    sweep = 'sweep the layers instead ({"sweep": [[0], [1], ...]}), one experiment per layer'
    for f_name, _f in doc.featurizers:
        _fail(f"featurizers.{f_name}", f'featurizer \'{f_name}\' in a document with layers "all": a featurizer is '
                                       f"one parameter set at one site, and a read at every layer is many; {sweep}")
    for i_name, iv in doc.interventions:
        at_every = {r for r, read in iv.reads if read.site in every}
        for r, read in iv.reads:
            if read.site in every and read.featurizer != "identity":
                _fail(f"interventions.{i_name}.reads.{r}.featurizer",
                      f"read '{r}' is at every layer of site '{read.site}' and takes no featurizer; {sweep}")
        for w, write in iv.writes:
            if write.site in every:
                _fail(f"interventions.{i_name}.writes.{w}.site",
                      f"write '{w}' is at site '{write.site}', whose layers are \"all\": a write at every layer is "
                      f"as many experiments; {sweep}")
            if isinstance(write.operand, str) and write.operand in at_every:
                _fail(f"interventions.{i_name}.writes.{w}.operand",
                      f"write '{w}' takes '{write.operand}', a read at every layer, as its operand; an operand is "
                      f"one value at one layer; {sweep}")
    for s_name, step in doc.steps:
        if step.kind != "observe":
            _fail(f"steps.{s_name}", f"step '{s_name}' is a {step.kind} step in a document with layers \"all\"; "
                                     f"a read at every layer is scored, not trained on; {sweep}")
        reads = {r: read for i_name in step.interventions for r, read in dict(doc.interventions)[i_name].reads}
        for o_name, output in step.outputs:
            if output.read in reads and reads[output.read].site in every:
                _fail(f"steps.{s_name}.outputs.{o_name}",
                      f"output '{o_name}' keeps '{output.read}', a read at every layer; score it with a metric "
                      f"(its table has a row per layer and example), or {sweep}")
