"""Order: a step's forwards in dependency order, as compile places them (SPEC.md R23, Q39).

A model's writes need the forwards their operands are read in, so those run first; ties go to the least
(model, input), the original's explain order:

    order.forward_order(intervention, [("patched", "base")], "interventions.patching")
    # -> [("original", "counterfactual"), ("patched", "base")]
"""
from __future__ import annotations

import heapq

from ..shapes import Refusal


def plain_order(needs: dict[tuple[str, str], set]) -> list[tuple[str, str]]:
    """The definition (SPEC.md R23): of the forwards not yet placed, place the least whose every dependency is
    placed, until none is left; an empty return short of every forward means a cycle. Quadratic in the
    forwards; `forward_order` is its optimisation (SPEC.md Q39), and a test checks the two agree."""
    order: list[tuple[str, str]] = []
    pending = set(needs)
    while pending:
        ready = [pair for pair in pending if needs[pair] <= set(order)]
        if not ready:
            break
        order.append(min(ready))
        pending.discard(order[-1])
    return order


def forward_order(intervention, needed: list[tuple[str, str]], path: str) -> list[tuple[str, str]]:
    """Forwards in dependency order (a model's writes need the forwards their operands are read in), ties
    broken by (model, input) (SPEC.md R23). The plain definition: of the forwards not yet placed, place the
    least whose every dependency is placed; no such forward is a cycle. A heap of the ready ones and a count
    of each one's unplaced dependencies give that order in O(E log V), not a scan of every pending forward
    per placement (SPEC.md Q39)."""
    needs = forward_needs(intervention, needed)
    waiting = {pair: len(deps) for pair, deps in needs.items()}
    users: dict[tuple[str, str], list] = {pair: [] for pair in needs}
    for pair, deps in needs.items():
        for dep in deps:
            users[dep].append(pair)
    ready = [pair for pair, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order: list[tuple[str, str]] = []
    while ready:  # topological, ties sorted by (model, input): the original's explain order (SPEC.md R23)
        pair = heapq.heappop(ready)
        order.append(pair)
        for user in users[pair]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) < len(needs):
        cycle = min(set(needs) - set(order))
        raise Refusal(f"model '{cycle[0]}' needs a value read in its own forward (a cycle of operands)",
                      path=path, stage="compile")
    return order


def forward_needs(intervention, needed: list[tuple[str, str]]) -> dict[tuple[str, str], set]:
    """Every forward the needed ones depend on, at any distance, each with the forwards its writes' operands
    are read in."""
    reads, writes, models = dict(intervention.reads), dict(intervention.writes), dict(intervention.models)

    def deps(pair):
        model, _role = pair
        if model == "original":
            return set()
        return {(reads[writes[w].operand].model, reads[writes[w].operand].input) for w in models[model].writes
                if isinstance(writes[w].operand, str)}

    found: dict[tuple[str, str], set] = {}
    stack = list(needed)
    while stack:
        pair = stack.pop()
        if pair not in found:
            found[pair] = deps(pair)
            stack += found[pair]
    return found
