"""Judge: an implementation's answer against a case's expectation, as readable differences.

`compare(want, got, tolerance)` walks the expectation: a float agrees within the case's relative
tolerance over a floor (SPEC.md C6: 0.01, and 2^-126 for a metric row in `probability`, FLOORS),
every other value exactly, a dict's keys and their order too (R7); a case's `informative` fields are
skipped (C16). `compare_refusal` judges a refusal line by its stage, its path and the fixed words of
the case's catalogue template (C13). Each difference is one line, `path: expected X, got Y`.
"""
from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass
from typing import Any

from . import catalogue


#: the least magnitude a float's tolerance is relative to, by the unit of its metric table (SPEC.md C6)
FLOORS = {"probability": 2.0 ** -126, "[token, probability] list": 2.0 ** -126}  # top_k's pairs too (D28)
FLOOR = 0.01


def _shown(segs: tuple) -> str:
    text = ""
    for seg in segs:
        text += f"[{seg}]" if isinstance(seg, int) else (f".{seg}" if text else str(seg))
    return text or "<result>"


def informative(segs: tuple, patterns) -> bool:
    """True when the field at `segs` matches one of the case's `informative` patterns: dotted names,
    list indices as numbers, `*` for any one step (SPEC.md C16)."""
    parts = [str(s) for s in segs]
    for pattern in patterns:
        steps = pattern.split(".")
        if len(steps) == len(parts) and all(fnmatch.fnmatchcase(p, s) for p, s in zip(parts, steps)):
            return True
    return False


def agrees(want: float, got: float, tolerance: float, floor: float = FLOOR) -> bool:
    """|want - got| <= tolerance x max(|want|, floor) (SPEC.md C6); a non-finite `want` agrees with nothing."""
    try:
        return math.isfinite(want) and abs(want - got) <= tolerance * max(abs(want), floor)
    except OverflowError:  # an integer past float's range
        return False


@dataclass(frozen=True)
class _Rule:
    """How one case compares: its tolerance and its informative patterns."""
    tolerance: float
    informative: tuple

    def diffs(self, want: Any, got: Any, segs: tuple, floor: float = FLOOR) -> list[str]:
        if informative(segs, self.informative):
            return []
        shown_at = _shown(segs)
        if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
            if agrees(want, got, self.tolerance, floor):
                return []
            return [f"{shown_at}: expected {want!r}, got {got!r} (relative tolerance {self.tolerance})"]
        if isinstance(want, dict) and isinstance(got, dict):
            return self._dict(want, got, segs)
        if isinstance(want, list) and isinstance(got, list):
            if len(want) != len(got):
                return [f"{shown_at}: expected {len(want)} items {_short(want)}, got {len(got)} {_short(got)}"]
            return [d for k, (w, g) in enumerate(zip(want, got)) for d in self.diffs(w, g, segs + (k,), floor)]
        if type(want) is not type(got) and not (isinstance(want, int) and isinstance(got, float)
                                                and not isinstance(want, bool)):
            return [f"{shown_at}: expected {_short(want)}, got {_short(got)}"]
        return [] if want == got else [f"{shown_at}: expected {_short(want)}, got {_short(got)}"]

    def _dict(self, want: dict, got: dict, segs: tuple) -> list[str]:
        """Key by key, then the key order; a metric row's `value` has its unit's floor (FLOORS)."""
        diffs = [f"{_shown(segs + (k,))}: expected {_short(want[k])}, missing" for k in want if k not in got]
        diffs += [f"{_shown(segs + (k,))}: not expected, got {_short(got[k])}" for k in got if k not in want]
        unit = want.get("unit")
        floor = FLOORS.get(unit, FLOOR) if isinstance(unit, str) else FLOOR
        for key in want:
            if key in got:
                diffs += self.diffs(want[key], got[key], segs + (key,), floor if key == "value" else FLOOR)
        if not diffs and list(want) != list(got):
            diffs.append(f"{_shown(segs)}: keys in order {list(want)}, got {list(got)}")
        return diffs


def compare(want: Any, got: Any, tolerance: float, path: str = "", informative_fields=()) -> list[str]:
    """Readable differences: `path: expected X, got Y`. A float agrees when |want - got| <=
    tolerance x max(|want|, floor), the floor 0.01 but for a metric row's value in a unit of FLOORS
    (SPEC.md C6); everything else is exact, and a dict's key order counts (a metric table's keys are in
    a fixed order, SPEC.md R7). Informative fields are skipped."""
    segs = tuple(s for s in path.split(".") if s)
    return _Rule(tolerance, tuple(informative_fields)).diffs(want, got, segs)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 300 else text[:297] + "..."


def compare_refusal(want: dict, got: Any) -> list[str]:
    """A refusal agrees when its stage and path are the case's and its message fits the case's
    catalogue template: the fixed words in order, any text for each placeholder (SPEC.md C13)."""
    if not isinstance(got, dict):
        return [f"refusal: expected {_short(want)}, got {_short(got)}"]
    diffs = [f"refusal.{k}: expected {_short(want[k])}, got {_short(got.get(k))}"
             for k in ("stage", "path") if want.get(k) != got.get(k)]
    if not catalogue.matches(want["message"], got.get("message", "")):
        diffs.append(f"refusal.message: expected the template {_short(want['message'])}, "
                     f"got {_short(got.get('message'))}")
    return diffs
