"""Families: what a meta load's module tree says about a checkpoint, as plain data per architecture family.

`locate` (address.py) asks a model's module tree a handful of questions: which modules a layer has, the
input width of its down projection, the class of a linear-attention mixer, the name of the attention
call's `.source` operation, how many layers there are, and whether nnterp's pattern accessor is on. For the
families below those answers follow from the config alone, and this module holds them as one `Family` row
per `model_type` (the module paths are nnterp 1.3.0's standardized names under transformers 5), so that
`skeleton(config, family, attention)` builds a tree of `Node`s that `locate` walks exactly as it walks an
nnterp model (`address.module_at`), with no torch module, nnsight or transformers' modeling code in reach.

`ConfigView` is the config as compile reads it: config.json's values, the family's aliases (GPT-2's
`n_embd` is `hidden_size`) and derived values (Llama's `head_dim`), for exactly the names in `READS`; any
other name raises `Uncovered`, so a question this view was not built for is never answered by a guess.
tests/engines/test_weightless.py checks every row against a meta load of each fixture. SPEC.md §3, E9.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

#: the config names compile asks (address.py, runs/compile.py, runs/memory.py); a ConfigView answers these only
READS = ("text_config", "_attn_implementation", "num_attention_heads", "n_head", "num_key_value_heads",
         "qk_head_dim", "v_head_dim", "head_dim", "hidden_size", "n_embd", "vocab_size", "intermediate_size",
         "n_inner", "use_parallel_residual", "parallel_attn", "max_position_embeddings", "n_positions")

#: the name of the attention call's operation in every family's attention forward (address.find_op)
OP = "attention_interface_0"


class Uncovered(Exception):
    """A question about the config that the view does not answer: compile is redone on a meta load."""


@dataclass(frozen=True)
class Family:
    """One architecture family's module tree and config semantics, as a meta load shows them.

    `norms`, `attention`, `mlp`, `experts` are the module paths (relative to a layer) of its norms, of a
    softmax-attention mixer, of a dense MLP (its last path the down projection) and of a mixture-of-experts
    MLP; `inner` the config keys whose first set value is the down projection's input width (`inner_factor`
    times the hidden size when none is set), read off the module as `inner_attr`; `takes` the attention
    implementations a load accepts and `default` the one it runs when the document names none; `aliases` the
    config class's attribute map; `head_dim` whether the class derives `head_dim` (hidden / heads) when absent."""

    norms: tuple[str, ...]
    default: str
    takes: tuple[str, ...] = ("eager", "sdpa")
    attention: tuple[str, ...] = ("self_attn", "self_attn.o_proj")
    mlp: tuple[str, ...] = ("mlp", "mlp.act_fn", "mlp.down_proj")
    experts: tuple[str, ...] = ("mlp", "mlp.experts")
    inner: tuple[str, ...] = ("intermediate_size",)
    inner_attr: str = "in_features"
    inner_factor: int = 0
    aliases: Mapping[str, str] = field(default_factory=dict)
    head_dim: bool = False
    linear_mixer: Optional[tuple[str, str]] = None  # (module path, class name) of a linear-attention layer


PRE_NORM = ("input_layernorm", "post_attention_layernorm")

FAMILIES: dict[str, Family] = {
    "llama": Family(norms=PRE_NORM, default="sdpa", head_dim=True),
    "gpt2": Family(norms=("ln_1", "ln_2"), default="sdpa", attention=("self_attn", "self_attn.c_proj"),
                   mlp=("mlp", "mlp.act", "mlp.c_proj"), inner=("n_inner",), inner_attr="nx", inner_factor=4,
                   aliases={"hidden_size": "n_embd", "num_attention_heads": "n_head",
                            "num_hidden_layers": "n_layer", "max_position_embeddings": "n_positions"}),
    "gemma2": Family(norms=(*PRE_NORM, "pre_feedforward_layernorm", "post_feedforward_layernorm"),
                     default="eager", takes=("eager",)),
    "gpt_oss": Family(norms=PRE_NORM, default="eager", takes=("eager",)),
    "olmo2": Family(norms=("post_attention_layernorm", "post_feedforward_layernorm"), default="sdpa"),
    "qwen3_next": Family(norms=PRE_NORM, default="sdpa", linear_mixer=("linear_attn", "Qwen3NextGatedDeltaNet")),
}


class Node:
    """One module of a tree known as data: its class name, the integer attributes `locate` reads off it, the
    attention call's operation (on a `self_attn`), and its submodules by dotted path (a layer's). Attribute
    access reaches a submodule as an envoy's does (`layer.self_attn`)."""

    def __init__(self, class_name: str = "Module", ints: Optional[dict[str, int]] = None, op: Optional[str] = None,
                 modules: Optional[dict[str, "Node"]] = None):
        self.class_name, self.ints, self.op = class_name, dict(ints or {}), op
        self.modules = dict(modules or {})

    def find(self, path: str) -> Optional["Node"]:
        """The module at dotted `path` below this one ('' is itself), or None when the tree has none."""
        return self if path == "" else self.modules.get(path)

    def __getattr__(self, name: str) -> "Node":
        found = self.__dict__.get("modules", {}).get(name)
        if found is None:
            raise AttributeError(name)
        return found


class Skeleton(Node):
    """A model's tree as data: the whole-model modules, `layers`, the config view and whether nnterp's
    attention-pattern accessor is on (`attn_probs_available`, as on a StandardizedTransformer)."""

    def __init__(self, config: "ConfigView", layers: list[Node], probs: bool):
        super().__init__("Skeleton", modules={name: Node() for name in ("embed_tokens", "ln_final", "lm_head")})
        self.config, self.layers, self.num_layers, self.attn_probs_available = config, layers, len(layers), probs


class ConfigView:
    """The checkpoint's config as compile reads it (`READS`), from config.json and the family's row alone."""

    def __init__(self, raw: Mapping[str, Any], family: Family, attention: str):
        values = dict(raw)
        for name, source in family.aliases.items():
            if source in values:
                values[name] = values[source]
        if family.head_dim and values.get("head_dim") is None:
            values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
        values["_attn_implementation"] = attention
        self.raw = raw
        self.values = {name: values[name] for name in READS if name in values}

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        if name in READS or name.startswith("__"):
            raise AttributeError(name)  # absent on the config class too (test_weightless), or Python's own
        raise Uncovered(name)

    def get_text_config(self) -> "ConfigView":
        """The decoder's config: the config itself (no family here nests one)."""
        return self

    def get(self, key: str, default: Any = None) -> Any:
        """A value of config.json itself (what this module derives the tree from)."""
        return self.raw.get(key, default)


def _inner(config: ConfigView, family: Family) -> int:
    for key in family.inner:
        if config.get(key):
            return int(config.get(key))
    return family.inner_factor * int(config.hidden_size)


def _layer(config: ConfigView, family: Family, i: int) -> Node:
    """Layer `i`'s modules: its norms, its mixer (softmax attention, or a hybrid's linear one) and its MLP
    (dense, or a mixture of experts on GptOss and on Qwen3-Next's sparse layers)."""
    types = config.get("layer_types") or []
    linear = family.linear_mixer is not None and i < len(types) and types[i] == "linear_attention"
    modules = {path: Node() for path in family.norms}
    if linear:
        assert family.linear_mixer is not None
        modules[family.linear_mixer[0]] = Node(family.linear_mixer[1])
    else:
        modules.update({path: Node(op=OP if path == "self_attn" else None) for path in family.attention})
    if _sparse(config, i):
        modules.update({path: Node() for path in family.experts})
    else:
        modules.update({path: Node() for path in family.mlp})
        modules[family.mlp[-1]] = Node(ints={family.inner_attr: _inner(config, family)})
    return Node("Layer", modules=modules)


def _sparse(config: ConfigView, i: int) -> bool:
    """Whether layer `i`'s MLP is a mixture of experts: every GptOss layer; a Qwen3-Next layer outside
    `mlp_only_layers` at every `decoder_sparse_step`-th layer when the config has experts."""
    if config.get("model_type") == "gpt_oss":
        return True
    if config.get("model_type") != "qwen3_next" or not config.get("num_experts"):
        return False
    return i not in (config.get("mlp_only_layers") or []) and (i + 1) % int(config.get("decoder_sparse_step", 1)) == 0


def skeleton(raw: Mapping[str, Any], attn_implementation: Optional[str]) -> Optional[Skeleton]:
    """The tree a meta load of a checkpoint with config.json `raw` would have under the document's
    `attn_implementation`; None when this module does not know the family or the load would refuse it."""
    family = FAMILIES.get(str(raw.get("model_type")))
    if family is None or (attn_implementation is not None and attn_implementation not in family.takes):
        return None
    config = ConfigView(raw, family, attn_implementation or family.default)
    n = raw.get(family.aliases.get("num_hidden_layers", "num_hidden_layers"))
    layers = [_layer(config, family, i) for i in range(int(n))]  # type: ignore[arg-type]
    return Skeleton(config, layers, probs=attn_implementation == "eager")
