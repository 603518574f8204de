"""The JSON reader: a document's or a data file's text -> plain JSON values, and back.

`parse` turns text into values or `Malformed` (broken JSON with its line and column, text
that is not Unicode, nesting too deep, a key named twice, a number that is not one);
`load_json` is `parse` for a document, whose problems are validation Refusals; `digest` is the canonical bytes
of a lowered document hashed (its `produced_by`, SPEC.md D19); `type_name` names a JSON
value's kind for refusals. SPEC.md §1 Documents and §7 Safety.
"""
from __future__ import annotations

import hashlib
import json
import math
import pathlib
from dataclasses import dataclass
from typing import Any, Optional

from ..shapes import Refusal


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


MAX_DIGITS = 4300  # Python's own bound on converting a digit string to an int


class Malformed(ValueError):
    """What is wrong with a JSON text. `at` is the dotted path inside it of the offending key or
    value ("" for the top level), or None when the text as a whole cannot be read; `cause` is the
    parser's own error, if any."""

    def __init__(self, message: str, at: Optional[str] = None, cause: Optional[Exception] = None):
        super().__init__(message)
        self.message, self.at, self.cause = message, at, cause


@dataclass(frozen=True)
class _Bad:
    """A number the reader refuses, left in place while parsing so that its path can be named."""
    why: str


class _Duplicated(dict):
    """An object that named a key twice (the parser keeps the last); `key` is the first repeated one."""
    key: str = ""


def _number_hooks(seen: list):
    def big_int(digits: str):
        if len(digits.lstrip("-")) > MAX_DIGITS:
            seen.append(True)
            return _Bad(f"malformed number: an integer of {len(digits.lstrip('-'))} digits; a number has at most "
                        f"{MAX_DIGITS} digits")
        return int(digits)

    def finite_float(text: str):
        value = float(text)
        if math.isinf(value):
            seen.append(True)
            return _Bad(f"malformed number: {text[:40]} is beyond the range of a 64-bit float")
        return value

    def constant(name: str):  # NaN, Infinity, -Infinity: Python reads them, JSON has none
        seen.append(True)
        return _Bad(f"malformed number: {name} is not a JSON number (JSON has no NaN or Infinity)")
    return big_int, finite_float, constant


def _pairs_hook(seen: list):
    def pairs(items: list) -> dict:
        obj: dict = {}
        repeated = None
        for key, value in items:
            if key in obj and repeated is None:
                repeated = key
            obj[key] = value
        if repeated is None:
            return obj
        seen.append(True)
        marked = _Duplicated(obj)
        marked.key = repeated
        return marked
    return pairs


def _first_problem(value: Any) -> Optional[tuple[str, str]]:
    """(dotted path, message) of the first refused key or number in reading order, iteratively."""
    stack: list[tuple[Any, tuple]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, _Bad):
            return ".".join(path), node.why
        if isinstance(node, _Duplicated):
            return ".".join(path + (node.key,)), (
                f"duplicate key '{node.key}': an object names each key once, and a second one would silently "
                "replace the first; remove or rename one of them")
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack += [(child, path + (str(key),)) for key, child in reversed(list(children))]
    return None


#: the deepest a JSON text may nest (R14): deep enough for any document or table, and shallow enough that every
#: later walk of one (the digest's, the sweeps', the validator's) stays far inside Python's recursion limit
MAX_DEPTH = 100


def _depth(value: Any) -> int:
    """How deeply objects and lists nest in `value` (a scalar 0), level by level; it stops at the first level
    past MAX_DEPTH, so any deeper text answers MAX_DEPTH + 1."""
    depth, level = 0, [value]
    while depth <= MAX_DEPTH:
        level = [node for node in level if isinstance(node, (dict, list))]
        if not level:
            return depth
        depth += 1
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)]
    return depth


def parse(text: str) -> Any:
    """JSON text -> plain values, or Malformed: broken JSON, a lone surrogate, nesting too deep, a key
    named twice in one object, an integer of more than 4300 digits, NaN, Infinity or an overflowing
    float (SPEC.md S40-S42)."""
    seen: list = []
    big_int, finite_float, constant = _number_hooks(seen)
    try:
        raw = json.loads(text, object_pairs_hook=_pairs_hook(seen), parse_int=big_int, parse_float=finite_float,
                         parse_constant=constant)
        json.dumps(raw, ensure_ascii=False, default=str).encode("utf-8")  # a lone surrogate is JSON but not text
    except UnicodeEncodeError as error:
        raise Malformed(f"holds a string that is not valid Unicode text ({error.reason})", cause=error) from None
    except json.JSONDecodeError as error:
        raise Malformed(f"is not JSON: {error.msg} at line {error.lineno} column {error.colno}",
                        cause=error) from None
    except RecursionError as error:
        raise Malformed("nests too deeply to read", cause=error) from None
    if _depth(raw) > MAX_DEPTH:
        raise Malformed("nests too deeply to read")
    if seen:
        problem = _first_problem(raw)
        if problem is not None:
            raise Malformed(problem[1], at=problem[0])
    return raw


def load_json(text: str, path: str = "document") -> Any:
    """A document's text -> its JSON, or one validation Refusal: a text that cannot be read names the
    file (with line and column for broken JSON), a refused key or number names its dotted path."""
    try:
        return parse(text)
    except Malformed as bad:
        if bad.at is None:
            raise Refusal(f"{path} {bad.message}", stage="validation") from None
        raise Refusal(bad.message, path=bad.at, stage="validation") from None


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
    return canonical_sha256(body)


def canonical_sha256(value: Any) -> str:
    """sha256 of `value` as compact JSON with its keys sorted: the one text every document digest hashes."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def file_text(path: str) -> str:
    """A document file's text; missing, unreadable or not UTF-8 is a validation Refusal naming the path."""
    file = pathlib.Path(path)
    try:
        if not file.is_file():
            raise Refusal(f"no document at {path}", path="document", stage="validation")
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:  # unreadable, or a name the file system will not take
        raise Refusal(f"cannot read {path}: {error}", path="document", stage="validation") from None


def json_text(document: dict) -> str:
    """A dict document as the JSON text it stands for; a value JSON has no spelling for (a key that is not a
    string, a set, an object) is refused at its dotted path, as the reader refuses a text's faults."""
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        at, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise Refusal(f"the key {key!r} is a {type(key).__name__}; a document's keys are strings",
                                  path=at or "document", stage="validation")
                stack.append((f"{at}.{key}" if at else key, item))
        elif isinstance(value, list):
            stack.extend((f"{at}.{k}" if at else str(k), item) for k, item in enumerate(value))
        elif not (value is None or isinstance(value, (str, bool, int, float))):
            raise Refusal(f"a {type(value).__name__} is not a JSON value; a document holds objects, lists, "
                          "strings, numbers, booleans and null", path=at or "document", stage="validation")
    try:
        return json.dumps(document, ensure_ascii=False)  # NaN and Infinity come out as the reader refuses them
    except (RecursionError, ValueError) as error:
        raise Refusal(f"the document cannot be written as JSON ({type(error).__name__}); it nests too deep",
                      path="document", stage="validation") from None
