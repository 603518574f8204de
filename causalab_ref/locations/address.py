"""Address: the component table, and `locate`, which turns a name into a `shapes.Address`.

This module owns the 21 component names (SPEC.md L5, the component table) as plain data: one frozen
`Component` row per name saying what the tensor is, whether it is one per layer or one per model,
whether it is per head and over which head count, whether it needs eager attention, whether it is
read-only, which model attribute its width is, its default module / io side / order, and how a trace
reaches it (`reach`, which the engines dispatch on). `describe()` hands that table out as plain
dicts (the `vocab` verb prints it).

`locate(model, name, layer, ...)` looks a name up in a loaded nnterp
StandardizedTransformer (a meta load is enough: only the config and the module tree
are read), or against the same tree held as data (families.py: the weightless engine's).
The family and block differences are decided from the module tree (GPT-2 spells the norms
ln_1/ln_2, Gemma-2 is a sandwich block, OLMo-2 a post-norm block,
GptOss's MLP is a mixture of experts, a Qwen3-Next layer mixes with `linear_attn`), never
from the family's name; a parallel block also from its config flag.  A place whose
module is not there is refused with a reason and never resolved to a neighbouring
tensor.  The four interior rows carry the `.source` operation found by the needle
"attention_interface(".

The rules a site is held to (`check_layering`, `check_per_head`, `refuse_no_width`) are
functions here, one per rule, which validation calls too, and the module tree is walked in one place,
`module_at` (and `envoy`, an address's module), which both engines use.  Every other refusal is a
`shapes.Refusal(..., stage="compile")`.  Nothing here touches a tensor; reaching an Address inside a trace
is the engines' (nnterp.py, hooks.py), slicing one is select.py's.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Mapping, NoReturn, Optional

from ..shapes import Address, Refusal, nearest
from .families import Node

# ---------------------------------------------------------------- the table

#: the needle naming the attention call every interior hangs off (SPEC.md L12)
NEEDLE = "attention_interface("

#: the residual-stream components (where a read may say `"view": "logits"`)
RESIDUAL = ("embeddings", "block_input", "block_output", "ln_final")

@dataclass(frozen=True)
class Component:
    """One row of the component table.  The defaults describe the common row: a per-layer
    module boundary read at its output, residual-stream wide, not per head, sequence axis 1."""

    tensor: str              # one line: what the tensor is
    accessor: str            # nnterp's accessor name (SPEC.md L5), or "interior"
    order: int               # rank order inside its layer slot (forward order)
    module: Optional[str] = None   # default module (Llama spelling), relative to the layer or the model
    io: Optional[str] = "output"   # default side: "input" / "output" / None (interior)
    layered: bool = True     # one per layer (True) or one per model (False)
    per_head: bool = False   # a per-head tensor (`heads` applies)
    head_count: Optional[str] = None  # "query" / "key_value" / None: which head count groups it
    eager: bool = False      # exists only under eager attention
    read_only: bool = False  # a write naming it is refused
    width: Optional[str] = "hidden_size"  # the model attribute the feature axis is published as:
    #                          "hidden_size", "intermediate_size", "vocab_size",
    #                          "qk_head_dim" / "head_dim" (times the head count), or None
    seq_axis: int = 1        # the sequence axis of the tensor held there
    reach: str = "boundary"  # how a trace reaches it: a key of nnterp.REACH ("boundary", "call_arg1",
    #                          "call_arg2", "call_output", "softmax_input", "pattern", "model_logits")

    @property
    def interior(self) -> bool:
        return self.accessor == "interior"


def _interior(tensor: str, order: int, reach: str, **kw) -> Component:
    """A row hanging off the attention call: no module, no side, per query head, sequence axis 2."""
    kw = {"per_head": True, "head_count": "query", "seq_axis": 2, **kw}
    return Component(tensor, "interior", order, module=None, io=None, reach=reach, **kw)


def _head(tensor: str, accessor: str, order: int, module: str, **kw) -> Component:
    """A whole-model row (one per model, takes no layers)."""
    return Component(tensor, accessor, order, module=module, layered=False, **kw)


TABLE: dict[str, Component] = {
    "attention_query": _interior(
        "interior: the query handed to the attention implementation (projected, reshaped, rotated)",
        11, "call_arg1", width="qk_head_dim"),
    "attention_key": _interior(
        "interior: argument 2 of the same call, the keys before grouped-query repetition",
        12, "call_arg2", width="qk_head_dim", head_count="key_value"),
    "attention_scores": _interior(
        "interior, eager only: the softmax's argument, QK^T*scale with the masks added",
        15, "softmax_input", width=None, eager=True),
    "attention_probs": Component(
        "eager only: the attention pattern the values are actually mixed with",
        "attention_probabilities", 20, module="self_attn", per_head=True, head_count="query",
        eager=True, width=None, seq_axis=2, reach="pattern"),
    "attention_z": _interior(
        "interior: the mixer's per-head result before the output projection, (batch, seq, head, head_dim)",
        22, "call_output", width="head_dim", seq_axis=1),
    "input_ids": _head("the token ids entering the embedding table (read-only)", "embeddings_input",
                       -2, "embed_tokens", io="input", read_only=True, width=None),
    "embeddings": _head("the embedding table's output, before layer 0", "embeddings_output", -1,
                        "embed_tokens"),
    "block_input": Component("the residual stream entering the block", "layers_input", 0, module="",
                             io="input"),
    "attention_input_norm": Component("the norm the attention reads (its output)", "attentions_norm_output",
                                      5, module="input_layernorm"),
    "attention_premix": Component(
        "the output projection's input: all heads' results side by side", "attentions_premix", 25,
        module="self_attn.o_proj", io="input", per_head=True, head_count="query", width="head_dim"),
    "attention_output": Component("the attention's additive contribution to the residual stream",
                                  "attentions_output", 30, module="self_attn"),
    "block_mid": Component("block_input + attention_output: the residual stream between the sublayers",
                           "layers_mid", 33, module="post_attention_layernorm", io="input"),
    "mlp_input_norm": Component("the norm the MLP reads (its output); equals mlp_input", "mlps_norm_output",
                                36, module="post_attention_layernorm"),
    "mlp_input": Component("what the MLP module is called with", "mlps_input", 40, module="mlp", io="input"),
    "mlp_activation": Component("the activation function's output", "mlps_activation", 44,
                                module="mlp.act_fn", width="intermediate_size"),
    "mlp_neuron_output": Component(
        "the down projection's input: act(gate)*up on a gated MLP, the activation on GPT-2", "mlps_neurons",
        47, module="mlp.down_proj", io="input", width="intermediate_size"),
    "mlp_output": Component("the MLP's additive contribution to the residual stream", "mlps_output", 50,
                            module="mlp"),
    "block_output": Component("block_mid + mlp_output: the residual stream leaving the block",
                              "layers_output", 60, module=""),
    "ln_final": _head("the final norm's output", "ln_final_output", 1000, "ln_final"),
    "lm_head": _head("the unembedding's output", "lm_head_output", 1001, "lm_head", width="vocab_size"),
    "logits": _head("what the model predicts from (after Gemma-2's final softcapping, say)", "logits",
                    1002, "", width="vocab_size", reach="model_logits"),
}

NAMES = tuple(sorted(TABLE))
PER_HEAD = tuple(sorted(n for n, r in TABLE.items() if r.per_head))
INTERIORS = tuple(n for n, r in TABLE.items() if r.interior)
#: the attention sublayer's places: nothing to attach to on a linear-attention layer
ATTENTION = tuple(n for n in TABLE if n.startswith("attention_"))
#: the places the head computes (vocabulary-wide): computed only at the positions a tap names (SPEC.md Q8)
HEAD = tuple(n for n, r in TABLE.items() if r.width == "vocab_size")

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

# Block structures whose places sit elsewhere than the Llama spelling, decided from the layer's
# module tree: (module, io) per moved row, and the rows the structure has no place for.
# A sandwich block (Gemma-2) has a norm before AND after each sublayer: the stream between the
# sublayers enters pre_feedforward_layernorm, and each sublayer's contribution is its post-norm's
# output.  A post-norm block (OLMo-2) has only the norms after: each sublayer reads the stream
# itself, so the stream between them is the MLP's input and there is no input norm.
SANDWICH: dict[str, tuple[str, str]] = {
    "block_mid": ("pre_feedforward_layernorm", "input"),
    "mlp_input_norm": ("pre_feedforward_layernorm", "output"),
    "attention_output": ("post_attention_layernorm", "output"),
    "mlp_output": ("post_feedforward_layernorm", "output"),
}
POST_NORM: dict[str, tuple[str, str]] = {
    "block_mid": ("mlp", "input"),
    "attention_output": ("post_attention_layernorm", "output"),
    "mlp_output": ("post_feedforward_layernorm", "output"),
}
POST_NORM_ABSENT = ("attention_input_norm", "mlp_input_norm")
PARALLEL_ABSENT = ("block_mid", "mlp_input_norm")
MOE_ABSENT = ("mlp_activation", "mlp_neuron_output")

#: the module a linear-attention layer mixes with where a softmax-attention layer has self_attn
LINEAR_MIXERS = ("linear_attn",)

MOE_REASON = ("component '{name}': {accessor} does not exist on a mixture-of-experts layer, "
              "where a token goes through top-k of N experts and has no single activation. "
              "mlps_input and mlps_output are the block's boundaries and work as usual.")

PARALLEL_REASON = ("component '{name}': layer {layer} is a parallel block, where attention and the MLP "
                   "both read the block input: there is no residual stream between them, so there is no "
                   "such place")

POST_NORM_REASON = ("component '{name}': layer {layer} is a post-norm block, where each sublayer reads the "
                    "residual stream itself and the norm comes after: there is no such place")

LINEAR_REASON = ("component '{name}': layer {layer} is a linear-attention layer ({mixer}); "
                 "attentions/attention_probabilities are only defined on softmax-attention layers")


def describe() -> dict[str, dict[str, Any]]:
    """The component table as plain data, in the table's order (for the `vocab` verb)."""
    out = {}
    for name, row in TABLE.items():
        d = {k: v for k, v in dataclasses.asdict(row).items() if k != "reach"}
        d["interior"] = row.interior
        d["residual"] = name in RESIDUAL
        out[name] = d
    return out


def reach(component: str) -> str:
    """How a trace reaches `component`'s tensor; a name outside the table (an `extra`) is a boundary."""
    row = TABLE.get(component)
    return row.reach if row is not None else "boundary"


# ---------------------------------------------------------------- the rules a site is held to
#
# Each rule is one function, judged at validation for the table's names (documents/places.py) and again
# at compile, where a name added with `extra`, the real head count and the width are known (`locate`
# here, runs/compile.py); the caller says which stage it is.


def check_layering(component: str, layered: bool, layer: Optional[int], path: str, stage: str) -> None:
    """A per-layer place is addressed at one layer, a whole-model place at none (SPEC.md L4, L7); `path` is
    the site's, and a layer given where none is taken is refused at its `layers`."""
    if layered and layer is None:
        raise Refusal(f"'{component}' is addressed at one layer: say which with \"layers\": [i]", path=path,
                      stage=stage)
    if not layered and layer is not None:
        raise Refusal(f"'{component}' is one per model and takes no layers", path=f"{path}.layers", stage=stage)


def check_per_head(component: str, per_head: bool, heads: Optional[tuple], path: str, stage: str) -> None:
    """`heads` slices a per-head tensor only (SPEC.md L14); `path` is the site's."""
    if heads is not None and not per_head:
        raise Refusal(f"'{component}' is not a per-head tensor; `heads` applies at {list(PER_HEAD)}",
                      path=f"{path}.heads", stage=stage)


def refuse_no_width(component: str, path: str) -> NoReturn:
    """A place whose width depends on the batch (the pattern's key axis) or that is not a tensor's has no
    width, so none for `units` to slice or a featurizer to be fitted to (SPEC.md L23, FZ23; B11)."""
    raise Refusal(f"the width of '{component}' is not a fact about the model: it depends on the batch "
                  "(the attention pattern's key axis) or is not a tensor's", path=path, stage="compile")


# ---------------------------------------------------------------- model facts


def _config(model):
    cfg = getattr(getattr(model, "_model", model), "config", None) or model.config
    return getattr(cfg, "text_config", None) or cfg


def runs_attention(model) -> str:
    """The attention implementation the loaded model runs ('eager', 'sdpa', ...)."""
    cfg = _config(model)
    return getattr(cfg, "_attn_implementation", None) or "eager"


def module_at(root, path: str):
    """The envoy at the dotted module `path` below `root` (an envoy: the model, or one of its layers); None
    when the module tree has no such module. The one walk of the module tree: `locate` asks it whether a
    module is there, and both engines reach an address's module through it (`envoy`). A tree held as data
    (families.py, compile's weightless view) answers from its table."""
    if isinstance(root, Node):
        return root.find(path)
    from nnsight import Envoy

    if path == "":
        return root
    cur = root
    for part in path.split("."):
        try:
            cur = getattr(cur, part)
        except (AttributeError, IndexError, KeyError):
            return None
        if not isinstance(cur, Envoy):
            return None
    return cur


def envoy(model, a: Address):
    """The envoy of an address's module, relative to its layer or to the model root (`module_at`). A located
    address's module is in the tree; one that is not raises AttributeError naming it."""
    base = model if a.layer is None else model.layers[a.layer]
    found = module_at(base, a.module or "")
    if found is None:
        raise AttributeError(f"{a.label()}: the module tree has no module '{a.module}'")
    return found


def _has(envoy, path: str) -> bool:
    return module_at(envoy, path) is not None


def _size(model, attr: str, *keys: str) -> int:
    """A size nnterp states on the model (`attr`), else the first of the config's `keys` that is set
    (the last one must exist)."""
    cfg = _config(model)
    value = getattr(model, attr, None)
    for key in keys[:-1]:
        value = value or getattr(cfg, key, None)
    return int(value or getattr(cfg, keys[-1]))


def _query_heads(model) -> int:
    return _size(model, "num_heads", "num_attention_heads", "n_head")


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
    return _size(model, "hidden_size", "hidden_size", "n_embd")


def vocab_size(model) -> int:
    """The ids the model has a row of its embedding for, and its head's width: transformers builds both from
    the config's `vocab_size`, and a load refuses weights of another shape."""
    return _size(model, "vocab_size", "vocab_size")


def _intermediate(model, layer_envoy) -> int:
    """The MLP's inner width, read off the down projection the layer has (its `in_features`, or
    Conv1D's `nx` on GPT-2, whose config `intermediate_size` may be a stray key: n_inner or
    4*n_embd is what is built); the config's `intermediate_size` only when the tree has none."""
    for path in SPELLINGS["mlp_neuron_output"]:
        found = module_at(layer_envoy, path)
        if found is None:
            continue
        for attr in ("in_features", "nx"):
            v = found.ints.get(attr) if isinstance(found, Node) else getattr(found._module, attr, None)
            if isinstance(v, int):
                return v
    return int(_config(model).intermediate_size)


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


def block_structure(layer_envoy) -> str:
    """'sandwich' (norms before and after each sublayer), 'post-norm' (norms after only) or
    'pre-norm', from the layer's module tree."""
    if not _has(layer_envoy, "post_feedforward_layernorm"):
        return "pre-norm"
    return "sandwich" if _has(layer_envoy, "pre_feedforward_layernorm") else "post-norm"


def linear_mixer(layer_envoy) -> Optional[str]:
    """The class name of the linear-attention mixer of a layer that has one and no self_attn, else None."""
    if _has(layer_envoy, "self_attn"):
        return None
    for path in LINEAR_MIXERS:
        found = module_at(layer_envoy, path)
        if found is not None:
            return found.class_name if isinstance(found, Node) else type(found._module).__name__
    return None


def find_op(attn_envoy, needle: str = NEEDLE, what: str = "", path: str = "") -> str:
    """The one `.source` operation of the attention forward whose call site is `needle`.

    Matches operations whose source line contains the needle and whose name is the
    callee's (`attention_interface_<k>`); refused unless exactly one matches, listing
    every operation the forward has. `path` is the document path the refusal carries. A tree held as data
    names its operation (families.OP).
    """
    if isinstance(attn_envoy, Node) and attn_envoy.op:
        return attn_envoy.op
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
            f"accessor of that name either. causalab_ref's are {list(NAMES)}{nearest(name, NAMES)}")


def _refuse(message: str, site: str) -> NoReturn:
    raise Refusal(message, path=f"sites.{site}", stage="compile")


def _num_layers(model) -> int:
    return int(getattr(model, "num_layers", None) or len(model.layers))


def _check_layer(model, name: str, layered: bool, layer: Optional[int], site: str) -> None:
    """A per-layer place needs a layer inside the stack; a whole-model place takes none."""
    check_layering(name, layered, layer, f"sites.{site}", "compile")
    n_layers = _num_layers(model)
    if layer is not None and not 0 <= layer < n_layers:
        _refuse(f"site '{site}': layer {layer} is outside the model's {n_layers} layers", site)


def _locate_extra(model, name: str, layer: Optional[int], site: str, entry: tuple[str, int]) -> Address:
    """A name added with `extra`: a module boundary read at its output, one per layer, no width."""
    module, order = entry
    _check_layer(model, name, True, layer, site)
    if not _has(model.layers[layer], module):
        _refuse(f"component '{name}': this model's layer {layer} has no module '{module}'", site)
    assert layer is not None  # _check_layer refused a per-layer place without one
    return Address(component=name, layer=layer, module=module, io="output",
                   rank=(layer, int(order)), seq_axis=1, width=None, heads=None)


def _heads(model, row: Component) -> Optional[int]:
    if row.head_count == "query":
        return _query_heads(model)
    if row.head_count == "key_value":
        return _kv_heads(model)
    return None


def _width(model, row: Component, heads: Optional[int], layer_envoy=None) -> Optional[int]:
    """The feature width a row publishes on this model (None where it is no fact about the model)."""
    kind = row.width
    if kind == "hidden_size":
        return _hidden(model)
    if kind == "vocab_size":
        return vocab_size(model)
    if kind == "intermediate_size":
        return _intermediate(model, layer_envoy)
    if kind in ("head_dim", "qk_head_dim") and heads is not None:
        return _head_dim(model, kind) * heads
    return None


def _locate_whole_model(model, name: str, row: Component, site: str) -> Address:
    if row.module and not _has(model, row.module):
        _refuse(f"component '{name}': this model has no module '{row.module}'", site)
    n_layers = _num_layers(model)
    rank = (-1, row.order) if row.order < 0 else (n_layers, row.order)
    return Address(component=name, layer=None, module=row.module, io=row.io, rank=rank,
                   seq_axis=row.seq_axis, width=_width(model, row, None))


def _locate_on_attention(model, name: str, row: Component, layer: int, site: str) -> Address:
    """The interiors and the pattern: they hang off the attention call."""
    lay, heads = model.layers[layer], _heads(model, row)
    rank = (layer, row.order)
    if not _has(lay, "self_attn"):
        _refuse(f"component '{name}': layer {layer} has no attention module (self_attn)", site)
    if row.reach == "pattern":
        if not getattr(model, "attn_probs_available", False):
            _refuse(f"component '{name}': Attention probabilities are disabled for this model. "
                    "Set enable_attention_probs=True when loading the model to enable them.", site)
        return Address(component=name, layer=layer, module=row.module, io=row.io,
                       rank=rank, seq_axis=row.seq_axis, width=None, heads=heads)
    op = find_op(lay.self_attn, what=f"component '{name}'", path=f"sites.{site}")
    return Address(component=name, layer=layer, module=None, io=None, rank=rank, op=op,
                   seq_axis=row.seq_axis, width=_width(model, row, heads), heads=heads)


def _refuse_absent(model, name: str, row: Component, layer: int, site: str) -> None:
    """The places this layer's block structure has no tensor for, each with its sentence."""
    lay = model.layers[layer]
    mixer = linear_mixer(lay)
    if mixer is not None and name in ATTENTION:
        _refuse(LINEAR_REASON.format(name=name, layer=layer, mixer=mixer), site)
    if name in MOE_ABSENT and _is_moe(lay):
        _refuse(MOE_REASON.format(name=name, accessor=row.accessor), site)
    if name in PARALLEL_ABSENT and _is_parallel(model, lay):
        _refuse(PARALLEL_REASON.format(name=name, layer=layer), site)
    if name in POST_NORM_ABSENT and block_structure(lay) == "post-norm":
        _refuse(POST_NORM_REASON.format(name=name, layer=layer), site)


def _boundary_module(lay, name: str, row: Component, layer: int, site: str) -> tuple[Optional[str], Optional[str]]:
    """(module, io) of a per-layer boundary on this layer: the block structure's placement, else
    the first family spelling the module tree has, else the row's default."""
    moved = {"sandwich": SANDWICH, "post-norm": POST_NORM}.get(block_structure(lay), {})
    if name in moved:
        return moved[name]
    if name in SPELLINGS:
        found = [p for p in SPELLINGS[name] if _has(lay, p)]
        if not found:
            _refuse(f"component '{name}': layer {layer} has none of the modules "
                    f"{list(SPELLINGS[name])} that spell this place", site)
        return found[0], row.io
    return row.module, row.io


def _locate_boundary(model, name: str, row: Component, layer: int, site: str) -> Address:
    lay = model.layers[layer]
    module, io = _boundary_module(lay, name, row, layer, site)
    if module is None or not _has(lay, module):
        _refuse(f"component '{name}': layer {layer} has no module '{module}'", site)
    heads = _heads(model, row)
    return Address(component=name, layer=layer, module=module, io=io, rank=(layer, row.order),
                   seq_axis=row.seq_axis, width=_width(model, row, heads, lay), heads=heads)


def locate(model, name: str, layer: Optional[int] = None, site: str = "target",
           attn_implementation: Optional[str] = None,
           extra: Optional[Mapping[str, tuple[str, int]]] = None) -> Address:
    """Resolve component `name` (at `layer`) on a loaded StandardizedTransformer.

    `site` names the document's site, for messages and for the path a refusal carries
    (`sites.<site>`).  `attn_implementation` defaults to what the model runs.  `extra`
    maps a name outside the table to (module path relative to the layer, order): a module
    boundary read at its output, one per layer, with no width.

    The steps: a name outside the table is an extra or refused; the layer is checked; a
    per-layer place the block has no tensor for is refused; an eager-only place under
    another implementation is refused; then the place is resolved as a whole-model place,
    a place on the attention call, or a per-layer module boundary.
    """
    row = TABLE.get(name)
    if row is None:
        if name not in (extra or {}):
            _refuse(_unknown(name), site)
        return _locate_extra(model, name, layer, site, (extra or {})[name])
    _check_layer(model, name, row.layered, layer, site)
    if row.layered:
        assert layer is not None  # _check_layer refused a per-layer place without one
        _refuse_absent(model, name, row, layer, site)
    impl = attn_implementation or runs_attention(model)
    if row.eager and impl != "eager":
        _refuse(f"component '{name}' exists only under 'eager' attention, and this model runs "
                f"'{impl}': say \"attn_implementation\": \"eager\" in the document's model block", site)
    if not row.layered:
        return _locate_whole_model(model, name, row, site)
    assert layer is not None  # _check_layer refused a per-layer place without one
    if row.interior or row.reach == "pattern":
        return _locate_on_attention(model, name, row, layer, site)
    return _locate_boundary(model, name, row, layer, site)


def width(address: Address, path: str = "") -> int:
    """The feature width at an address, or the refusal a featurizer there gets."""
    if address.width is None:
        refuse_no_width(address.component, path)
    return address.width


def where_each_lands(model, layer: int = 0, extra=None, located_by=None) -> list[tuple[str, Any]]:
    """[(name, Address or the refusal's message)] for every row, at `layer` for per-layer
    rows (SPEC.md L18's "where each one lands"; the `model --lands` verb).

    `located_by(name, layer)`, when given, is used in place of `locate` on `model`: an
    engine's own `.locate`, which adds the refusals of that engine (the hooks engine's).
    """
    if located_by is None:
        def located_by(name, at):
            return locate(model, name, at, extra=extra)
    out = []
    for name, row in TABLE.items():
        try:
            out.append((name, located_by(name, layer if row.layered else None)))
        except Refusal as r:
            out.append((name, r.message))
    return out
