"""runs/order.py: the heap-ordered `forward_order` equals the plain definition (this file's, and the module's
own `plain_order`) on random graphs of models, and a cycle is refused naming the same model."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from causalab_ref.runs import order as ordering
from causalab_ref.shapes import IntervenedModel, Read, Refusal, Write


def _plain_order(intervention, needed: list) -> list | str:
    """R23's order by its definition: of the forwards not yet placed, place the least (model, input) whose every
    dependency is placed; when none is, the least left is in a cycle (returned as its model's name)."""
    reads, writes, models = dict(intervention.reads), dict(intervention.writes), dict(intervention.models)

    def deps(pair):
        if pair[0] == "original":
            return set()
        return {(reads[writes[w].operand].model, reads[writes[w].operand].input) for w in models[pair[0]].writes
                if isinstance(writes[w].operand, str)}

    pending, stack = {}, list(needed)
    while stack:
        pair = stack.pop()
        if pair not in pending:
            pending[pair] = deps(pair)
            stack += pending[pair]
    order: list = []
    while pending:
        ready = sorted(pair for pair, needs in pending.items() if needs <= set(order))
        if not ready:
            return sorted(pending)[0][0]
        order.append(ready[0])
        del pending[ready[0]]
    return order


@st.composite
def interventions(draw):
    """Models m0..mn on roles a/b, each reading one value and writing operands read by any model (cycles too)."""
    n = draw(st.integers(1, 9))
    names = ["original"] + [f"m{k}" for k in range(n)]
    role = {name: draw(st.sampled_from(["a", "b"])) for name in names}
    reads = {f"r_{name}_{x}": Read(site="s", pos=None, model=name, input=role[name] if name != "original" else x)
             for name in names for x in ("a", "b")}
    writes, models = {}, {}
    for name in names[1:]:
        operands = draw(st.lists(st.sampled_from(sorted(reads)), max_size=3))
        mine = []
        for k, operand in enumerate(operands):
            writes[f"w_{name}_{k}"] = Write(site="s", pos=None, mechanism="swap", operand=operand)
            mine.append(f"w_{name}_{k}")
        if draw(st.booleans()):
            writes[f"z_{name}"] = Write(site="s", pos=None, mechanism="zero", operand=None)
            mine.append(f"z_{name}")
        models[name] = IntervenedModel(input=role[name], writes=tuple(mine))
    reads = {r: read for r, read in reads.items() if read.model == "original" or read.input == role[read.model]}
    needed = sorted({(read.model, read.input) for read in reads.values()})
    needed = draw(st.lists(st.sampled_from(needed), min_size=1, max_size=len(needed), unique=True))
    return SimpleNamespace(reads=tuple(reads.items()), writes=tuple(writes.items()),
                           models=tuple(models.items())), needed


@settings(max_examples=500, deadline=None, database=None, derandomize=True)
@given(drawn=interventions())
def test_the_forward_order_is_the_plain_definitions(drawn):
    """SPEC.md:562 [R23] SPEC.md:1855 [Q39] on random graphs of models: the same order, or the same cycle
    refused naming the same model."""
    intervention, needed = drawn
    want = _plain_order(intervention, needed)
    if isinstance(want, str):
        with pytest.raises(Refusal, match=f"model '{want}' needs a value read in its own forward"):
            ordering.forward_order(intervention, needed, "interventions.x")
    else:
        assert ordering.forward_order(intervention, needed, "interventions.x") == want
        assert ordering.plain_order(ordering.forward_needs(intervention, needed)) == want  # the module's definition


@pytest.mark.fast
def test_a_chain_of_three_thousand_models_is_ordered_without_a_scan_per_placement():
    """SPEC.md:1855 [Q39] m1 needs m0's value, m2 m1's, ... m2999: the order is the chain (the plain definition
    rescans every pending forward per placement; this is its result on a shape it would take minutes on)."""
    n = 3000
    reads = tuple((f"r{k}", Read(site="s", pos=None, model=f"m{k}", input="a")) for k in range(n))
    writes = tuple((f"w{k}", Write(site="s", pos=None, mechanism="swap", operand=f"r{k - 1}")) for k in range(1, n))
    models = (("m0", IntervenedModel(input="a", writes=())),) + tuple(
        (f"m{k}", IntervenedModel(input="a", writes=(f"w{k}",))) for k in range(1, n))
    intervention = SimpleNamespace(reads=reads, writes=writes, models=models)
    order = ordering.forward_order(intervention, [(f"m{n - 1}", "a")], "interventions.x")
    assert order == [(f"m{k}", "a") for k in range(n)]
