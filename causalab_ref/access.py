"""Access: loading a checkpoint as an nnterp StandardizedTransformer, and reaching an
`Address` inside an nnsight trace on it.

This module owns the per-family load arguments (`load`) and the two verbs a trace
uses on an address: `value(model, address)` (the tensor held there, to read or
`.save()`) and `assign(model, address, new)` (replace it).  Both must be called
inside a `with model.trace(...)` block, and — nnsight's rule — in forward order
(`Address.rank`), reads and writes interleaved as the forward meets them.

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

from typing import Any, Optional

from .address import TABLE, reach, runs_attention
from .shapes import Address, Refusal

# ---------------------------------------------------------------- loading

#: the document's dtypes (SPEC.md D5) as torch's names; the one map both engines load with
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def torch_dtype(name: str):
    """The torch dtype of a document's `dtype` (`fp32`, `bf16`)."""
    import torch

    return getattr(torch, DTYPES[name])


def _gpt2_probs_source():
    from nnterp.rename_utils import AttnProbFunction

    class GPT2AttnProbs(AttnProbFunction):
        """nnterp 1.3.0 looks for module_attn_dropout_0, which this transformers does not
        have; the dispatched eager function calls nn.functional.dropout."""

        def get_attention_prob_source(self, attention_module, return_module_source=False):
            src = attention_module.source.attention_interface_0.source
            return src if return_module_source else src.nn_functional_dropout_0

    return GPT2AttnProbs()


def load_kwargs(model_type: str, attn_implementation: Optional[str] = None,
                weights: bool = True) -> dict[str, Any]:
    """The StandardizedTransformer keyword arguments for one family.

    eager => enable_attention_probs=True (and nnterp's validation trace, which needs
    weights; without weights it validates by scan).  GPT-2 gets a fixed attention-prob
    source; GptOss cannot run nnterp's probability check (its sink makes rows sum < 1)
    and needs the batched_mm experts implementation to run on CPU or meta.
    """
    kw: dict[str, Any] = {"device_map": "cpu", "dispatch": bool(weights)}
    if model_type == "gpt_oss":
        kw["experts_implementation"] = "batched_mm"
    if attn_implementation == "eager":
        kw["enable_attention_probs"] = True
        kw["check_attn_probs_with_trace"] = bool(weights) and model_type != "gpt_oss"
        if model_type == "gpt2":
            from nnterp.rename_utils import RenameConfig

            kw["rename_config"] = RenameConfig(attn_prob_source=_gpt2_probs_source())
    elif attn_implementation is not None:
        kw["attn_implementation"] = attn_implementation
    return kw


def load(path: str, attn_implementation: Optional[str] = None, weights: bool = True,
         dtype: Optional[str] = None, **overrides):
    """Load a checkpoint directory (or hub key) as a StandardizedTransformer.

    `attn_implementation` None keeps the family's default; `weights=False` is a meta
    load (config and module tree only; the first trace dispatches).
    """
    from transformers import AutoConfig
    from nnterp import StandardizedTransformer

    model_type = AutoConfig.from_pretrained(path, trust_remote_code=False,
                                            revision=overrides.get("revision")).model_type
    kw = load_kwargs(model_type, attn_implementation, weights)
    # Never a checkpoint's own code, and only safetensors weights (SPEC.md R13).
    kw["trust_remote_code"] = False
    if weights:
        kw["use_safetensors"] = True
    if dtype is not None:
        kw["dtype"] = torch_dtype(dtype)
    kw.update(overrides)
    dispatch_after = False
    if model_type == "gpt_oss" and kw.get("enable_attention_probs") and kw.get("dispatch"):
        # nnterp's scan check of the pattern sums rows to 1 on real values, which a sink
        # breaks: check on the meta model, then load the weights.
        kw["dispatch"], dispatch_after = False, True
    model = StandardizedTransformer(path, **kw)
    if dispatch_after:
        model.dispatch()
    return model


# ---------------------------------------------------------------- reaching an address


def _envoy(model, address: Address):
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
    op = getattr(model.layers[address.layer].self_attn.source, address.op)
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
    env = _envoy(model, address)
    got = env.input if address.io == "input" else env.output
    return got[0] if isinstance(got, tuple) else got


def _put_boundary(model, address, new, path):
    env = _envoy(model, address)
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
