"""The JSON reader: a document's or a data file's text -> plain JSON values, and back.

`load_json` turns text into values or one validation Refusal (broken JSON with its line
and column, text that is not Unicode, nesting too deep); `digest` is the canonical bytes
of a lowered document hashed (its `produced_by`, SPEC.md D19); `type_name` names a JSON
value's kind for refusals. SPEC.md §1 Documents and §7 Safety.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from .shapes import Refusal


def type_name(value: Any) -> str:
    """The kind of a JSON value as a refusal says it: `an integer`, `a list`, `null`, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def load_json(text: str, path: str = "document") -> Any:
    """Parse JSON, refusing broken JSON with its line and column rather than a traceback."""
    try:
        raw = json.loads(text)
        json.dumps(raw, ensure_ascii=False).encode("utf-8")  # a lone surrogate is JSON but not text
        return raw
    except UnicodeEncodeError as error:
        raise Refusal(f"{path} holds a string that is not valid Unicode text ({error.reason})",
                      stage="validation") from None
    except json.JSONDecodeError as error:
        raise Refusal(f"{path} is not JSON: {error.msg} at line {error.lineno} column {error.colno}",
                      stage="validation") from None
    except RecursionError:
        raise Refusal(f"{path} nests too deeply to read", stage="validation") from None


def canonical_pos(value: Any) -> Any:
    """A `pos` in its one spelling (SPEC.md D19): a bare integer is {"index": i}, and a field written out at
    its default (`"frame": "prompt"`, `"all": false`, a null cut or scope, a null scope key) is left out.
    A sweep of positions has each of its positions so spelled."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"index": value}
    if not isinstance(value, dict):
        return value
    if isinstance(value.get("sweep"), list):
        return {**value, "sweep": [canonical_pos(v) for v in value["sweep"]]}
    out = {k: v for k, v in value.items()
           if v is not None and not (k == "all" and v is False) and not (k == "frame" and v == "prompt")}
    if isinstance(out.get("scope"), dict):
        out["scope"] = {k: v for k, v in out["scope"].items() if v is not None}
    return out


def digest(raw: Any) -> str:
    """produced_by: sha256 of the document without its header, keys sorted, compact separators.

    Every `pos` is spelled canonically first, so `-1`, `{"index": -1}` and `{"index": -1, "frame": "prompt"}`
    are one experiment.
    """
    def expand(value: Any, key: str = "") -> Any:
        if key == "pos":
            return canonical_pos(value)
        if isinstance(value, dict):
            return {k: expand(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [expand(v) for v in value]
        return value
    body = {k: expand(v, k) for k, v in raw.items() if k != "header"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
