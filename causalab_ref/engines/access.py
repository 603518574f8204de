"""Access: reaching an `Address` inside an nnsight trace on a StandardizedTransformer.

(Loading one is checkpoint.py's.) This module owns the two verbs a trace uses on an
address: `value(model, address)` (the tensor held there, to read or `.save()`) and
`assign(model, address, new)` (replace it).  Both must be called inside a
`with model.trace(...)` block, and — nnsight's rule — in forward order (`Address.rank`),
reads and writes interleaved as the forward meets them.

How each kind of place is reached — the component table's `reach` column, dispatched on by
`REACH` (SPEC.md §3 Locations; stack-facts "Tracing rules"):

* a module boundary: the envoy's `.input` (first argument) or `.output`; a tuple
  output is its element 0, and a write puts the new value in that slot;
* an interior: the attention forward's `.source` operation `address.op`
  (`attention_interface_0` here): argument 1 is the query, 2 the key, output[0] is z.
  Writes replace the operation's inputs/output (an in-place write into GPT-2's query
  fails: it is a view from a split).  Under eager attention the operation's own
  `.source` is touched before its inputs, so a later read of the scores (one level
  deeper) is still ahead of the forward;
* attention_scores: the softmax inside the function the call dispatches to, found
  in the trace (the one nested operation whose name says softmax), its input;
* attention_probs: nnterp's `attention_probabilities[layer]`;
* logits: the model output's `.logits`.
"""
from __future__ import annotations

from ..locations.address import TABLE, reach, runs_attention
from ..shapes import Address, Refusal

# ---------------------------------------------------------------- reaching an address


def envoy(model, address: Address):
    """The envoy of an address's module (relative to its layer, or to the model root)."""
    base = model if address.layer is None else model.layers[address.layer]
    cur = base
    if address.module:
        for part in address.module.split("."):
            cur = getattr(cur, part)
    return cur


def _eager(model) -> bool:
    return runs_attention(model) == "eager"


def _op(model, address: Address, touch: bool = True):
    """The attention call's operation envoy; under eager its nested .source is touched
    first, so the dispatched function's operations stay reachable later in the pass."""
    op = getattr(model.layers[address.layer].self_attn.source, str(address.op))
    if touch and _eager(model):
        op.source  # noqa: B018 -- touching installs the nested source for this forward
    return op


def _softmax(model, address: Address, path: str = ""):
    op = _op(model, address)
    inner = op.source
    names = [n for n in inner.accessor.line_numbers if "softmax" in n.lower()]
    if len(names) != 1:
        raise Refusal(f"component '{address.component}': the function '{address.op}' dispatches "
                      f"to has {len(names)} softmax operations ({names}); its operations are "
                      f"{list(inner.accessor.line_numbers)}", path=path, stage="run")
    return getattr(inner, names[0])


def _call_arg(k: int):
    """The reach of argument `k` of the attention call: read it, or replace it in the call's inputs."""
    def get(model, address, path):
        return _op(model, address).inputs[0][k]

    def put(model, address, new, path):
        op = _op(model, address)
        args, kwargs = op.inputs
        args = list(args)
        args[k] = new
        op.inputs = (tuple(args), kwargs)
    return get, put


def _put_call_output(model, address, new, path):
    op = _op(model, address)
    out = op.output
    op.output = (new, *out[1:]) if isinstance(out, tuple) else new


def _put_softmax_input(model, address, new, path):
    _softmax(model, address, path).input = new


def _put_pattern(model, address, new, path):
    model.attention_probabilities[address.layer] = new


def _put_model_logits(model, address, new, path):
    model.output.logits = new


def _get_boundary(model, address, path):
    env = envoy(model, address)
    got = env.input if address.io == "input" else env.output
    return got[0] if isinstance(got, tuple) else got


def _put_boundary(model, address, new, path):
    env = envoy(model, address)
    if address.io == "input":
        env.input = new
        return
    out = env.output
    env.output = (new, *out[1:]) if isinstance(out, tuple) else new


#: the component table's `reach` column -> (read, write): how a trace reaches each kind of place
REACH = {
    "boundary": (_get_boundary, _put_boundary),
    "call_arg1": _call_arg(1),
    "call_arg2": _call_arg(2),
    "call_output": (lambda model, address, path: _op(model, address).output[0], _put_call_output),
    "softmax_input": (lambda model, address, path: _softmax(model, address, path).input, _put_softmax_input),
    "pattern": (lambda model, address, path: model.attention_probabilities[address.layer], _put_pattern),
    "model_logits": (lambda model, address, path: model.output.logits, _put_model_logits),
}


def value(model, address: Address, path: str = ""):
    """The tensor held at `address` in the running trace (read it, or `.save()` it).

    `path` is the document path a refusal here carries (the site's, `sites.<site>`)."""
    get, _ = REACH[reach(address.component)]
    return get(model, address, path)


def assign(model, address: Address, new, path: str = "") -> None:
    """Replace the tensor at `address` with `new` in the running trace (`path` as for `value`)."""
    row = TABLE.get(address.component)
    if row is not None and row.read_only:
        raise Refusal(f"{address.component} is read-only: it is the model's input, and a write naming it "
                      "means nothing", path=path, stage="run")
    _, put = REACH[reach(address.component)]
    put(model, address, new, path)
