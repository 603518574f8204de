"""Places: what a site, a read, a write and a position say, each field checked on its own.

A site names a component and, where the component table says so, one layer and the heads or
units it slices (SPEC.md §3); a position is one cut of a frame with an optional scope (§2);
a read and a write are a site, a position and their own fields (a write's mechanism checked
against writes/mechanisms.py). How the parts of an intervention name each other is
interventions.py's; the rules of the continuation frame (`check_generated`) are here because
they depend on the position alone and the intervention's `decode`.

    from causalab_ref.documents import places
    places.where({"index": -1, "scope": {"variable": "entity"}}, "interventions.i.reads.r.pos")
    places.site({"component": "block_output", "layers": [0]}, "sites.target")
"""
from __future__ import annotations

import json
from typing import Any

from ..locations import address
from ..writes import mechanisms
from .fields import FLOAT32_MAX, choice, indices, integer, strict_object, string
from .reader import type_name
from ..shapes import CUTS, FRAMES, Anchor, Read, Ref, Refusal, Site, Where, Write


def _fail(path: str, message: str):
    raise Refusal(message, path=path, stage="validation")


# ---------------------------------------------------------------- positions


def where(raw: Any, path: str) -> Where:
    """A `pos` field: a bare integer is {"index": i}; otherwise a Where object."""
    if isinstance(raw, bool):
        _fail(path, "a position is an integer or an object, got a boolean")
    if isinstance(raw, int):
        return Where(index=raw)
    strict_object(raw, path, CUTS + ("scope", "frame"))
    named = [c for c in CUTS
             if c in raw and raw[c] is not None and raw[c] is not False]
    if len(named) != 1:
        _fail(path, f"a position names exactly one of index/span/last/all, got {named}")
    frame = choice(raw.get("frame", "prompt"), f"{path}.frame", FRAMES)
    index = span = last = None
    every = False
    if "index" in named:
        index = integer(raw["index"], f"{path}.index")
    elif "last" in named:
        last = integer(raw["last"], f"{path}.last")
        if last <= 0:
            _fail(f"{path}.last", f"last {last} is not a positive number of tokens")
    elif "span" in named:
        span = _span(raw["span"], f"{path}.span")
    else:
        if raw["all"] is not True:
            _fail(f"{path}.all", "all is true or absent")
        every = True
    scope = _anchor(raw["scope"], f"{path}.scope", frame) if raw.get("scope") is not None else None
    return Where(index=index, span=span, last=last, all=every, scope=scope, frame=frame)


def _span(value: Any, path: str) -> tuple[int, int]:
    """[a, b], a forward window; a mixed-sign pair is judged against the row's length at compile."""
    if (not isinstance(value, list) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in value)):
        _fail(path, "a span is [a, b], two integers")
    a, b = value
    if (a < 0) == (b < 0) and b <= a:
        _fail(path, f"span [{a}, {b}] is not a forward window")
    return a, b


def _anchor(raw: Any, path: str, frame: str) -> Anchor:
    """A position's scope: a variable's text, a segment of the frame, or both."""
    scope_raw = strict_object(raw, path, ("variable", "segment"))
    variable = scope_raw.get("variable")
    segment = scope_raw.get("segment")
    if variable is None and segment is None:
        _fail(path, "an anchor names a variable, a segment, or both")
    if variable is not None:
        string(variable, f"{path}.variable")
    if segment is not None:
        string(segment, f"{path}.segment")
        if segment == "eos" and frame == "prompt":
            _fail(f"{path}.segment", "segment 'eos' is a run of the generated frame, not the prompt")
        if segment != "eos" and frame == "generated":
            _fail(f"{path}.segment", f"segment '{segment}' is a run of the prompt frame, not the "
                  "generated one; the continuation has one segment, 'eos'")
    return Anchor(variable=variable, segment=segment)


def check_generated(pos: Where, kind: str, name: str, decode: int, path: str, prefix: str):
    """What a read or a write may say in the continuation frame (SPEC.md P40-P42)."""
    if pos.frame != "generated":
        return
    if decode <= 0:
        _fail(path, f"{prefix}{kind} '{name}': a generated position needs `decode` > 0")
    if kind == "write":  # the cut is judged before the scope, in P42's order
        if not (pos.all or (pos.index is not None and pos.index >= 0)):
            _fail(path, f"{prefix}write '{name}': a write in the continuation frame is at a step the decode "
                        "has reached — {'index': k} with k >= 0, or {'all': true}. "
                        f"{pos.spelling()} names a cut of the finished continuation, which is something to "
                        "read and not something to write into")
        if pos.scope is not None:
            _fail(path, f"{prefix}write '{name}': a write in the continuation frame takes no scope; "
                        f"{pos.spelling()} is only known once the decode has finished")
    if pos.index is not None and pos.index >= decode:
        _fail(path, f"{prefix}{kind} '{name}': step {pos.index} of a {decode}-token decode")


# ---------------------------------------------------------------- sites


def site(raw: Any, path: str) -> Site:
    """A declared site: a component, one layer where it has layers, and the heads or units it slices."""
    strict_object(raw, path, ("component", "layers", "heads", "units"), ("component",))
    component = string(raw["component"], f"{path}.component")
    layers = heads = units = None
    if raw.get("layers") is not None:
        value = raw["layers"]
        if value == "all":  # every "all" a site declares was lowered before validation (sweeps.with_layers)
            _fail(f"{path}.layers", 'layers "all" is not a sweep value: it reads every layer of the model in one '
                                     "value; write it as the site's layers, unswept")
        if not isinstance(value, list) or not value:
            got = json.dumps(value)[:40] if isinstance(value, (int, float, str)) or value == [] else type_name(value)
            _fail(f"{path}.layers", f"layers is a one-element list, [i], got {got}; a sweep of layers sweeps such "
                                     'lists: {"sweep": [[0], [1]]} or [{"sweep": {"range": [0, 2]}}]')
        if len(value) > 1:
            _fail(f"{path}.layers", "layers must be a one-element band; a band spanning several layers is "
                                     "one address and is not implemented")
        layers = (integer(value[0], f"{path}.layers.0"),)  # a layer outside the stack is refused at compile (L3)
    if raw.get("heads") is not None and raw.get("units") is not None:
        _fail(path, "a site names heads or units, not both: they slice the same axis")
    if raw.get("heads") is not None:
        heads = indices(raw["heads"], f"{path}.heads", "heads")
    if raw.get("units") is not None:
        units = indices(raw["units"], f"{path}.units", "units")
    facts = address.TABLE.get(component)  # a name outside the table is an `extra`, judged at compile
    if facts is not None:
        address.check_layering(component, facts.layered, layers[0] if layers else None, path, "validation")
        address.check_per_head(component, facts.per_head, heads, path, "validation")
    return Site(component=component, layers=layers, heads=heads, units=units)


# ---------------------------------------------------------------- reads and writes


def read(raw: Any, path: str) -> Read:
    """A read: a site, a position and an input role, with its model, featurizer and view."""
    strict_object(raw, path, ("site", "pos", "input", "model", "featurizer", "view"), ("site", "pos", "input"))
    featurizer = string(raw.get("featurizer", "identity"), f"{path}.featurizer")
    view = choice(raw.get("view", "raw"), f"{path}.view", ("raw", "logits"))
    return Read(site=string(raw["site"], f"{path}.site"), pos=where(raw["pos"], f"{path}.pos"),
                input=string(raw["input"], f"{path}.input"),
                model=string(raw.get("model", "original"), f"{path}.model"), featurizer=featurizer, view=view)


def _operand(raw: Any, path: str):
    """A write's operand: a read name, a number, {"ref": name} (an earlier step's output), or absent."""
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, dict):
        strict_object(raw, path, ("ref",), ("ref",))
        return Ref(string(raw["ref"], f"{path}.ref"))
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        _fail(path, f"an operand is a read name, a number or {{\"ref\": …}}, got {type_name(raw)}")
    if not (abs(raw) <= FLOAT32_MAX):  # also NaN, and ints past float
        _fail(path, f"operand {raw!r:.40} is not a finite number a float32 activation can hold "
                    f"(|x| <= {FLOAT32_MAX:.6g})")
    return raw


def write(raw: Any, path: str) -> Write:
    """A write: a site, a position and a mechanism with its operand, params, featurizer and features."""
    strict_object(raw, path, ("site", "pos", "mechanism", "operand", "featurizer", "features", "params"),
                  ("site", "pos", "mechanism"))
    mechanism = choice(raw["mechanism"], f"{path}.mechanism", tuple(mechanisms.TABLE))
    operand = _operand(raw.get("operand"), f"{path}.operand")
    features = None
    if raw.get("features") is not None:
        value = raw["features"]
        if not isinstance(value, list):
            _fail(f"{path}.features", f"features is a list of feature indices, got {type_name(value)}")
        features = tuple(integer(v, f"{path}.features.{k}") for k, v in enumerate(value))
    params = raw.get("params", {})
    if not isinstance(params, dict):
        _fail(f"{path}.params", f"expected an object, got {type_name(params)}")
    mechanisms.check(mechanism, operand is not None, params, path)
    featurizer = string(raw.get("featurizer", "identity"), f"{path}.featurizer")
    return Write(site=string(raw["site"], f"{path}.site"), pos=where(raw["pos"], f"{path}.pos"),
                 mechanism=mechanism, operand=operand, featurizer=featurizer, features=features,
                 params=tuple(sorted(params.items())))
