"""Schema: the document format as a JSON Schema (draft 2020-12), plain data.

It states the shape validate.py checks (SPEC.md §1 Documents, §2 Positions, §3 Locations):
every object closed (D2), the types of every field (D3), one cut per position (P4), the
metric columns per kind (D14), and the sweep wrapper `{"sweep": [...] | {"range": [...]},
"as": ...}` wherever a field other than `model` and `header` may be swept (D17). What
needs the model, the data or cross-references (undeclared names, widths, layers past the
stack, refusals by name of what is not implemented) is validate.py's and compile.py's,
not the schema's: a document the schema accepts may still be refused, never the reverse
for a shipped document. `python -m causalab_ref schema` prints it.
"""
from __future__ import annotations

import copy
from typing import Any

from .metrics import KINDS, TOKEN_FORMS


def _sw(shape: dict) -> dict:
    """A field that may also be a sweep wrapper (D17)."""
    return {"anyOf": [shape, {"$ref": "#/$defs/sweep"}]}


def _closed(properties: dict, required: tuple = ()) -> dict:
    out = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        out["required"] = list(required)
    return out


def _named(shape: dict) -> dict:
    return {"type": "object", "additionalProperties": _sw(shape)}


STR = {"type": "string"}
INT = {"type": "integer"}
NUMBER = {"type": "number"}
INDEX_LIST = {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"type": "integer", "minimum": 0}}

_CUT_ONE = {
    "oneOf": [{"required": [c], "properties": {c: {"not": {"enum": [None, False]}}}}
              for c in ("index", "span", "last", "all")]
}

_POSITION = {
    "anyOf": [
        INT,
        {**_closed({
            "index": _sw(INT),
            "span": _sw({"type": "array", "minItems": 2, "maxItems": 2, "items": INT}),
            "last": _sw({"type": "integer", "minimum": 1}),
            "all": _sw({"const": True}),
            "frame": _sw({"enum": ["prompt", "generated"]}),
            "scope": _sw({"anyOf": [{"type": "null"}, {**_closed({"variable": _sw(STR), "segment": _sw(STR)}),
                                                       "minProperties": 1}]}),
        }), "allOf": [_CUT_ONE]},
    ]
}


def _metric(kind: str) -> dict:
    row = KINDS[kind]
    props = {"kind": {"const": kind}, "of": _sw(STR), "token_form": _sw({"enum": list(TOKEN_FORMS)})}
    props.update({c: _sw(STR) for c in row.columns + row.reads})
    props.update({p: _sw({"type": "integer", "minimum": 1}) for p, _default in row.params})
    return _closed(props, ("kind", "of") + row.columns + row.reads)


SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "causalab_ref/document.schema.json",
    "title": "causalab_ref document",
    "description": "A plan-shaped intervention document (SPEC.md §1 Documents, §2 Positions, §3 Locations).",
    "$defs": {
        "sweep": _closed({
            "sweep": {"anyOf": [{"type": "array", "minItems": 1},
                                _closed({"range": {"type": "array", "minItems": 2, "maxItems": 3, "items": INT}},
                                        ("range",))]},
            "as": STR,
        }, ("sweep",)),
        "position": _POSITION,
        "site": _closed({
            "component": _sw(STR),
            "layers": _sw({"anyOf": [{"type": "null"}, {"const": "all"},  # every layer, one point each (D34)
                                     {"type": "array", "minItems": 1, "maxItems": 1,
                                      "items": {"type": "integer"}}]}),  # a layer's range is the model's (L3)
            "heads": _sw({"anyOf": [{"type": "null"}, INDEX_LIST]}),
            "units": _sw({"anyOf": [{"type": "null"}, INDEX_LIST]}),
        }, ("component",)),
        "read": _closed({
            "site": _sw(STR), "pos": _sw({"$ref": "#/$defs/position"}), "input": _sw(STR), "model": _sw(STR),
            "featurizer": _sw(STR), "view": _sw({"enum": ["raw", "logits"]}),
        }, ("site", "pos", "input")),
        "write": _closed({
            "site": _sw(STR), "pos": _sw({"$ref": "#/$defs/position"}),
            "mechanism": _sw({"enum": ["swap", "add_scaled", "lerp", "gaussian", "clamp", "renormalize"]}),
            "operand": _sw({"anyOf": [STR, {"type": "number"}, {"type": "null"}, _closed({"ref": STR}, ("ref",))]}),
            "featurizer": _sw(STR), "features": _sw({"anyOf": [{"type": "null"}, {"type": "array", "items": INT}]}),
            "params": _sw({"type": "object", "additionalProperties": _sw({"type": "number"})}),
        }, ("site", "pos", "mechanism")),
        "metric": {"oneOf": [_metric(k) for k in KINDS]},
        "intervention": _closed({
            "reads": _sw({**_named({"$ref": "#/$defs/read"}), "minProperties": 1}),
            "writes": _sw(_named({"$ref": "#/$defs/write"})),
            "models": _sw(_named(_closed({"input": _sw(STR), "writes": _sw({"type": "array", "items": _sw(STR)})},
                                         ("input", "writes")))),
            "metrics": _sw(_named({"$ref": "#/$defs/metric"})),
            "decode": _sw({"type": "integer", "minimum": 0}),
        }, ("reads",)),
        "save": _closed({"value": _sw(STR), "file_path": _sw({"type": "string", "pattern": r"\.(json|safetensors)$"})},
                        ("value", "file_path")),
        "featurizer": _closed({
            "kind": _sw({"enum": ["subspace", "pca", "gate", "sae", "linear"]}),
            "k": _sw({"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 1}]}),
            "parametrization": _sw({"const": "cayley"}),
            "seed": _sw({"anyOf": [{"type": "null"}, INT]}),
            "file_path": _sw({"anyOf": [{"type": "null"}, STR]}),
        }, ("kind",)),
        "step": {"oneOf": [
            _closed({
                "kind": _sw({"const": "observe"}),
                "rows": _sw(_named(STR)),
                "interventions": _sw({"anyOf": [STR, {"$ref": "#/$defs/intervention"},
                                                {"type": "array", "minItems": 1,
                                                 "items": {"anyOf": [STR, {"$ref": "#/$defs/intervention"}]}}]}),
                "intervention": _sw(STR),
                "outputs": _sw(_named({"anyOf": [STR, _closed({
                    "read": _sw(STR), "reduce": _sw({"enum": ["none", "mean", "pca"]}),
                    "k": _sw({"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 1}]})}, ("read",))]})),
                "saves": _sw({"type": "array", "items": _sw({"$ref": "#/$defs/save"})}),
            }, ("kind", "rows")),
            _closed({
                "kind": _sw({"const": "fit"}),
                "rows": _sw(_named(STR)),
                "interventions": _sw(STR), "intervention": _sw(STR),
                "params": _sw({"type": "array", "minItems": 1, "items": _sw(STR)}),
                "objective": _sw({"type": "array", "minItems": 1, "items": _sw({
                    "type": "array", "minItems": 2, "maxItems": 2,
                    "prefixItems": [_sw({"type": "number"}), _sw(STR)]})}),
                "anneal": _sw(_named(_closed({"start": _sw(NUMBER), "end": _sw(NUMBER)}, ("start", "end")))),
                "epochs": _sw({"type": "integer", "minimum": 1}),
                "pairs": _sw({"type": "integer", "minimum": 1}),
                "seed": _sw(INT),
                "optimizer": _sw(_closed({"name": _sw({"const": "adamw"}), "lr": _sw(NUMBER),
                                          "weight_decay": _sw(NUMBER)}, ("name", "lr"))),
                "early_stop": _sw(_closed({"metric": _sw(STR), "mode": _sw({"enum": ["max", "min"]}),
                                           "patience": _sw({"type": "integer", "minimum": 1})},
                                          ("metric", "patience"))),
                "eval": _sw(_closed({"rows": _sw(_named(STR)),
                                     "saves": _sw({"type": "array", "items": _sw({"$ref": "#/$defs/save"})})},
                                    ("rows",))),
                "saves": _sw({"type": "array", "items": _sw({"$ref": "#/$defs/save"})}),
            }, ("kind", "rows", "params", "objective", "epochs", "pairs", "optimizer", "early_stop", "eval")),
            _closed({
                "kind": _sw({"const": "weights"}),
                "names": _sw({"type": "array", "minItems": 1, "items": _sw(STR)}),
                "saves": _sw({"type": "array", "items": _sw({"$ref": "#/$defs/save"})}),
            }, ("kind", "names")),
        ]},
    },
    **_closed({
        "header": _closed({"description": STR}),
        "model": _closed({
            "key": STR, "revision": STR, "dtype": {"enum": ["fp32", "bf16"]},
            "attn_implementation": {"enum": ["eager", "sdpa", None]},
        }, ("key", "revision", "dtype")),
        "roles": _sw({**_named(_closed({"field": _sw(STR)}, ("field",))), "minProperties": 1}),
        "sites": _sw(_named({"$ref": "#/$defs/site"})),
        "featurizers": _sw({"type": "object"}),
        "interventions": _sw(_named({"$ref": "#/$defs/intervention"})),  # may be empty: written in place (M22)
        "steps": _sw({**_named({"$ref": "#/$defs/step"}), "minProperties": 1}),
    }, ("model", "roles", "sites", "interventions", "steps")),
}


def schema() -> dict:
    """The document format as a JSON Schema (a fresh copy)."""
    return copy.deepcopy(SCHEMA)
