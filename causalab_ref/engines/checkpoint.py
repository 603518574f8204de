"""Checkpoint: loading a document's model block, for both engines, with one error mapping.

This module owns where a checkpoint is (`find`: a fixture directory built or reused, or a
hub key and revision), the per-family StandardizedTransformer arguments (`load_kwargs`),
the document dtypes as torch's (`torch_dtype`), the two loads (`standardized`: an nnterp
StandardizedTransformer; `transformers_model`: the plain transformers model the hooks
engine runs), and `load(spec, ...)`: what both engines call, which turns any failure of
the libraries into one refusal naming the key (`unloadable`). SPEC.md §7 Safety.
"""
from __future__ import annotations

import json
import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from ..fixtures import exported, builder, recipes
from ..shapes import Model, Refusal, read_json

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


def find(spec: Model, weights: bool = True) -> tuple[str, dict[str, Any]]:
    """Where a model block's checkpoint is: (a local directory, what run.json records of where it came from).

    A folder key (a path key, or a key `$CONFORM_CHECKPOINTS` maps; exported.py) is that folder, recorded,
    when its weights are loaded, by its files' sha256 and its recipe only when they are the manifest's (S29);
    a `fixture:` key is built, verified or rebuilt here and recorded by its recipe digest; a hub key is found
    in the local hub cache first and fetched only when it is not there (SPEC.md S21). Every loader then reads
    a local directory."""
    folder = exported.folder_for(spec.key)
    if folder is not None:
        return str(folder), exported.provenance(folder) if weights else {}
    if builder.is_fixture(spec.key):
        return str(builder.checkpoint_dir(spec.key)), {"fixture_recipe": builder.recipe_digest(spec.key)}
    return hub_snapshot(spec), {}  # a folder whose key has no path prefix is not looked at (X17)


#: the files a hub checkpoint is fetched with: configs, tokenizer files, safetensors weights; never code
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken"]


def hub_snapshot(spec: Model) -> str:
    """A hub key's local snapshot directory: the local cache first; the network only when the key is not
    there, after a quick check that the hub is reachable. Refused naming the key and what was tried."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError

    label = f"model '{spec.key}' at revision '{spec.revision}'"
    tried = []
    try:
        return snapshot_download(spec.key, revision=spec.revision, local_files_only=True, allow_patterns=HUB_FILES)
    except HFValidationError:
        raise Refusal(f"{label} is not a fixture ('fixture:tiny-llama', ...), a checkpoint directory, or a hub "
                      f"key of the form 'owner/name'{_path_hint(spec.key)}", path="model.key",
                      stage="compile") from None
    except (OSError, ValueError) as error:
        tried.append(f"the local hub cache {constants.HF_HUB_CACHE} ({type(error).__name__})")
    unreachable = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else _unreachable(constants.ENDPOINT)
    if not unreachable:
        try:
            return snapshot_download(spec.key, revision=spec.revision, allow_patterns=HUB_FILES)
        except (OSError, ValueError) as error:
            unreachable = f"{type(error).__name__}: {_first_line(error)}"
    tried.append(f"the hub {constants.ENDPOINT} ({unreachable})")
    raise Refusal(f"{label} could not be found: tried {' and '.join(tried)}; name a fixture, a local checkpoint "
                  f"directory, or a hub key that is cached or reachable{_path_hint(spec.key)}", path="model.key",
                  stage="compile")


def _path_hint(key: str) -> str:
    """A hub key's refusal says how a folder is named: a path key starts with ./, ../ or / (SPEC.md X17), and
    a folder of the key's name here is named with ./ in front."""
    try:
        here = f" (the folder here is './{key}')" if Path(key).is_dir() else ""
    except (OSError, ValueError):  # a name the file system will not take is no folder here
        here = ""
    return f"; a checkpoint directory's key is a path that must start with ./, ../ or /, so '{key}' is a hub key{here}"


def _unreachable(endpoint: str) -> str:
    """'' when the hub's host takes a connection within a few seconds (or a proxy is configured), else why."""
    import socket
    from urllib.parse import urlparse

    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return ""
    url = urlparse(endpoint)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=3).close()
    except OSError as error:
        return f"unreachable: {error}"
    return ""


def _first_line(error: Exception) -> str:
    text = str(error)
    return text.splitlines()[0] if text else ""


def names_code(value) -> bool:
    """Whether a parsed JSON value holds an `auto_map` key at any depth (a nested config's too)."""
    if isinstance(value, dict):
        return "auto_map" in value or any(names_code(v) for v in value.values())
    return isinstance(value, list) and any(names_code(v) for v in value)


def own_code(directory: str, spec: Model) -> None:
    """Refuse a checkpoint that names its own code (an `auto_map` key in any of its JSON files: config.json,
    tokenizer_config.json, ...), before anything of it is read by the libraries (SPEC.md S20). The files
    are parsed, so a key spelled with escapes is found and the words "auto_map" inside a string (a chat
    template, a description) are not a key; a file that is not JSON is judged by its text."""
    files = _plain_files(Path(directory), spec)
    for file in sorted(Path(directory).glob("*.json")):
        if file.name.endswith(".index.json") or file.name not in files:
            continue  # the weight index (tensor names only); a dangling link or a folder the library will name
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # the library's own load will name it
        try:
            value = json.loads(text)
            named = names_code(value)
        except (ValueError, RecursionError):
            value, named = None, '"auto_map"' in text
        _class_names(file.name, value, spec)
        _layer_count(file.name, value, spec)
        if named:
            raise Refusal(f"model '{spec.key}': {file.name} has an `auto_map`, which names code shipped with the "
                          "checkpoint; causalab_ref never runs a checkpoint's own code. Use a checkpoint of an "
                          "architecture transformers implements, with no auto_map", path="model.key", stage="compile")


#: the most a checkpoint's JSON file may hold (a large vocabulary's tokenizer.json is tens of MiB): SPEC.md S31
JSON_LIMIT = 256 << 20


def _plain_files(directory: Path, spec: Model) -> set[str]:
    """The names of the folder's regular files (a link to one is one). An entry that is, or links to, a device,
    a FIFO or a socket, and a JSON file past JSON_LIMIT, are refused before any library opens them: a reader
    would block, or read without end (SPEC.md S31)."""
    plain = set()
    for entry in os.scandir(directory):
        try:
            info = os.stat(entry.path)
        except (OSError, ValueError):
            continue  # dangling, a loop: the library's own load names it
        if stat.S_ISDIR(info.st_mode):
            continue
        if not stat.S_ISREG(info.st_mode):
            raise Refusal(f"model '{spec.key}': {entry.name} is not a regular file (a device, a FIFO or a socket, "
                          "or a link to one); a checkpoint folder holds files", path="model.key", stage="compile")
        if entry.name.endswith(".json") and info.st_size > JSON_LIMIT:
            raise Refusal(f"model '{spec.key}': {entry.name} is {info.st_size} bytes, past the {JSON_LIMIT >> 20} MiB "
                          "a checkpoint's JSON file may hold", path="model.key", stage="compile")
        plain.add(entry.name)
    return plain


def _is_token(value) -> bool:
    """A special token as transformers takes it: a string, or an AddedToken's object with a string content."""
    return isinstance(value, str) or (isinstance(value, dict) and isinstance(value.get("content"), str))


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_TOKEN = ("a string, null or an object with a string `content`", lambda v: v is None or _is_token(v))
_TOKENS = ("a list of such tokens", lambda v: v is None or (isinstance(v, list) and all(_is_token(t) for t in v)))
#: per file, the fields naming a class or a special token: (what they must be, the test) (SPEC.md S30)
CLASS_FIELDS: dict[str, dict[str, tuple]] = {
    "config.json": {"model_type": ("a string", lambda v: isinstance(v, str)),
                    "architectures": ("a list of strings or null", lambda v: v is None or (
                        isinstance(v, list) and all(isinstance(a, str) for a in v)))},
    "tokenizer_config.json": {"tokenizer_class": ("a string or null", lambda v: v is None or isinstance(v, str)),
                              **{f"{t}_token": _TOKEN for t in ("bos", "eos", "unk", "pad", "sep", "cls", "mask")},
                              "additional_special_tokens": _TOKENS,
                              "model_max_length": ("a number", _number),
                              "padding_side": ("'left' or 'right'", lambda v: v in ("left", "right")),
                              "truncation_side": ("'left' or 'right'", lambda v: v in ("left", "right"))},
}
_MISSING = object()


def _class_names(name: str, value, spec: Model) -> None:
    """Refuse a config.json or tokenizer_config.json whose field naming a class or a special token is of
    another type (transformers would raise a TypeError there, which S10 keeps for the project's own bugs):
    SPEC.md S30."""
    if not isinstance(value, dict):
        return
    for field, (want, fits) in CLASS_FIELDS.get(name, {}).items():
        given = value.get(field, _MISSING)
        if given is not _MISSING and not fits(given):
            raise Refusal(f"model '{spec.key}': {name}'s `{field}` is {_json_kind(given)}, not {want}",
                          path="model.key", stage="compile")


#: the most layers a checkpoint's config may say: a meta load builds every layer's modules (SPEC.md D36)
MAX_LAYERS = 1_000
#: the config fields transformers reads a decoder's layer count from, at the top or in `text_config`
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers")


def _layer_count(name: str, value, spec: Model) -> None:
    """Refuse a config.json whose layer count is not an integer from 1 to MAX_LAYERS, before any library builds
    a module of it (a meta load of 10^9 layers does not end; 0 layers fail inside nnterp): SPEC.md D36."""
    if name != "config.json" or not isinstance(value, dict):
        return
    nested = value.get("text_config")
    for prefix, config in (("", value), ("text_config.", nested if isinstance(nested, dict) else {})):
        for field in LAYER_FIELDS:
            count = config.get(field, _MISSING)
            if count is _MISSING or count is None:
                continue
            if type(count) is not int or not 1 <= count <= MAX_LAYERS:
                digits = len(str(count)) if type(count) is int else 0
                shown = count if 0 < digits <= 20 else f"an integer of {digits} digits" if digits else _json_kind(count)
                raise Refusal(f"model '{spec.key}': config.json's `{prefix}{field}` is {shown}; a model has from 1 to "
                              f"{MAX_LAYERS:,} layers", path="model.key", stage="compile")


def _json_kind(value) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")


def unloadable(spec: Model, error: Exception) -> Refusal:
    """The refusal for a checkpoint the libraries could not load (both engines)."""
    first = _first_line(error)
    *others, last = [repr(name) for name in builder.names()]
    return Refusal(f"model '{spec.key}' at revision '{spec.revision}' could not be loaded "
                   f"({type(error).__name__}: {first}); "
                   f"a fixture is named {', '.join(others)} or {last}, any other key is loaded from the hub",
                   path="model.key", stage="compile")


def loading_errors() -> tuple[type[Exception], ...]:
    """What loading a checkpoint raises for a bad or absent checkpoint: files (OSError), configs and
    tokenizers (ValueError, KeyError), weights (RuntimeError, safetensors' error), nnterp's renaming, and
    huggingface_hub's strict-dataclass validation (a config field of the wrong type, `"vocab_size": 1e4`).
    Anything else (a TypeError, an AttributeError, ...) is a bug and stays one (SPEC.md S10)."""
    from huggingface_hub.errors import StrictDataclassError
    from nnterp.rename_utils import RenamingError
    from safetensors import SafetensorError

    return (OSError, ValueError, KeyError, RuntimeError, ImportError, SafetensorError, RenamingError,
            StrictDataclassError)


#: the libraries that read a checkpoint's files: an exception raised while one of them is on the stack is the
#: checkpoint's (SPEC.md S10)
READERS = ("transformers", "huggingface_hub", "tokenizers", "safetensors", "sentencepiece")


def raised_reading(error: BaseException) -> bool:
    """Whether `error` passed through a frame of a library reading the checkpoint (READERS), as when
    transformers builds a shell from a config.json whose `head_dim` is 0 (ZeroDivisionError) (SPEC.md S10)."""
    tb = error.__traceback__
    while tb is not None:
        parts = Path(tb.tb_frame.f_code.co_filename).parts
        at = parts.index("site-packages") + 1 if "site-packages" in parts else len(parts)
        if at < len(parts) and parts[at] in READERS:
            return True
        tb = tb.tb_next
    return False


@contextmanager
def mapped(spec: Model):
    """Inside: a refusal passes through; a failure of loading (`loading_errors`, or any exception a reading
    library raised: `raised_reading`) becomes `unloadable`."""
    try:
        yield
    except Refusal:
        raise
    except loading_errors() as error:
        raise unloadable(spec, error) from None
    except Exception as error:  # noqa: BLE001 -- the library's, on this checkpoint's files, or else ours
        if raised_reading(error):
            raise unloadable(spec, error) from None
        raise


@contextmanager
def tensors_checked(spec: Model):
    """Inside: a weights load whose tensors do not match the model — missing, unexpected or mis-shaped —
    is refused naming them (SPEC.md S22), instead of loading random values silently.

    transformers decides which tensors a model needs (tied weights, renamed keys, ignorable buffers) and
    reports it through `log_state_dict_report`; while inside, that report is read here first."""
    from transformers import modeling_utils

    original = modeling_utils.log_state_dict_report

    def report(model, pretrained_model_name_or_path, ignore_mismatched_sizes, loading_info, logger=None):
        problems = [(what, sorted(str(k) for k in keys)[:8], len(keys)) for what, keys in (
            ("missing", loading_info.missing_keys), ("unexpected", loading_info.unexpected_keys),
            ("mis-shaped", loading_info.mismatched_keys)) if keys]
        if problems:
            said = "; ".join(f"{what} {', '.join(names)}" + (f" (and {n - len(names)} more)" if n > len(names) else "")
                             for what, names, n in problems)
            raise Refusal(f"model '{spec.key}': its weights do not match its config ({said}); a checkpoint must "
                          "hold every tensor the model has, each with its shape, and nothing else",
                          path="model.key", stage="compile")
        return original(model, pretrained_model_name_or_path, ignore_mismatched_sizes, loading_info, logger)

    modeling_utils.log_state_dict_report = report
    try:
        yield
    finally:
        modeling_utils.log_state_dict_report = original


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
    kw: dict[str, Any] = {"dispatch": bool(weights)}
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


def renaming_known(raw, kw: dict[str, Any]) -> bool:
    """Whether nnterp's renaming check (`check_model_renaming`: a scan of a 3-token forward, its shapes checked
    at every name) is known to pass on this load, which then skips it (SPEC.md Q42): the config is a fixture
    recipe's (`recipes.vouched`), whose check passes under every attention it loads with (tested on each), and
    the load enables no attention pattern, which nnterp checks only inside that check."""
    return not kw.get("enable_attention_probs") and recipes.vouched(raw)


@contextmanager
def plain_misses():
    """Inside: an nnsight envoy asked for a name that is neither its alias nor its module's raises the
    AttributeError nnsight raises, naming the envoy's path instead of printing its whole subtree (SPEC.md Q41).
    nnsight's aliasing asks every envoy for every name of nnterp's rename table and drops each miss, so the
    miss's message is never read. Every other lookup is nnsight's own."""
    from nnsight.intervention.envoy import Envoy

    original = Envoy.__getattr__

    def lookup(self, name: str):
        fields = self.__dict__
        if "_alias" in fields and "_module" in fields:
            alias = fields["_alias"]
            if (alias is None or name not in alias.alias_to_name) and not hasattr(fields["_module"], name):
                raise AttributeError(f"envoy '{fields.get('path', '')}' has no attribute {name}")
        return original(self, name)

    Envoy.__getattr__ = lookup  # type: ignore[method-assign]
    try:
        yield
    finally:
        Envoy.__getattr__ = original  # type: ignore[method-assign]


def standardized(path: str, attn_implementation: Optional[str] = None, weights: bool = True,
                 dtype: Optional[str] = None, device_map: str = "cpu", **overrides):
    """Load a checkpoint directory (or hub key) as a StandardizedTransformer.

    `attn_implementation` None keeps the family's default; `weights=False` is a meta
    load (config and module tree only; the first trace dispatches).
    """
    from transformers import AutoConfig
    from nnterp import StandardizedTransformer

    config = AutoConfig.from_pretrained(path, trust_remote_code=False, revision=overrides.get("revision"))
    model_type, softmax_layers = config.model_type, softmax_layers_of_hybrid(config)
    kw = load_kwargs(model_type, attn_implementation, weights)
    kw["device_map"] = device_map
    if softmax_layers is not None:
        kw = hybrid_kwargs(kw)
    # Never a checkpoint's own code, and only safetensors weights (SPEC.md R13).
    kw["trust_remote_code"] = False
    if weights:
        kw["use_safetensors"] = True
    if dtype is not None:
        kw["dtype"] = torch_dtype(dtype)
    kw.update(overrides)
    if renaming_known(read_json(Path(path) / "config.json"), kw):
        kw["check_renaming"] = False
    dispatch_after = False
    if model_type == "gpt_oss" and kw.get("enable_attention_probs") and kw.get("dispatch"):
        # nnterp's scan check of the pattern sums rows to 1 on real values, which a sink
        # breaks: check on the meta model, then load the weights.
        kw["dispatch"], dispatch_after = False, True
    with plain_misses():
        model = StandardizedTransformer(path, **kw)
    if dispatch_after:
        model.dispatch()
    if softmax_layers and attn_implementation == "eager":
        enable_probs(model, softmax_layers[0], weights)
    return model


def transformers_model(path: str, attn_implementation: str, dtype: str, device_map: str = "cpu"):
    """The plain transformers model of a checkpoint (the hooks engine's forward), in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, attn_implementation=attn_implementation, dtype=torch_dtype(dtype), device_map=device_map,
        trust_remote_code=False, use_safetensors=True, local_files_only=True)
    model.eval()
    return model


def load(spec: Model, weights: bool = True, hooked: bool = False, device_map: str = "cpu"):
    """A model block's checkpoint: (StandardizedTransformer, transformers model or None, provenance: `where`).

    `hooked` (the hooks engine): the StandardizedTransformer is a weightless shell for addresses,
    and with `weights` a transformers model of the same directory is loaded beside it, with the
    attention the shell says the document gets (the family default, or the document's). `device_map` is
    the run's (`--device-map`, contract.device_map), handed to both loaders as transformers takes it."""
    from ..locations.address import runs_attention

    quiet_transformers()
    path, recipe = find(spec, weights)
    own_code(path, spec)
    with mapped(spec), tensors_checked(spec):
        model = standardized(path, attn_implementation=spec.attn_implementation,
                             weights=weights and not hooked, dtype=spec.dtype, device_map=device_map)
        hf_model = None
        if hooked and weights:
            hf_model = transformers_model(path, runs_attention(model), spec.dtype, device_map)
    return model, hf_model, recipe
