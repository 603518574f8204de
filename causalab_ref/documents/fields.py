"""Fields: the checks of raw JSON values that every part of a document is read with.

An object's keys against those allowed and required there (`strict_object`), an object of named
entries (`mapping`), a string, an integer, one of a few choices, a list of distinct indices,
a finite number, a positive integer. Each returns the value it checked, or refuses at the
dotted path it is given (stage "validation"), so a part is read and checked in one line:

    from causalab_ref.documents.fields import choice, strict_object
    spec = strict_object(raw, "model", ("key", "dtype"), ("key",))
    dtype = choice(spec.get("dtype", "fp32"), "model.dtype", ("fp32", "bf16"))
"""
from __future__ import annotations

from typing import Any

from .names import one_segment
from .reader import type_name
from ..shapes import Refusal, nearest
from ..writes.mechanisms import SEED_RANGE

FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # float32's smallest normal number: below it a value loses its precision


def _fail(path: str, message: str):
    raise Refusal(message, path=path, stage="validation")


def strict_object(raw: Any, path: str, allowed: tuple, required: tuple = ()) -> dict:
    """An object whose every key is one of `allowed` and which has each of `required`: the one strict-object
    reader of every format (the protocol's and the steps-first reader's `_keys` first refuse by name a key
    their format has and they do not read)."""
    if not isinstance(raw, dict):
        _fail(path, f"expected an object, got {type_name(raw)}")
    for key in raw:
        if key not in allowed:
            key_path = f"{path}.{key}" if path else str(key)
            _fail(key_path, f"unknown key '{key}'; allowed here: {sorted(allowed)}{nearest(key, sorted(allowed))}")
    for key in required:
        if key not in raw:
            key_path = f"{path}.{key}" if path else key
            _fail(key_path, "required field is missing")
    return raw


def first_unknown(raw: Any, allowed: tuple) -> Any:
    """The first key of an object that is not one of `allowed` (the one `strict_object` refuses), else None."""
    return next((key for key in raw if key not in allowed), None) if isinstance(raw, dict) else None


def mapping(raw: Any, path: str, declares: bool = True) -> dict:
    """An object of named entries; when it declares names, each is one path segment (names.one_segment)."""
    if not isinstance(raw, dict):
        _fail(path, f"expected an object of named entries, got {type_name(raw)}")
    for name in raw if declares else ():
        one_segment(name, f"{path}.{name}")
    return raw


def string(raw: Any, path: str) -> str:
    if not isinstance(raw, str):
        _fail(path, f"expected a string, got {type_name(raw)}")
    return raw


def integer(raw: Any, path: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        _fail(path, f"expected an integer, got {type_name(raw)}")
    return raw


def choice(raw: Any, path: str, choices: tuple) -> str:
    string(raw, path)
    if raw not in choices:
        _fail(path, f"'{raw}' is not one of {list(choices)}{nearest(raw, choices)}")
    return raw


def indices(raw: Any, path: str, what: str) -> tuple[int, ...]:
    """A site's `heads` or `units` (`what`): a non-empty list of distinct non-negative integers."""
    message = f"{what} is a non-empty list of distinct {'head' if what == 'heads' else 'feature'} indices"
    if not isinstance(raw, list) or not raw:
        _fail(path, message)
    for k, item in enumerate(raw):
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            _fail(f"{path}.{k}", message)
    if len(set(raw)) != len(raw):
        _fail(path, message)
    return tuple(raw)


def number(raw: Any, path: str) -> float:
    """A finite number a float32 can hold, as a float."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not abs(raw) <= FLOAT32_MAX:
        _fail(path, f"expected a finite number, got {type_name(raw)}")
    return float(raw)


def positive(raw: Any, path: str, what: str, most: int = 0) -> int:
    """A positive integer; `most` (when given) bounds it, so that what it counts is bounded work."""
    value = integer(raw, path)
    if value <= 0:
        _fail(path, f"{what} {value} is not a positive number")
    if most and value > most:
        _fail(path, f"{what} {value} is more than {most:,}, the most a document may ask for")
    return value


def seed(raw: Any, path: str) -> int:
    """An integer a torch generator takes as its seed (SEED_RANGE)."""
    value = integer(raw, path)
    if not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        _fail(path, f"seed {value} is not one a torch generator takes; write a whole number in "
                    f"[{SEED_RANGE[0]}, {SEED_RANGE[1]}]")
    return value
