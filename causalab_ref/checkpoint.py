"""Checkpoint: loading a document's model block, for both engines, with one error mapping.

This module owns where a checkpoint is (`where`: a fixture directory built or reused, or a
hub key and revision), the per-family StandardizedTransformer arguments (`load_kwargs`),
the document dtypes as torch's (`torch_dtype`), the two loads (`standardized`: an nnterp
StandardizedTransformer; `transformers_model`: the plain transformers model the hooks
engine runs), and `load(spec, ...)`: what both engines call, which turns any failure of
the libraries into one refusal naming the key (`unloadable`). SPEC.md §7 Hardening.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Optional

from . import exported, fixtures
from .shapes import Model, Refusal

#: the document's dtypes (SPEC.md D5) as torch's names; the one map both engines load with
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def torch_dtype(name: str):
    """The torch dtype of a document's `dtype` (`fp32`, `bf16`)."""
    import torch

    return getattr(torch, DTYPES[name])


def quiet_transformers() -> None:
    """Loading chatter (progress bars, config warnings) is not a result; keep stderr for refusals."""
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def where(spec: Model) -> tuple[str, Optional[str], dict[str, Any]]:
    """Where a model block's checkpoint is: (directory or hub key, the fixture's recipe digest or None,
    the extra `from_pretrained` arguments). A `fixture:` key is built or reused here (both engines), unless
    the key names a local folder (a path key, or a key `$CONFORM_CHECKPOINTS` maps; exported.py)."""
    folder = exported.folder_for(spec.key)
    if folder is not None:
        return str(folder), exported.recipe_of(folder), {}
    if fixtures.is_fixture(spec.key):
        return str(fixtures.checkpoint_dir(spec.key)), fixtures.recipe_digest(spec.key), {}
    return spec.key, None, {"revision": spec.revision}


def unloadable(spec: Model, error: Exception) -> Refusal:
    """The refusal for a checkpoint the libraries could not load (both engines)."""
    first = str(error).splitlines()[0] if str(error) else ""
    *others, last = [repr(name) for name in fixtures.names()]
    return Refusal(f"model '{spec.key}' at revision '{spec.revision}' could not be loaded "
                   f"({type(error).__name__}: {first}); "
                   f"a fixture is named {', '.join(others)} or {last}, any other key is loaded from the hub",
                   path="model.key", stage="compile")


@contextmanager
def mapped(spec: Model):
    """Inside: a refusal passes through; any other failure of the libraries becomes `unloadable`."""
    try:
        yield
    except Refusal:
        raise
    except Exception as error:
        raise unloadable(spec, error) from None


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


def softmax_layers_of_hybrid(config) -> Optional[list[int]]:
    """A hybrid (its config's `layer_types` has `linear_attention` layers, Qwen3-Next): its
    softmax-attention layers (maybe none); None for any other model."""
    types = list(getattr(config, "layer_types", None) or [])
    if "linear_attention" not in types:
        return None
    return [i for i, t in enumerate(types) if t != "linear_attention"]


def hybrid_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    """A hybrid's StandardizedTransformer arguments (SPEC.md L31).  nnterp 1.3.0 checks for `self_attn`
    and the pattern on layer 0 only, and a hybrid's layer 0 may mix with `linear_attn` (`RenamingError:
    Could not find self_attn module`): skip nnterp's attention check (`ignore_attn`), and load eager
    without nnterp's pattern check; `enable_probs` checks it on a softmax layer after the load."""
    from nnterp.rename_utils import RenameConfig

    kw = {**kw, "rename_config": RenameConfig(ignore_attn=True)}
    if kw.pop("enable_attention_probs", False):
        kw.pop("check_attn_probs_with_trace", None)
        kw["attn_implementation"] = "eager"
    return kw


def enable_probs(model, layer: int, weights: bool) -> None:
    """Turn on nnterp's attention-pattern accessor after nnterp's own check at `layer` (a trace with
    weights, a scan without), as `enable_attention_probs=True` does at layer 0."""
    probs = model.attention_probabilities
    probs.enabled, probs.initialized_with_enable = True, True
    probs.check_source(layer=layer, use_trace=bool(weights))


def standardized(path: str, attn_implementation: Optional[str] = None, weights: bool = True,
                 dtype: Optional[str] = None, **overrides):
    """Load a checkpoint directory (or hub key) as a StandardizedTransformer.

    `attn_implementation` None keeps the family's default; `weights=False` is a meta
    load (config and module tree only; the first trace dispatches).
    """
    from transformers import AutoConfig
    from nnterp import StandardizedTransformer

    config = AutoConfig.from_pretrained(path, trust_remote_code=False, revision=overrides.get("revision"))
    model_type, softmax_layers = config.model_type, softmax_layers_of_hybrid(config)
    kw = load_kwargs(model_type, attn_implementation, weights)
    if softmax_layers is not None:
        kw = hybrid_kwargs(kw)
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
    if softmax_layers and attn_implementation == "eager":
        enable_probs(model, softmax_layers[0], weights)
    return model


def transformers_model(path: str, attn_implementation: str, dtype: str, **overrides):
    """The plain transformers model of a checkpoint (the hooks engine's forward), in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, attn_implementation=attn_implementation, dtype=torch_dtype(dtype), device_map="cpu",
        trust_remote_code=False, use_safetensors=True, **overrides)
    model.eval()
    return model


def load(spec: Model, weights: bool = True, hooked: bool = False):
    """A model block's checkpoint: (StandardizedTransformer, transformers model or None, recipe).

    `hooked` (the hooks engine): the StandardizedTransformer is a weightless shell for addresses,
    and with `weights` a transformers model of the same directory is loaded beside it, with the
    attention the shell says the document gets (the family default, or the document's)."""
    from .address import runs_attention

    quiet_transformers()
    path, recipe, overrides = where(spec)
    with mapped(spec):
        model = standardized(path, attn_implementation=spec.attn_implementation,
                             weights=weights and not hooked, dtype=spec.dtype, **overrides)
        hf_model = None
        if hooked and weights:
            hf_model = transformers_model(path, runs_attention(model), spec.dtype, **overrides)
    return model, hf_model, recipe
