"""Shared forwards: a forward that several sweep points (or steps) compute identically runs once.

Two forwards compute the same thing when they run on the same rows (ids and mask) with the
same writes — same address, positions, features and mechanism, and operands that are the same
number or the same read of a forward that is itself the same. Their reads are only taps on that
one computation, so one forward with the union of the reads gives every point its values.
Compile marks such forwards (`mark`: Forward.computation, Forward.shared, which `explain`
prints); the run keeps what one forward read for the others (`Memo`). A forward that decodes,
goes through a featurizer, or writes an operand this module does not know how to compare, is
never shared; nor is a pass with gradient (a fit's).
SPEC.md §11 Performance (Q5-Q9).
"""
from __future__ import annotations

import hashlib
from array import array
from dataclasses import replace
from itertools import chain
from typing import Any, Callable, Optional

from .plan import Forward, ObservePlan, Plan, Tap


FRAMES = 4  # frames a run keeps: a sweep's points on the same rows share them; a chunked run keeps none long


def read_identity(tap: Tap) -> str:
    """What a read takes from a computation, whatever the point calls it."""
    return repr(replace(tap, name=""))


def _observes(leaf: Plan) -> list[ObservePlan]:
    """A leaf's observe steps (a fit's update and eval passes run with their own parameters)."""
    return [step for step in leaf.steps if isinstance(step, ObservePlan)]


def _rows_digest(rows: tuple) -> str:
    """The sha256 of a batch's rows of ints (ids or a mask): their count, each row's length, then every entry,
    as 8-byte integers in row order, a spelling from which the rows can be read back, so other rows give
    another digest (SPEC.md Q38)."""
    lengths = array("q", [len(rows), *map(len, rows)])
    try:
        entries = array("q", chain.from_iterable(rows))
    except (OverflowError, TypeError):  # not a plan's ids: digested as printed
        return hashlib.sha256(repr(rows).encode()).hexdigest()
    return hashlib.sha256(lengths.tobytes() + entries.tobytes()).hexdigest()


def _computation(forward: Forward, origins: dict[str, tuple[str, str]]) -> str:
    """The digest of what a forward computes ('' when it is never shared); `origins` maps each read
    name of the step so far to (its forward's computation, its read identity)."""
    if forward.decode or any(tap.featurizer != "identity" for tap in forward.taps):
        return ""  # a decode's state, or a featurizer's parameters (which a point's fit trains), are not compared
    parts: list[Any] = [_rows_digest(forward.ids), _rows_digest(forward.mask)]
    for tap in forward.taps:
        if tap.kind != "write":
            continue
        if isinstance(tap.operand, str) and origins.get(tap.operand, ("",))[0]:
            operand: Any = origins[tap.operand]
        elif isinstance(tap.operand, (int, float)) and not isinstance(tap.operand, bool):
            operand = ("number", float(tap.operand))
        else:
            return ""
        parts.append((repr(replace(tap, name="", operand=None)), operand))
    return hashlib.sha256(repr(parts).encode("utf-8", "surrogatepass")).hexdigest()


def _users(plan: Plan) -> dict[str, list[str]]:
    """Each computation's users, as `<point>/<step>` (the step alone when unswept)."""
    users: dict[str, list[str]] = {}
    for leaf in plan.leaves():
        for step in _observes(leaf):
            origins: dict[str, tuple[str, str]] = {}
            for forward in step.forwards:
                computation = _computation(forward, origins)
                origins.update({t.name: (computation, read_identity(t)) for t in forward.taps if t.kind == "read"})
                if computation:
                    users.setdefault(computation, []).append(f"{leaf.label}/{step.shown}" if leaf.label else step.shown)
    return users


def mark(plan: Plan) -> Plan:
    """The plan with every forward that more than one step computes identically marked shared."""
    users = {c: u for c, u in _users(plan).items() if len(u) > 1}
    if not users:
        return plan

    def marked(leaf: Plan) -> Plan:
        steps = []
        for step in leaf.steps:
            if not isinstance(step, ObservePlan):  # a fit's passes and a weights step are never shared
                steps.append(step)
                continue
            origins: dict[str, tuple[str, str]] = {}
            forwards = []
            for forward in step.forwards:
                computation = _computation(forward, origins)
                origins.update({t.name: (computation, read_identity(t)) for t in forward.taps if t.kind == "read"})
                if computation in users:
                    forward = replace(forward, computation=computation, shared=tuple(users[computation]))
                forwards.append(forward)
            steps.append(replace(step, forwards=tuple(forwards)))
        return replace(leaf, steps=tuple(steps), points=tuple(marked(p) for p in leaf.points))
    return marked(plan)


class Memo:
    """What a shared forward read, kept for the other forwards of its computation, per chunk of rows.

    `reads(computation)` are every read any user of it takes (one per identity); an entry is dropped
    once every user has taken it, so a run holds at most one chunk's reads per computation."""

    def __init__(self, plan: Plan):
        self.wanted: dict[str, dict[str, Tap]] = {}
        self.count: dict[str, int] = {}
        for leaf in plan.leaves():
            for step in _observes(leaf):
                for forward in step.forwards:
                    if forward.computation:
                        self.count[forward.computation] = self.count.get(forward.computation, 0) + 1
                        wanted = self.wanted.setdefault(forward.computation, {})
                        for tap in forward.taps:
                            if tap.kind == "read":
                                wanted.setdefault(read_identity(tap), tap)
        self.kept: dict[tuple, dict[str, Any]] = {}
        self.left: dict[tuple, int] = {}
        self.frames: dict[tuple, Any] = {}  # the last FRAMES frames built, oldest first
        self.compiled: dict[tuple, Any] = {}  # the frames compile built (the plan holds them): never built again
        for leaf in plan.leaves():
            self.compiled.update(leaf.frames)

    def frame(self, key: tuple, build: Callable[[], Any]) -> Any:
        """The frame of a forward's rows (`key`: ids, mask, segments, whether a character map is built): the one
        compile built, or built once for the forwards of any point on the same rows while it is among the last
        FRAMES used (SPEC.md Q15)."""
        if key in self.compiled:
            return self.compiled[key]
        frame = self.frames.pop(key, None)
        if frame is None:
            frame = build()
        self.frames[key] = frame
        while len(self.frames) > FRAMES:
            del self.frames[next(iter(self.frames))]
        return frame

    def others(self, forward: Forward, lo: int, hi: int) -> list[tuple[str, Tap]]:
        """The reads of the other users (identity, tap for rows lo..hi) that this forward does not take."""
        mine = {read_identity(t) for t in forward.taps if t.kind == "read"}
        return [(identity, replace(tap, anchors=None if tap.anchors is None else tap.anchors[lo:hi]))
                for identity, tap in self.wanted.get(forward.computation, {}).items() if identity not in mine]

    def first_to_run(self, forward: Forward, lo: int) -> bool:
        """Whether no user of this computation has run these rows yet (this one runs for all)."""
        return (forward.computation, lo) not in self.left

    def take(self, forward: Forward, lo: int) -> Optional[dict[str, Any]]:
        """This forward's reads by name from an earlier user's run, or None when it must run itself
        (no user ran these rows yet, or one did without a read this forward takes)."""
        key = (forward.computation, lo)
        if key not in self.left:
            return None
        kept = self.kept[key]
        reads = {t.name: kept.get(read_identity(t)) for t in forward.taps if t.kind == "read"}
        self._used(key)
        return None if any(v is None for v in reads.values()) else reads

    def keep(self, forward: Forward, lo: int, by_identity: dict[str, Any]) -> None:
        """What this forward's run read (by read identity), for the computation's other users."""
        key = (forward.computation, lo)
        self.kept[key] = by_identity
        self.left[key] = self.count[forward.computation]
        self._used(key)

    def _used(self, key: tuple) -> None:
        self.left[key] -= 1
        if self.left[key] <= 0:
            del self.kept[key], self.left[key]
