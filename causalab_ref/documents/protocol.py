"""Protocol: the language's second authoring format (protocol_version "3"), read as a narrow subset.

`format_of(raw)` tells the formats apart by their top level: a `method` (or a `data` block with no
`steps`) is the protocol format, a `data` block beside `steps` is the later steps-first format
(read by stepsfirst.py), anything else is plan-shaped. `lower(raw)` checks a protocol document
against the subset SPEC.md §10 states and rewrites it as the plan-shaped document it
means (one intervention, `method`, and one observe step, `observe`), so it is validated,
compiled and run by the one plan-shaped pipeline; it also returns the protocol's own digest
(the raw document with its header reduced to `protocol_version`, SPEC.md PR15), which the plan's
`produced_by` takes. `protocol_path` maps a plan-shaped document path in a refusal back to
the protocol document's own (`interventions.method.reads.v_cf` -> `method.reads.v_cf`).
Everything outside the subset is refused by name. SPEC.md §10 (PR1-PR19).
"""
from __future__ import annotations

import json
import re
from typing import Any, NoReturn

from . import sweeps
from .fields import first_unknown, strict_object
from .reader import canonical_sha256, type_name
from ..shapes import Refusal

VERSION = "3"
INTERVENTION = "method"
STEP = "observe"
TOP = ("header", "model", "data", "method")
SECTIONS = ("sites", "reads", "writes", "intervened_models", "featurizers", "metrics", "train", "save")
#: parts of the full protocol the reader does not implement, refused by name
UNIMPLEMENTED = {
    "segments": "method sections segments, positions, params and code are not implemented by causalab_ref's "
                "protocol reader; write the document plan-shaped",
    "featurizers": "featurizers in a protocol document are not implemented by causalab_ref's protocol reader; "
                   "write the document plan-shaped",
    "train": "a train section (fitting a featurizer) is not implemented by causalab_ref's protocol reader; "
             "write the document plan-shaped",
    "path_patching": "path patching is protocol sugar causalab_ref's protocol reader does not implement; "
                     "write the reads and writes it stands for",
    "at_once": "at_once is protocol sugar causalab_ref's protocol reader does not implement; "
               "write the reads and writes it stands for",
    "axes": "axes (the protocol's sweep sugar) is not read by causalab_ref's protocol reader; "
            "sweep the field in a plan-shaped document",
}
for _name in ("positions", "params", "code"):
    UNIMPLEMENTED[_name] = UNIMPLEMENTED["segments"]
PER_MODEL = ("input_ids", "embeddings", "ln_final", "lm_head", "logits")
METRIC_COLUMNS = {"match": ("expected",), "logit_diff": ("a", "b"), "cross_entropy": ("target",),
                  "token_logit": ("token",), "token_prob": ("token",)}


def _fail(path: str, message: str) -> NoReturn:
    raise Refusal(message, path=path, stage="validation")


def format_of(raw: Any) -> str:
    """'protocol', 'steps-first' or 'plan-shaped', from the document's top level alone (PR1)."""
    if not isinstance(raw, dict):
        return "plan-shaped"
    if "data" in raw and "steps" in raw:
        return "steps-first"
    if "method" in raw or ("data" in raw and "steps" not in raw):
        return "protocol"
    return "plan-shaped"


def _keys(raw: Any, path: str, allowed: tuple, required: tuple = ()) -> dict:
    """fields.strict_object, what the protocol has but this reader does not implement refused by name."""
    key = first_unknown(raw, allowed)  # refused by name here, else by strict_object as unknown
    if key in UNIMPLEMENTED:
        _fail(f"{path}.{key}" if path else key, UNIMPLEMENTED[key])
    return strict_object(raw, path, allowed, required)


def _named(raw: Any, path: str) -> dict:
    if not isinstance(raw, dict):
        _fail(path, f"expected an object of named entries, got {type_name(raw)}")
    return raw


def digest(raw: dict) -> str:
    """The protocol's produced_by: sha256 of the raw document with its header reduced to
    {"protocol_version": …}, keys sorted, compact separators (SPEC.md PR15)."""
    body = dict(raw, header={"protocol_version": raw["header"]["protocol_version"]})
    return canonical_sha256(body)


def _header(raw: Any) -> dict:
    header = _keys(raw, "header", ("protocol_version", "title", "description"), ("protocol_version",))
    if header["protocol_version"] != VERSION:
        _fail("header.protocol_version", f"protocol_version {json.dumps(header['protocol_version'])} is not "
                                         f"\"{VERSION}\", the one version causalab_ref's protocol reader reads")
    text = " — ".join(str(header[k]) for k in ("title", "description") if header.get(k))
    return {"description": text} if text else {}


def _model(raw: Any) -> dict:
    if isinstance(raw, dict) and "attn_implementation" in raw:
        _fail("model.attn_implementation", "the protocol format's model block takes key, revision and dtype and "
                                           "rejects anything else; attn_implementation is a field of the "
                                           "plan-shaped document's model block")
    return dict(_keys(raw, "model", ("key", "revision", "dtype"), ("key", "revision", "dtype")))


def _data(raw: Any) -> tuple[dict, dict]:
    """(plan-shaped roles, {role: dataset ref}) from the protocol's data block."""
    data = _keys(raw, "data", ("base", "counterfactual"), ("base",))
    roles, rows = {}, {}
    for role, entry in data.items():
        entry = _keys(entry, f"data.{role}", ("dataset", "field"), ("dataset", "field"))
        roles[role] = {"field": entry["field"]}
        rows[role] = entry["dataset"]
    return roles, rows


def _site(name: str, raw: Any) -> dict:
    path = f"method.sites.{name}"
    site = _keys(raw, path, ("component", "layers"), ("component",))
    component = site["component"]
    layers = site.get("layers")
    if component in PER_MODEL and layers is not None:
        _fail(f"{path}.layers", f"{component} takes no layers")
    if component not in PER_MODEL and layers is None:
        _fail(path, f"{component} is addressed at one layer")
    if isinstance(layers, list) and len(layers) > 1:
        _fail(f"{path}.layers", f"site '{name}': layers must be a one-element band; a band spanning several "
                                "layers is one address and is not implemented")
    return dict(site)


def _pos(raw: Any, path: str) -> Any:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, dict) and list(raw) == ["index"]:
        return raw
    if sweeps.is_wrapper(raw):  # a swept position: each point's value is a protocol position (PR18)
        values = raw["sweep"]
        if isinstance(values, list):
            for k, value in enumerate(values):
                _pos(value, f"{path}.sweep.{k}")
        return raw  # a range's values are integers; sweeps.py lowers and checks the wrapper itself
    _fail(path, "a protocol position is an integer or {\"index\": i}; spans, lasts, scopes and the generated "
                "frame are plan-shaped positions")


def _read(name: str, raw: Any) -> dict:
    path = f"method.reads.{name}"
    read = _keys(raw, path, ("site", "pos", "model", "input", "featurizer"), ("site", "pos", "model", "input"))
    if read.get("featurizer", "identity") != "identity":
        _fail(f"{path}.featurizer", UNIMPLEMENTED["featurizers"])
    return {"site": read["site"], "pos": _pos(read["pos"], f"{path}.pos"), "model": read["model"],
            "input": read["input"]}


def _write(name: str, raw: Any, reads: dict) -> dict:
    path = f"method.writes.{name}"
    write = _keys(raw, path, ("site", "pos", "do"), ("site", "pos", "do"))
    do = write["do"]
    if not isinstance(do, dict) or len(do) != 1:
        _fail(f"{path}.do", "do names one mechanism and its operand, {\"swap\": <read name>}")
    mechanism, operand = next(iter(do.items()))
    if mechanism != "swap":
        _fail(f"{path}.do.{mechanism}", f"mechanism '{mechanism}' is not implemented by causalab_ref's protocol "
                                        "reader; the one mechanism there is swap")
    if not isinstance(operand, str) or operand not in reads:
        _fail(f"{path}.do.swap", f"the operand of swap is a read name of this method, got {json.dumps(operand)}")
    return {"site": write["site"], "pos": _pos(write["pos"], f"{path}.pos"), "mechanism": "swap",
            "operand": operand}


def _models(raw: Any, writes: dict) -> dict:
    models = _named(raw, "method.intervened_models")
    out: dict = {}
    used: set[str] = set()
    for name, entry in models.items():
        path = f"method.intervened_models.{name}"
        entry = _keys(entry, path, ("input", "writes"), ("input", "writes"))
        names = entry["writes"] if isinstance(entry["writes"], list) else []
        places = [json.dumps([writes[w]["site"], writes[w]["pos"]], sort_keys=True) for w in names
                  if isinstance(w, str) and w in writes]
        if len(set(places)) != len(places):
            _fail(f"{path}.writes", f"model '{name}' has two writes at one site and position; a protocol model "
                                    "writes each place at most once")
        used.update(w for w in names if isinstance(w, str))
        out[name] = {"input": entry["input"], "writes": entry["writes"]}
    for name in writes:
        if name not in used:
            _fail(f"method.writes.{name}", f"write '{name}' is in no intervened model; every write of a protocol "
                                           "document is in one")
    return out


def _metrics(raw: Any) -> dict:
    out = {}
    for name, entry in _named(raw, "method.metrics").items():
        path = f"method.metrics.{name}"
        kind = entry.get("kind") if isinstance(entry, dict) else None
        columns = METRIC_COLUMNS.get(kind, ()) if isinstance(kind, str) else ()
        entry = _keys(entry, path, ("kind", "of", "token_form") + columns, ("kind", "of", "token_form") + columns)
        out[name] = dict(entry)
    return out


def _saves(raw: Any, metrics: dict, reads: dict) -> list:
    """The flat save list: each entry restates its metric's binding (model, input) (PR12)."""
    if not isinstance(raw, list):
        _fail("method.save", "expected a list of saves")
    out = []
    for k, entry in enumerate(raw):
        path = f"method.save.{k}"
        if isinstance(entry, dict) and "site" in entry:
            _fail(f"{path}.site", UNIMPLEMENTED["featurizers"])
        entry = _keys(entry, path, ("value", "model", "input", "file_path"), ("value", "model", "input", "file_path"))
        metric = metrics.get(entry["value"]) if isinstance(entry["value"], str) else None
        if metric is None:
            _fail(f"{path}.value", f"save '{entry['value']}' is not a metric of this method (its metrics are "
                                   f"{sorted(metrics)})")
        read = reads.get(metric["of"], {}) if isinstance(metric["of"], str) else {}
        if (entry["model"], entry["input"]) != (read.get("model"), read.get("input")):
            _fail(path, f"save '{entry['value']}' says model '{entry['model']}' on '{entry['input']}', and its "
                        f"metric reads '{metric['of']}' in model '{read.get('model')}' on '{read.get('input')}'; "
                        "a protocol save restates its metric's binding")
        out.append({"value": entry["value"], "file_path": entry["file_path"]})
    unsaved = sorted(set(metrics) - {s["value"] for s in out})
    if unsaved:
        _fail("method.save", f"metrics {unsaved} are never saved; every metric of a protocol document is saved")
    return out


def lower(raw: Any) -> tuple[dict, str]:
    """(the plan-shaped document a protocol document means, the protocol's digest) (PR2-PR15)."""
    top = _keys(raw, "", TOP, TOP)
    header = _header(top["header"])
    model = _model(top["model"])
    roles, rows = _data(top["data"])
    method = _keys(top["method"], "method", SECTIONS, ("sites", "reads", "metrics", "save"))
    for section in ("featurizers", "train"):  # in the subset's grammar, not implemented here
        if section in method:
            _fail(f"method.{section}", UNIMPLEMENTED[section])
    sites = {name: _site(name, s) for name, s in _named(method["sites"], "method.sites").items()}
    reads = {name: _read(name, r) for name, r in _named(method["reads"], "method.reads").items()}
    writes = {name: _write(name, w, reads) for name, w in _named(method.get("writes", {}), "method.writes").items()}
    models = _models(method.get("intervened_models", {}), writes)
    metrics = _metrics(method["metrics"])
    saves = _saves(method["save"], metrics, reads)
    plan = {"model": model, "roles": roles, "sites": sites,
            "interventions": {INTERVENTION: {"reads": reads, "writes": writes, "models": models, "metrics": metrics}},
            "steps": {STEP: {"kind": "observe", "interventions": INTERVENTION, "rows": rows, "saves": saves}}}
    if header:
        plan = {"header": header, **plan}
    return plan, digest(top)


_PATHS = (
    (rf"^interventions\.{INTERVENTION}\.models(?=\.|$)", "method.intervened_models"),
    (rf"^interventions\.{INTERVENTION}\.writes\.([^.]+)\.operand$", r"method.writes.\1.do.swap"),
    (rf"^interventions\.{INTERVENTION}\.writes\.([^.]+)\.mechanism$", r"method.writes.\1.do"),
    (rf"^interventions\.{INTERVENTION}(?=\.|$)", "method"),
    (r"^sites(?=\.|$)", "method.sites"),
    (r"^roles(?=\.|$)", "data"),
    (rf"^steps\.{STEP}\.rows\.([^.]+)$", r"data.\1.dataset"),
    (rf"^steps\.{STEP}\.saves(?=\.|$)", "method.save"),
    (rf"^steps(\.{STEP})?(?=\.|$)", "method"),
)


def protocol_path(path: str) -> str:
    """The protocol document's path for a path of the plan-shaped document it was lowered to (PR19)."""
    for pattern, replacement in _PATHS:
        new, count = re.subn(pattern, replacement, path)
        if count:
            return new
    return path
