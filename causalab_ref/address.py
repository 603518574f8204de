"""Address: the component table, and `locate`, which turns a name into a `shapes.Address`.

This module owns the 21 component names (SPEC.md §3 Locations; seed 004 "The component
list") as plain data: what each tensor is, whether it is one per layer or one per
model, whether it is per head and over which head count, whether it needs eager
attention, whether it is read-only, which model attribute its width is, and its
default module / io side / order.  `describe()` hands that table out as plain dicts
(the `vocab` verb prints it).

`locate(model, name, layer, ...)` resolves a name against a loaded nnterp
StandardizedTransformer (a meta load is enough: only the config and the module tree
are read).  The family differences are decided from the module tree (GPT-2 spells
the norms ln_1/ln_2, Gemma-2 is a sandwich block, GptOss's MLP is a mixture of
experts), never from the family's name (a parallel block also from its config flag); a place whose module is not there is refused
with a reason and never resolved to a neighbouring tensor.  The four interior rows
carry the `.source` operation found by the needle "attention_interface(".

Every refusal is a `shapes.Refusal(..., stage="compile")`.  Nothing here touches a
tensor; reaching an Address inside a trace is access.py's, slicing one is select.py's.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional

from .shapes import Address, Refusal

# ---------------------------------------------------------------- the table

#: the needle naming the attention call every interior hangs off (seed 004 "Inside a forward")
NEEDLE = "attention_interface("

#: the residual-stream components (where a read may say `"view": "logits"`)
RESIDUAL = ("embeddings", "block_input", "block_output", "ln_final")

# Per row:
#   tensor     one line: what the tensor is
#   accessor   nnterp's accessor name in the seed's vocab, or "interior"
#   layered    one per layer (True) or one per model (False)
#   per_head   a per-head tensor (`heads` applies)
#   head_count "query" / "key_value" / None: which head count groups it
#   eager      exists only under eager attention
#   read_only  a write naming it is refused
#   width      the model attribute its feature axis is published as:
#              "hidden_size", "intermediate_size", "vocab_size",
#              "qk_head_dim" / "head_dim" (times head_count), or None
#   module     default module (Llama spelling), relative to the layer or the model
#   io         default side: "input" / "output" / None (interior)
#   order      rank order inside its layer slot (forward order)
#   seq_axis   the sequence axis of the tensor held there
#   op_part    interiors: which part of the attention call: "arg1", "arg2", "out0",
#              "softmax" (the softmax's input inside the dispatched function)
TABLE: dict[str, dict[str, Any]] = {
    "attention_query": dict(
        tensor="interior: the query handed to the attention implementation (projected, reshaped, rotated)",
        accessor="interior", layered=True, per_head=True, head_count="query", eager=False,
        read_only=False, width="qk_head_dim", module=None, io=None, order=11, seq_axis=2,
        op_part="arg1"),
    "attention_key": dict(
        tensor="interior: argument 2 of the same call, the keys before grouped-query repetition",
        accessor="interior", layered=True, per_head=True, head_count="key_value", eager=False,
        read_only=False, width="qk_head_dim", module=None, io=None, order=12, seq_axis=2,
        op_part="arg2"),
    "attention_scores": dict(
        tensor="interior, eager only: the softmax's argument, QK^T*scale with the masks added",
        accessor="interior", layered=True, per_head=True, head_count="query", eager=True,
        read_only=False, width=None, module=None, io=None, order=15, seq_axis=2,
        op_part="softmax"),
    "attention_probs": dict(
        tensor="eager only: the attention pattern the values are actually mixed with",
        accessor="attention_probabilities", layered=True, per_head=True, head_count="query",
        eager=True, read_only=False, width=None, module="self_attn", io="output", order=20,
        seq_axis=2, op_part=None),
    "attention_z": dict(
        tensor="interior: the mixer's per-head result before the output projection, (batch, seq, head, head_dim)",
        accessor="interior", layered=True, per_head=True, head_count="query", eager=False,
        read_only=False, width="head_dim", module=None, io=None, order=22, seq_axis=1,
        op_part="out0"),
    "input_ids": dict(
        tensor="the token ids entering the embedding table (read-only)",
        accessor="embeddings_input", layered=False, per_head=False, head_count=None, eager=False,
        read_only=True, width=None, module="embed_tokens", io="input", order=-2, seq_axis=1,
        op_part=None),
    "embeddings": dict(
        tensor="the embedding table's output, before layer 0",
        accessor="embeddings_output", layered=False, per_head=False, head_count=None, eager=False,
        read_only=False, width="hidden_size", module="embed_tokens", io="output", order=-1,
        seq_axis=1, op_part=None),
    "block_input": dict(
        tensor="the residual stream entering the block",
        accessor="layers_input", layered=True, per_head=False, head_count=None, eager=False,
        read_only=False, width="hidden_size", module="", io="input", order=0, seq_axis=1,
        op_part=None),
    "attention_input_norm": dict(
        tensor="the norm the attention reads (its output)",
        accessor="attentions_norm_output", layered=True, per_head=False, head_count=None,
        eager=False, read_only=False, width="hidden_size", module="input_layernorm",
        io="output", order=5, seq_axis=1, op_part=None),
    "attention_premix": dict(
        tensor="the output projection's input: all heads' results side by side",
        accessor="attentions_premix", layered=True, per_head=True, head_count="query",
        eager=False, read_only=False, width="head_dim", module="self_attn.o_proj", io="input",
        order=25, seq_axis=1, op_part=None),
    "attention_output": dict(
        tensor="the attention's additive contribution to the residual stream",
        accessor="attentions_output", layered=True, per_head=False, head_count=None, eager=False,
        read_only=False, width="hidden_size", module="self_attn", io="output", order=30,
        seq_axis=1, op_part=None),
    "block_mid": dict(
        tensor="block_input + attention_output: the residual stream between the sublayers",
        accessor="layers_mid", layered=True, per_head=False, head_count=None, eager=False,
        read_only=False, width="hidden_size", module="post_attention_layernorm", io="input",
        order=33, seq_axis=1, op_part=None),
    "mlp_input_norm": dict(
        tensor="the norm the MLP reads (its output); equals mlp_input",
        accessor="mlps_norm_output", layered=True, per_head=False, head_count=None, eager=False,
        read_only=False, width="hidden_size", module="post_attention_layernorm", io="output",
        order=36, seq_axis=1, op_part=None),
    "mlp_input": dict(
        tensor="what the MLP module is called with",
        accessor="mlps_input", layered=True, per_head=False, head_count=None, eager=False,
        read_only=False, width="hidden_size", module="mlp", io="input", order=40, seq_axis=1,
        op_part=None),
    "mlp_activation": dict(
        tensor="the activation function's output",
        accessor="mlps_activation", layered=True, per_head=False, head_count=None, eager=False,
        read_only=False, width="intermediate_size", module="mlp.act_fn", io="output", order=44,
        seq_axis=1, op_part=None),
    "mlp_neuron_output": dict(
        tensor="the down projection's input: act(gate)*up on a gated MLP, the activation on GPT-2",
        accessor="mlps_neurons", layered=True, per_head=False, head_count=None, eager=False,
        read_only=False, width="intermediate_size", module="mlp.down_proj", io="input",
        order=47, seq_axis=1, op_part=None),
    "mlp_output": dict(
        tensor="the MLP's additive contribution to the residual stream",
        accessor="mlps_output", layered=True, per_head=False, head_count=None, eager=False,
        read_only=False, width="hidden_size", module="mlp", io="output", order=50, seq_axis=1,
        op_part=None),
    "block_output": dict(
        tensor="block_mid + mlp_output: the residual stream leaving the block",
        accessor="layers_output", layered=True, per_head=False, head_count=None, eager=False,
        read_only=False, width="hidden_size", module="", io="output", order=60, seq_axis=1,
        op_part=None),
    "ln_final": dict(
        tensor="the final norm's output",
        accessor="ln_final_output", layered=False, per_head=False, head_count=None, eager=False,
        read_only=False, width="hidden_size", module="ln_final", io="output", order=1000,
        seq_axis=1, op_part=None),
    "lm_head": dict(
        tensor="the unembedding's output",
        accessor="lm_head_output", layered=False, per_head=False, head_count=None, eager=False,
        read_only=False, width="vocab_size", module="lm_head", io="output", order=1001,
        seq_axis=1, op_part=None),
    "logits": dict(
        tensor="what the model predicts from (after Gemma-2's final softcapping, say)",
        accessor="logits", layered=False, per_head=False, head_count=None, eager=False,
        read_only=False, width="vocab_size", module="", io="output", order=1002, seq_axis=1,
        op_part=None),
}

NAMES = tuple(sorted(TABLE))
PER_HEAD = tuple(sorted(n for n, r in TABLE.items() if r["per_head"]))
INTERIORS = tuple(n for n, r in TABLE.items() if r["accessor"] == "interior")

# Module spellings tried in order, relative to the layer, for each boundary row whose
# spelling differs by family.  The first that exists in the module tree wins.
SPELLINGS: dict[str, tuple[str, ...]] = {
    "attention_input_norm": ("input_layernorm", "ln_1"),
    "attention_premix": ("self_attn.o_proj", "self_attn.c_proj", "self_attn.out_proj",
                         "self_attn.dense"),
    "block_mid": ("post_attention_layernorm", "ln_2"),
    "mlp_input_norm": ("post_attention_layernorm", "ln_2"),
    "mlp_activation": ("mlp.act_fn", "mlp.act", "mlp.activation_fn"),
    "mlp_neuron_output": ("mlp.down_proj", "mlp.c_proj", "mlp.fc2", "mlp.dense_4h_to_h"),
}

# A sandwich block (Gemma-2): a norm before AND after each sublayer.  The stream between
# the sublayers enters pre_feedforward_layernorm, and each sublayer's contribution is its
# post-norm's output.
SANDWICH: dict[str, tuple[str, str]] = {
    "block_mid": ("pre_feedforward_layernorm", "input"),
    "mlp_input_norm": ("pre_feedforward_layernorm", "output"),
    "attention_output": ("post_attention_layernorm", "output"),
    "mlp_output": ("post_feedforward_layernorm", "output"),
}

MOE_REASON = ("component '{name}': {accessor} does not exist on a mixture-of-experts layer, "
              "where a token goes through top-k of N experts and has no single activation. "
              "mlps_input and mlps_output are the block's boundaries and work as usual.")

PARALLEL_REASON = ("component '{name}': layer {layer} is a parallel block, where attention and the MLP "
                   "both read the block input: there is no residual stream between them, so there is no "
                   "such place")

NO_WIDTH = ("the width of '{name}' is not a fact about the model: it depends on the batch "
            "(the attention pattern's key axis) or is not a tensor's")


def describe() -> dict[str, dict[str, Any]]:
    """The component table as plain data, in the table's order (for the `vocab` verb)."""
    out = {}
    for name, row in TABLE.items():
        d = {k: v for k, v in row.items() if k != "op_part"}
        d["interior"] = row["accessor"] == "interior"
        d["residual"] = name in RESIDUAL
        out[name] = d
    return out


# ---------------------------------------------------------------- model facts


def _config(model):
    cfg = getattr(getattr(model, "_model", model), "config", None) or model.config
    return getattr(cfg, "text_config", None) or cfg


def runs_attention(model) -> str:
    """The attention implementation the loaded model runs ('eager', 'sdpa', ...)."""
    cfg = _config(model)
    return getattr(cfg, "_attn_implementation", None) or "eager"


def _resolve(envoy, path: str):
    """Walk a dotted module path from an envoy; None when the module tree has no such module."""
    from nnsight import Envoy

    if path == "":
        return envoy
    cur = envoy
    for part in path.split("."):
        try:
            cur = getattr(cur, part)
        except (AttributeError, IndexError, KeyError):
            return None
        if not isinstance(cur, Envoy):
            return None
    return cur


def _has(envoy, path: str) -> bool:
    return _resolve(envoy, path) is not None


def _query_heads(model) -> int:
    cfg = _config(model)
    return int(getattr(model, "num_heads", None) or getattr(cfg, "num_attention_heads", None)
               or getattr(cfg, "n_head"))


def _kv_heads(model) -> int:
    cfg = _config(model)
    kv = getattr(cfg, "num_key_value_heads", None)
    return int(kv) if kv else _query_heads(model)


def _head_dim(model, kind: str) -> int:
    cfg = _config(model)
    if kind == "qk_head_dim" and getattr(cfg, "qk_head_dim", None):
        return int(cfg.qk_head_dim)
    if kind == "head_dim" and getattr(cfg, "v_head_dim", None):
        return int(cfg.v_head_dim)
    hd = getattr(cfg, "head_dim", None)
    if hd:
        return int(hd)
    return int(_hidden(model) // _query_heads(model))


def _hidden(model) -> int:
    cfg = _config(model)
    return int(getattr(model, "hidden_size", None) or getattr(cfg, "hidden_size", None)
               or getattr(cfg, "n_embd"))


def _vocab(model) -> int:
    cfg = _config(model)
    return int(getattr(model, "vocab_size", None) or cfg.vocab_size)


def _intermediate(model, neuron_module) -> int:
    """The MLP's inner width, read off the down projection (GPT-2's config
    `intermediate_size` may be a stray key: n_inner/4*n_embd is what is built)."""
    if neuron_module is not None:
        mod = neuron_module._module
        for attr in ("in_features", "nx"):
            v = getattr(mod, attr, None)
            if isinstance(v, int):
                return v
    cfg = _config(model)
    if getattr(cfg, "model_type", "") == "gpt2":
        return int(cfg.n_inner or 4 * cfg.n_embd)
    return int(cfg.intermediate_size)


def _is_moe(layer_envoy) -> bool:
    return _has(layer_envoy, "mlp.experts")


def _is_parallel(model, layer_envoy) -> bool:
    """A parallel block: attention and the MLP both read the block input.  Decided from the
    config flag (`use_parallel_residual`, GPT-NeoX; `parallel_attn`, Falcon) or, with no
    flag, from the module tree: no norm module between the sublayers (GPT-J, Phi spell
    only the one input norm)."""
    cfg = _config(model)
    for flag in ("use_parallel_residual", "parallel_attn"):
        if getattr(cfg, flag, None) is True:
            return True
    between = ("post_attention_layernorm", "ln_2", "pre_feedforward_layernorm")
    return _has(layer_envoy, "mlp") and not any(_has(layer_envoy, p) for p in between)


def find_op(attn_envoy, needle: str = NEEDLE, what: str = "", path: str = "") -> str:
    """The one `.source` operation of the attention forward whose call site is `needle`.

    Matches operations whose source line contains the needle and whose name is the
    callee's (`attention_interface_<k>`); refused unless exactly one matches, listing
    every operation the forward has. `path` is the document path the refusal carries.
    """
    acc = attn_envoy.source.accessor
    lines = acc.source.split("\n")
    callee = needle.rstrip("(").split(".")[-1]
    names = list(acc.line_numbers)
    hits = []
    for n, ln in acc.line_numbers.items():
        text = lines[ln + 1] if 0 <= ln + 1 < len(lines) else ""
        if needle in text and re.fullmatch(re.escape(callee) + r"_\d+", n):
            hits.append(n)
    if len(hits) != 1:
        raise Refusal(
            f"{what or 'the attention forward'}: {len(hits)} operations match the call "
            f"{needle!r} ({hits}); the forward's operations are {names}", path=path, stage="compile")
    return hits[0]


# ---------------------------------------------------------------- locate


def _unknown(name: str) -> str:
    return (f"component '{name}' has no address here, and this model's internals have no "
            f"accessor of that name either. causalab_ref's are {list(NAMES)}; add one at load "
            f"time with extra addresses: extra={{'{name}': (module path relative to the layer, order)}}")


def locate(model, name: str, layer: Optional[int] = None, site: str = "target",
           attn_implementation: Optional[str] = None,
           extra: Optional[Mapping[str, tuple[str, int]]] = None) -> Address:
    """Resolve component `name` (at `layer`) on a loaded StandardizedTransformer.

    `site` names the document's site, for messages and for the path a refusal carries
    (`sites.<site>`).  `attn_implementation` defaults to what the model runs.  `extra`
    maps a name outside the table to (module path relative to the layer, order): a module
    boundary read at its output, one per layer, with no width.
    """
    rpath = f"sites.{site}"

    def refuse(msg: str):
        raise Refusal(msg, path=rpath, stage="compile")

    n_layers = int(getattr(model, "num_layers", None) or len(model.layers))
    extra = dict(extra or {})

    if name not in TABLE:
        if name not in extra:
            refuse(_unknown(name))
        module, order = extra[name]
        if layer is None:
            refuse(f"'{name}' is addressed at one layer: say which with \"layers\": [i]")
        if not 0 <= layer < n_layers:
            refuse(f"site '{site}': layer {layer} is outside the model's {n_layers} layers")
        if not _has(model.layers[layer], module):
            refuse(f"component '{name}': this model's layer {layer} has no module '{module}'")
        return Address(component=name, layer=layer, module=module, io="output",
                       rank=(layer, int(order)), seq_axis=1, width=None, heads=None)

    row = TABLE[name]
    if row["layered"] and layer is None:
        refuse(f"'{name}' is addressed at one layer: say which with \"layers\": [i]")
    if not row["layered"] and layer is not None:
        refuse(f"'{name}' is one per model and takes no layers")
    if layer is not None and not 0 <= layer < n_layers:
        refuse(f"site '{site}': layer {layer} is outside the model's {n_layers} layers")

    impl = attn_implementation or runs_attention(model)
    if row["eager"] and impl != "eager":
        refuse(f"component '{name}' exists only under 'eager' attention, and this model runs "
               f"'{impl}': say \"attn_implementation\": \"eager\" in the document's model block")

    heads = None
    if row["head_count"] == "query":
        heads = _query_heads(model)
    elif row["head_count"] == "key_value":
        heads = _kv_heads(model)

    # ---- whole-model places
    if not row["layered"]:
        module = row["module"]
        if module and not _has(model, module):
            refuse(f"component '{name}': this model has no module '{module}'")
        width = {"hidden_size": _hidden, "vocab_size": _vocab}.get(row["width"])
        rank = (-1, row["order"]) if row["order"] < 0 else (n_layers, row["order"])
        return Address(component=name, layer=None, module=module, io=row["io"], rank=rank,
                       seq_axis=row["seq_axis"], width=width(model) if width else None)

    lay = model.layers[layer]
    rank = (layer, row["order"])

    # ---- interiors and the pattern: hang off the attention call
    if row["accessor"] in ("interior", "attention_probabilities"):
        if not _has(lay, "self_attn"):
            refuse(f"component '{name}': layer {layer} has no attention module (self_attn)")
        if name == "attention_probs":
            if not getattr(model, "attn_probs_available", False):
                refuse(f"component '{name}': Attention probabilities are disabled for this model. "
                       "Set enable_attention_probs=True when loading the model to enable them.")
            return Address(component=name, layer=layer, module="self_attn", io="output",
                           rank=rank, seq_axis=2, width=None, heads=heads)
        op = find_op(lay.self_attn, what=f"component '{name}'", path=rpath)
        width = None
        if row["width"]:
            width = _head_dim(model, row["width"]) * heads
        return Address(component=name, layer=layer, module=None, io=None, rank=rank, op=op,
                       seq_axis=row["seq_axis"], width=width, heads=heads)

    # ---- per-layer boundaries
    if name in ("mlp_activation", "mlp_neuron_output") and _is_moe(lay):
        refuse(MOE_REASON.format(name=name, accessor=row["accessor"]))
    if name in ("block_mid", "mlp_input_norm") and _is_parallel(model, lay):
        refuse(PARALLEL_REASON.format(name=name, layer=layer))

    module, io = row["module"], row["io"]
    sandwich = _has(lay, "pre_feedforward_layernorm") and _has(lay, "post_feedforward_layernorm")
    if not sandwich and name in ("block_mid", "mlp_input_norm", "attention_input_norm") \
            and _has(lay, "post_feedforward_layernorm"):
        refuse(f"component '{name}': layer {layer} is a post-norm block, where each sublayer "
               "reads the residual stream itself and the norm comes after: there is no such place")
    if sandwich and name in SANDWICH:
        module, io = SANDWICH[name]
    elif name in SPELLINGS:
        found = [p for p in SPELLINGS[name] if _has(lay, p)]
        if not found:
            refuse(f"component '{name}': layer {layer} has none of the modules "
                   f"{list(SPELLINGS[name])} that spell this place")
        module = found[0]
    if not _has(lay, module):
        refuse(f"component '{name}': layer {layer} has no module '{module}'")

    kind = row["width"]
    if kind == "hidden_size":
        width = _hidden(model)
    elif kind == "intermediate_size":
        width = _intermediate(model, _resolve(lay, module))
    elif kind in ("head_dim", "qk_head_dim"):
        width = _head_dim(model, kind) * heads
    else:
        width = None
    return Address(component=name, layer=layer, module=module, io=io, rank=rank,
                   seq_axis=row["seq_axis"], width=width, heads=heads)


def width(address: Address, path: str = "") -> int:
    """The feature width at an address, or the refusal a featurizer there gets."""
    if address.width is None:
        raise Refusal(NO_WIDTH.format(name=address.component), path=path, stage="compile")
    return address.width


def where_each_lands(model, layer: int = 0, extra=None, resolve=None) -> list[tuple[str, Any]]:
    """[(name, Address or the refusal's message)] for every row, at `layer` for per-layer
    rows (the seed's "where each one lands" printout; the `model --lands` verb).

    `resolve(name, layer)`, when given, is used in place of `locate` on `model`: an
    engine's own `.locate`, which adds the refusals of that engine (the hooks engine's).
    """
    if resolve is None:
        def resolve(name, at):
            return locate(model, name, at, extra=extra)
    out = []
    for name, row in TABLE.items():
        try:
            out.append((name, resolve(name, layer if row["layered"] else None)))
        except Refusal as r:
            out.append((name, r.message))
    return out
