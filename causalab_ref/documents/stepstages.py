"""Steps-first ordering: which steps name which, the checks that they run in the order written, and each
step's stage, the pass it runs in (SPEC.md §15, SF6-SF8, Q39).

    from causalab_ref.documents import stepstages
    stepstages.check_order(steps)      # a cycle, or a reference to a later step, refused
    stepstages.stages(steps)           # {step: its stage, 0 first}
"""
from __future__ import annotations

from typing import NoReturn, Optional

from ..shapes import Refusal

RUNS = ("forward", "generate")  # the step kinds that run the model


def _fail(path: str, message: str) -> NoReturn:
    raise Refusal(message, path=path, stage="validation")


def _names_of(name: str, step: dict, steps: dict) -> list[tuple[str, str]]:
    """(path, step named) for every other step this one names: an operand, `of`, or a metric's `against`."""
    found = []
    kind = step.get("kind")
    if kind in RUNS:
        writes = (step.get("interventions") or {}).get("writes") if isinstance(step.get("interventions"), dict) \
            else None
        for w, write in (writes or {}).items() if isinstance(writes, dict) else ():
            operand = write.get("operand") if isinstance(write, dict) else None
            if isinstance(operand, str):
                found.append((f"steps.{name}.interventions.writes.{w}.operand", operand.split(".", 1)[0]))
    else:
        for key, value in step.items():
            if key in ("of", "against") and isinstance(value, str):
                found.append((f"steps.{name}.{key}", value.split(".", 1)[0]))
    return [(p, s) for p, s in found if s in steps]


def _cycle(edges: dict) -> Optional[list[str]]:
    """The first cycle of references (its steps, the first repeated at the end), by an iterative search."""
    done: set[str] = set()
    for start in edges:
        if start in done:
            continue
        trail, on, stack = [start], {start}, [iter(edges[start])]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                finished = trail.pop()
                on.discard(finished)
                done.add(finished)
                stack.pop()
                continue
            other = nxt[1]
            if other in on:
                return trail[trail.index(other):] + [other]
            if other not in done:
                trail.append(other)
                on.add(other)
                stack.append(iter(edges[other]))
    return None


def check_order(steps: dict) -> None:
    """Steps run in the order written: a cycle of references is refused naming it, then a reference to a
    step that is not written before the one naming it (SF6, SF7)."""
    edges = {name: _names_of(name, step, steps) for name, step in steps.items()}
    cycle = _cycle(edges)
    if cycle:
        path = next(p for p, other in edges[cycle[0]] if other == cycle[1])
        _fail(path, f"steps {' -> '.join(cycle)} name each other in a cycle; a step names only the values of "
                    "steps written before it")
    order = {name: k for k, name in enumerate(steps)}
    for name, found in edges.items():
        for path, other in found:
            if order[other] >= order[name]:
                _fail(path, f"step '{name}' names step '{other}', which is not written before it; steps run in "
                            f"the order written, so put '{other}' first")


# ---------------------------------------------------------------- stages: one observe step each


def _ties(name: str, step: dict, steps: dict) -> tuple[list[str], list[str]]:
    """(steps that run in this step's stage, reduce steps whose value it needs from an earlier stage)."""
    same: list[str] = []
    earlier: list[str] = []
    for _path, other in _names_of(name, step, steps):
        (earlier if steps[other].get("kind") == "reduce" and step.get("kind") in RUNS else same).append(other)
    return same, earlier


def stages_by_rounds(steps: dict) -> Optional[dict[str, int]]:
    """The definition (SPEC.md SF8): raise each step to the stage its ties and reduce values need, round after
    round, until nothing moves; None when it never settles (a pass that needs its own value). `stages` is its
    optimisation (SPEC.md Q39), and a test checks the two agree."""
    stage = {name: 0 for name in steps}
    for _round in range(len(steps) + 2):
        changed = False
        for name, step in steps.items():
            same, earlier = _ties(name, step, steps)
            want = max([stage[name]] + [stage[s] for s in same] + [stage[r] + 1 for r in earlier])
            for other in [name, *same]:
                if stage[other] != want:
                    stage[other], changed = want, True
        if not changed:
            return stage
    return None


def stages(steps: dict) -> dict[str, int]:
    """An optimisation of `stages_by_rounds`, equal to it, refusing where it never settles (SPEC.md Q39).

    Each step's stage (SF8): a forward step that swaps in a reduce step's value runs a stage after the forward
    that value reduces; a step it takes a read from, a metric, and a reduce run in the stage of their read. Tied
    steps are one tied set; a set's stage is the longest chain of reduce values it waits on, found in one pass
    over the sets in dependency order (SPEC.md SF8, Q39); a set that waits on itself is refused."""
    ties = {name: _ties(name, step, steps) for name, step in steps.items()}
    parent = {name: name for name in steps}

    def tied_set(name: str) -> str:  # the root that names the steps tied to `name`
        root = name
        while parent[root] != root:
            root = parent[root]
        while parent[name] != root:
            parent[name], name = root, parent[name]
        return root

    for name, (same, _earlier) in ties.items():
        for other in same:
            parent[tied_set(name)] = tied_set(other)
    after: dict[str, dict[str, str]] = {tied_set(n): {} for n in steps}  # tied set -> {set it waits on: first step}
    for name, (_same, earlier) in ties.items():
        for reduce_step in earlier:
            after[tied_set(name)].setdefault(tied_set(reduce_step), name)
    waiting = {g: len(on) for g, on in after.items()}
    users: dict[str, list[str]] = {g: [] for g in after}
    for g, on in after.items():
        for h in on:
            users[h].append(g)
    level = dict.fromkeys(after, 0)
    ready = [g for g, n in waiting.items() if n == 0]
    while ready:
        h = ready.pop()
        for g in users[h]:
            level[g] = max(level[g], level[h] + 1)
            waiting[g] -= 1
            if waiting[g] == 0:
                ready.append(g)
    if any(waiting.values()):
        name = _waits_on_itself(steps, tied_set, after, waiting)
        _fail(f"steps.{name}.interventions", f"step '{name}' swaps in a reduce step's value and, in the same pass, a "
                                             "read of the forward that value reduces; the value is known only after "
                                             "that forward has run over every row, so no one pass runs both")
    return {name: level[tied_set(name)] for name in steps}


def _waits_on_itself(steps: dict, tied_set, after: dict, waiting: dict) -> str:
    """The step to blame for a stage that waits on its own reduce value: in a cycle of tied sets left waiting, its
    first step (in the order written) that swaps in such a value."""
    g = next(tied_set(n) for n in steps if waiting[tied_set(n)])
    seen: list[str] = []
    while g not in seen:
        seen.append(g)
        g = next(h for h in after[g] if waiting[h])
    cycle = seen[seen.index(g):] + [g]
    order = {name: k for k, name in enumerate(steps)}
    return min((after[a][b] for a, b in zip(cycle, cycle[1:])), key=order.__getitem__)
