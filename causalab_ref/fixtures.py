"""Fixtures: six tiny seeded checkpoints, four of them stand-ins for the hub's tiny test checkpoints.

A document names a fixture by a key that cannot be mistaken for a hub key
(`fixture:tiny-llama`, `fixture:tiny-gpt2`, `fixture:tiny-gemma2`, `fixture:tiny-gptoss`,
`fixture:tiny-olmo2`, `fixture:tiny-qwen3next`); any other key is not a fixture and the caller
loads it from the hub by key + revision. SPEC.md §5 Fixtures describes the contract. The last
two stand in for no hub checkpoint: they are the block structures the first four lack (a
post-norm block; a hybrid of linear- and softmax-attention layers), SPEC.md L22, L30, X10.

Each fixture is a *recipe*: the architecture and config of one hub checkpoint
(hf-internal-testing/tiny-random-LlamaForCausalLM, hf-internal-testing/tiny-random-gpt2,
trl-internal-testing/tiny-Gemma2ForCausalLM, hf-internal-testing/tiny-random-GptOssForCausalLM;
see ../shared/reference/fixtures-configs.md), a seed, a weight-init rule, tokenizer files and
a chat template. `recipe_digest(key)` is the sha256 of all of that; run.json records it.

A recipe is built on first use into a cache directory outside the repo
(`$CAUSALAB_REF_CACHE`, default `~/.cache/causalab_ref/fixtures`), one directory per
fixture named `<name>-<digest[:12]>`, so a changed recipe builds a new directory. The build
writes into a temporary directory beside the final one and renames it into place; a
concurrent builder that wins the race is accepted. The output is byte-identical across
builds: config.json is `json.dumps(sort_keys=True)` of a dict this module controls, the
weights come from our own `torch.Generator` (never transformers' `_init_weights`) and are
written with `safetensors.torch.save_file` in sorted key order.

Loading notes (for the loader):
- Llama, GPT-2, Gemma-2: `AutoModelForCausalLM.from_pretrained(dir)` and
  `nnterp.StandardizedTransformer(str(dir))` need no extra kwargs.
- GptOss: `experts_implementation="batched_mm"` (needed for a meta / CPU forward) is written
  into config.json, which from_pretrained reads back (to_dict() alone would drop it), so no
  kwarg is needed either. nnterp's attention-probs validation needs
  `check_attn_probs_with_trace=False` on GptOss (the sink column), per stack-facts.md.
- OLMo-2 loads like Llama. Qwen3-Next writes `experts_implementation` as GptOss does; nnterp
  1.3.0 cannot load it without the hybrid arguments the loader gives it (SPEC.md L31).

Tokenizers:
- tiny-llama and tiny-gemma2 use the Llama-2 sentencepiece `tokenizer.model`, found in
  $CAUSALAB_REF_LLAMA_TOKENIZER, then ../shared/tokenizers/llama-2/, then the tiny Llama's hub
  repository. It is copied into the cache directory, never into the repo.
- tiny-gpt2, tiny-gptoss, tiny-olmo2 and tiny-qwen3next use a 1000-id byte-level BPE trained from
  fixture_data/bpe_corpus.txt; the trained vocab.json / merges.txt are committed under
  fixture_data/bpe/. No build trains: tests/bpe_trainer.py regenerates them, and a test checks
  that it reproduces the committed files. tiny-olmo2 also gets the committed tokenizer.json (the
  same BPE serialized), because transformers loads an OLMo-2 tokenizer only from one.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, Optional

from .shapes import Refusal

FIXTURE_PREFIX = "fixture:"

#: Bump when the weight-init rule (`_init_tensor`) changes; it is part of every digest.
INIT_RULE_VERSION = 1

LLAMA_TOKENIZER_ENV = "CAUSALAB_REF_LLAMA_TOKENIZER"
CACHE_ENV = "CAUSALAB_REF_CACHE"
LLAMA_HUB_REPO = "hf-internal-testing/tiny-random-LlamaForCausalLM"
LLAMA_HUB_REVISION = "9fb191250dd56d0ba7ec9785a025ed29c03d5998"
HUB_TIMEOUT_S = 5.0

_PKG_DIR = pathlib.Path(__file__).resolve().parent
DATA_DIR = _PKG_DIR / "fixture_data"
BPE_DIR = DATA_DIR / "bpe"
EOT = "<|endoftext|>"

# The standard Llama-2 chat template (meta-llama/Llama-2-7b-chat-hf). Rendering
# [user "Name a weekday.", assistant "Thursday.", user "If today is Thursday, tomorrow is"]
# gives `<s>[INST] Name a weekday. [/INST] Thursday. </s><s>[INST] If today is Thursday, tomorrow is [/INST]`.
LLAMA2_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

# ---------------------------------------------------------------- tokenizer configs

LLAMA_TOKENIZER_CONFIG: dict[str, Any] = {
    "tokenizer_class": "LlamaTokenizer",
    "legacy": False,
    "add_bos_token": True,
    "add_eos_token": False,
    "padding_side": "left",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "clean_up_tokenization_spaces": False,
    "model_max_length": 2048,
    "chat_template": LLAMA2_CHAT_TEMPLATE,
}

BPE_TOKENIZER_CONFIG: dict[str, Any] = {
    "tokenizer_class": "GPT2Tokenizer",
    "add_bos_token": False,
    "add_prefix_space": False,
    "padding_side": "left",
    "bos_token": EOT,
    "eos_token": EOT,
    "unk_token": EOT,
    "model_max_length": 1024,
}

# ---------------------------------------------------------------- model configs
# Dicts we control; config.json is exactly json.dumps(d, sort_keys=True) of these.

def _rope_decoder() -> dict[str, Any]:
    """The keys the three RoPE/RMS-norm decoders (Llama, OLMo-2, Qwen3-Next) share: two layers of four heads
    over 16 features, SiLU, default RoPE, an untied head. A fresh dict each call; each config below adds
    its own keys after these (a later key wins)."""
    return {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "dtype": "float32",
        "hidden_act": "silu",
        "hidden_size": 16,
        "initializer_range": 0.02,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": False,
        "use_cache": True,
    }


LLAMA_CONFIG: dict[str, Any] = {
    **_rope_decoder(),
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    # Hub config values (0 / 1 / -1); the Llama-2 tokenizer's own are 1 / 2 / none.
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": -1,
    "intermediate_size": 64,
    "max_position_embeddings": 2048,
    "mlp_bias": False,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
}

GPT2_CONFIG: dict[str, Any] = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "activation_function": "gelu_new",
    "attn_pdrop": 0.1,
    "bos_token_id": 98,
    "embd_pdrop": 0.1,
    "eos_token_id": 98,
    "pad_token_id": 98,
    "dtype": "float32",
    "initializer_range": 0.02,
    "intermediate_size": 37,  # present (unused) in the hub config; n_inner null -> 4 * n_embd
    "layer_norm_epsilon": 1e-5,
    "n_ctx": 512,
    "n_embd": 32,
    "n_head": 4,
    "n_inner": None,
    "n_layer": 5,
    "n_positions": 512,
    "resid_pdrop": 0.1,
    "scale_attn_weights": True,
    "tie_word_embeddings": True,
    "use_cache": True,
    "vocab_size": 1000,
}

GEMMA2_CONFIG: dict[str, Any] = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    # DEVIATION from the hub (bos 2 / eos 1 / pad 0): the stand-in reuses the Llama-2
    # tokenizer, so the config carries that tokenizer's bos/eos/pad, 1 / 2 / 0.
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "dtype": "float32",
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 8,
    "initializer_range": 0.02,
    "intermediate_size": 32,
    "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 8192,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "sliding_window": 4096,
    "tie_word_embeddings": True,
    "use_cache": True,
    # Ids >= 32000 exist in the model but not in the tokenizer (they decode to '').
    "vocab_size": 256249,
}

GPTOSS_CONFIG: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "attention_bias": True,
    "attention_dropout": 0.0,
    "dtype": "float32",
    # Not in the hub config. A PretrainedConfig kwarg that to_dict() never writes, but
    # from_pretrained(dir) reads it back from config.json: without it the CPU default
    # (grouped_mm) fails on meta tensors ("Expected inputs of BF16 type"); batched_mm works
    # on meta and CPU alike, so every loader gets it with no extra kwargs.
    "experts_implementation": "batched_mm",
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 512,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": 4096,
        "truncate": False,
    },
    "router_aux_loss_coef": 0.9,
    "sliding_window": 64,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 1000,
}

OLMO2_CONFIG: dict[str, Any] = {
    # A post-norm block (SPEC.md L22): each sublayer's output goes through post_attention_layernorm /
    # post_feedforward_layernorm before it is added; no input norms.  No hub checkpoint: a tiny config
    # of transformers' Olmo2Config with the BPE stand-in's vocabulary.
    **_rope_decoder(),
    "architectures": ["Olmo2ForCausalLM"],
    "model_type": "olmo2",
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
    "intermediate_size": 32,
    "max_position_embeddings": 512,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}

QWEN3NEXT_CONFIG: dict[str, Any] = {
    # A hybrid (SPEC.md L30): layer 0 mixes with Gated DeltaNet (`linear_attn`), layer 1 with softmax
    # attention (`self_attn`, output-gated); layer 1's MLP is a mixture of experts (with a shared
    # expert), layer 0's is dense.  No hub checkpoint: a tiny config of transformers' Qwen3NextConfig.
    **_rope_decoder(),
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
    "decoder_sparse_step": 1,
    # as GptOss: the experts' CPU default (grouped_mm) fails on meta tensors; batched_mm works
    "experts_implementation": "batched_mm",
    "head_dim": 4,
    "intermediate_size": 32,
    "layer_types": ["linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 2,
    "linear_key_head_dim": 4,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 4,
    "max_position_embeddings": 512,
    "mlp_only_layers": [0],
    "moe_intermediate_size": 8,
    "norm_topk_prob": True,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 8,
    "vocab_size": 1000,
}

# The recipe table (public: tests compare a built config.json with its row): name -> (config, seed,
# tokenizer kind, hub checkpoint it stands in for)
RECIPES: dict[str, dict[str, Any]] = {
    name: {"config": config, "seed": seed, "tokenizer": tokenizer, "stands_in_for": stands_in_for}
    for name, config, seed, tokenizer, stands_in_for in [
        ("tiny-llama", LLAMA_CONFIG, 1001, "llama2", "hf-internal-testing/tiny-random-LlamaForCausalLM"),
        ("tiny-gpt2", GPT2_CONFIG, 1002, "bpe", "hf-internal-testing/tiny-random-gpt2"),
        ("tiny-gemma2", GEMMA2_CONFIG, 1003, "llama2", "trl-internal-testing/tiny-Gemma2ForCausalLM"),
        ("tiny-gptoss", GPTOSS_CONFIG, 1004, "bpe", "hf-internal-testing/tiny-random-GptOssForCausalLM"),
        ("tiny-olmo2", OLMO2_CONFIG, 1005, "bpe-json", "no hub checkpoint: a tiny Olmo2Config (post-norm block)"),
        ("tiny-qwen3next", QWEN3NEXT_CONFIG, 1006, "bpe",
         "no hub checkpoint: a tiny Qwen3NextConfig (linear/full hybrid)"),
    ]
}

# ---------------------------------------------------------------- keys


def is_fixture(key: str) -> bool:
    """True when `key` names a fixture (starts with `fixture:`), known or not."""
    return isinstance(key, str) and key.startswith(FIXTURE_PREFIX)


def names() -> tuple[str, ...]:
    """The fixture keys, in a fixed order."""
    return tuple(FIXTURE_PREFIX + n for n in RECIPES)


def _name(key: str) -> str:
    if is_fixture(key):
        name = key[len(FIXTURE_PREFIX):]
        if name in RECIPES:
            return name
    raise Refusal(
        f"unknown fixture {key!r}; the fixtures are {', '.join(names())}",
        path="model.key", stage="compile",
    )


# ---------------------------------------------------------------- tokenizer sources


def _sha256_file(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _shared_llama_dir() -> pathlib.Path:
    """../shared/tokenizers/llama-2/ relative to the repo root."""
    return pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "tokenizers" / "llama-2"


def _hub_llama_tokenizer() -> pathlib.Path:
    """tokenizer.model from the tiny Llama's hub repo: the local HF cache first, then a
    download when the hub answers a short TCP probe (raises when neither works)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import hf_hub_download

    kwargs: dict[str, Any] = dict(repo_id=LLAMA_HUB_REPO, filename="tokenizer.model", revision=LLAMA_HUB_REVISION,
                                  cache_dir=str(_cache_root() / "hub"))
    try:
        return pathlib.Path(hf_hub_download(local_files_only=True, **kwargs))
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise OSError("HF_HUB_OFFLINE is set and the file is not in the local cache")
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:  # a short probe, so an unreachable hub costs seconds, not huggingface_hub's retries
        socket.create_connection((endpoint.hostname, port), timeout=HUB_TIMEOUT_S).close()
    except OSError as e:
        raise OSError(f"hub unreachable ({endpoint.hostname}:{port}: {e})") from e
    return pathlib.Path(hf_hub_download(etag_timeout=HUB_TIMEOUT_S, **kwargs))


def llama_tokenizer_model() -> pathlib.Path:
    """Find the Llama-2 tokenizer.model: env dir, then ../shared, then the hub; else one Refusal."""
    tried = []
    env = os.environ.get(LLAMA_TOKENIZER_ENV)
    if env:
        p = pathlib.Path(env) / "tokenizer.model"
        if p.is_file():
            return p
        tried.append(f"${LLAMA_TOKENIZER_ENV}={env} (no tokenizer.model there)")
    else:
        tried.append(f"${LLAMA_TOKENIZER_ENV} (not set)")
    shared = _shared_llama_dir() / "tokenizer.model"
    if shared.is_file():
        return shared
    tried.append(f"{shared} (missing)")
    hub = f"hub {LLAMA_HUB_REPO}@{LLAMA_HUB_REVISION} file tokenizer.model"
    try:
        p = _hub_llama_tokenizer()
        if p.is_file():
            return p
        tried.append(f"{hub} (download gave no file)")
    except Exception as e:  # unreachable hub, offline mode, missing package: all the same here
        reason = (str(e).splitlines() or [""])[0][:160]
        tried.append(f"{hub} ({type(e).__name__}: {reason})")
    raise Refusal(
        "the Llama-2 tokenizer.model (needed by the Llama and Gemma-2 fixtures) was not found; "
        "looked in: " + "; ".join(tried)
        + f". Point ${LLAMA_TOKENIZER_ENV} at a directory holding tokenizer.model.",
        path="model.key", stage="compile",
    )


def _bpe_files(with_json: bool = False) -> dict[str, pathlib.Path]:
    names = ("vocab.json", "merges.txt") + (("tokenizer.json",) if with_json else ())
    return {fn: BPE_DIR / fn for fn in names}


def _tokenizer_sources(name: str) -> tuple[dict[str, pathlib.Path], dict[str, Any]]:
    """(files to copy into the checkpoint dir, tokenizer_config dict) for a recipe."""
    kind = RECIPES[name]["tokenizer"]
    if kind == "llama2":
        return {"tokenizer.model": llama_tokenizer_model()}, LLAMA_TOKENIZER_CONFIG
    return _bpe_files(with_json=kind == "bpe-json"), BPE_TOKENIZER_CONFIG


# ---------------------------------------------------------------- digest


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _recipe(name: str) -> dict[str, Any]:
    r = RECIPES[name]
    files, tok_config = _tokenizer_sources(name)
    return {
        "name": name,
        "stands_in_for": r["stands_in_for"],
        "config": r["config"],
        "seed": r["seed"],
        "init_rule_version": INIT_RULE_VERSION,
        "tokenizer_files": {fn: _sha256_file(p) for fn, p in sorted(files.items())},
        "tokenizer_config": tok_config,  # includes the chat template when there is one
    }


def recipe_digest(key: str) -> str:
    """sha256 hex of the fixture's recipe (config, seed, init rule, tokenizer files, chat template)."""
    return hashlib.sha256(_canonical(_recipe(_name(key)))).hexdigest()


# ---------------------------------------------------------------- weights


def _tensor_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big") & ((1 << 63) - 1)


#: norm classes whose weight is zero-centred (the norm scales by 1 + weight), so init 0 is scale 1
ZERO_CENTRED_NORMS = ("Gemma2RMSNorm", "Qwen3NextRMSNorm")


def _init_tensor(name: str, shape: tuple[int, ...], norm_class: Optional[str], seed: int):
    """Init rule v1: norm weights scale 1 (1, or 0 for a zero-centred norm: Gemma-2's and
    Qwen3-Next's RMSNorm), biases 0, everything else (matrices, embeddings, GptOss sinks, the
    DeltaNet's A_log) normal(0, 0.02) drawn in float64 from a generator seeded by (recipe seed,
    tensor name), then cast to float32.  (Deciding the zero-centred norms by class gives the four
    first fixtures the tensors the earlier by-family wording gave, so the version stays 1.)"""
    import torch

    leaf = name.rsplit(".", 1)[-1]
    if norm_class is not None and leaf == "weight":
        fill = 0.0 if norm_class in ZERO_CENTRED_NORMS else 1.0
        return torch.full(shape, fill, dtype=torch.float32)
    if leaf == "bias" or leaf.endswith("_bias"):
        return torch.zeros(shape, dtype=torch.float32)
    g = torch.Generator(device="cpu")
    g.manual_seed(_tensor_seed(seed, name))
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 0.02).to(torch.float32).contiguous()


def _state_dict(name: str) -> dict[str, Any]:
    """Seeded weights for every tensor save_pretrained would store (tied ones once)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    r = RECIPES[name]
    cfg_dict = dict(r["config"])
    model_type = cfg_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg_dict)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    # Names as save_pretrained stores them: state_dict keys minus the tied targets.
    keys = set(model.state_dict().keys())
    tied = getattr(model, "_tied_weights_keys", None) or {}
    if config.tie_word_embeddings and isinstance(tied, dict):
        keys -= set(tied.keys())
    norm_params: dict[str, str] = {}
    for mod_name, mod in model.named_modules():
        if "norm" in type(mod).__name__.lower():
            for p_name, _ in mod.named_parameters(recurse=False):
                norm_params[f"{mod_name}.{p_name}" if mod_name else p_name] = type(mod).__name__
    shapes = dict(model.state_dict().items())
    out = {}
    for k in sorted(keys):
        out[k] = _init_tensor(k, tuple(shapes[k].shape), norm_params.get(k), r["seed"])
    return out


# ---------------------------------------------------------------- build


def _cache_root() -> pathlib.Path:
    env = os.environ.get(CACHE_ENV)
    root = pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "causalab_ref" / "fixtures"
    return root.expanduser()


def _write_json(path: pathlib.Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=True) + "\n", encoding="utf-8")


def _build(name: str, recipe: dict[str, Any], digest: str, out: pathlib.Path) -> None:
    from safetensors.torch import save_file

    files, tok_config = _tokenizer_sources(name)
    for fn, src in sorted(files.items()):
        shutil.copyfile(src, out / fn)
        if _sha256_file(out / fn) != recipe["tokenizer_files"][fn]:
            raise RuntimeError(f"fixture {name}: {src} changed while building")
    _write_json(out / "tokenizer_config.json", tok_config)
    _write_json(out / "config.json", RECIPES[name]["config"])
    sd = _state_dict(name)
    save_file({k: sd[k] for k in sorted(sd)}, str(out / "model.safetensors"), metadata={"format": "pt"})
    hashes = {f.name: _sha256_file(f) for f in sorted(out.iterdir())}
    _write_json(out / RECORD, {"digest": digest, "recipe": recipe, "files": hashes})


#: the file of a fixture's cache folder that records its recipe and every other file's sha256
RECORD = "fixture_recipe.json"
_VERIFIED: dict[pathlib.Path, tuple] = {}


def _signature(folder: pathlib.Path) -> tuple:
    return tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in folder.iterdir()))


def damaged(folder: pathlib.Path, digest: str) -> list[str]:
    """The files of a cached fixture that are not what its build wrote: missing, truncated or changed
    (sha256 against the record written at build); every file when the record itself is unreadable,
    of another recipe, or from before records held the files' digests (SPEC.md S23)."""
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
        files = record["files"] if record.get("digest") == digest else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        files = None
    if not isinstance(files, dict):
        return [RECORD]
    return [name for name, sha in sorted(files.items())
            if not (folder / name).is_file() or _sha256_file(folder / name) != sha]


def _verified(name: str, recipe: dict[str, Any], digest: str, final: pathlib.Path) -> pathlib.Path:
    """A cached fixture folder whose files are checked against its record once per process (and again when
    a file's size or time changes); damaged files are rebuilt in place, one atomic replace each."""
    try:
        signature = _signature(final)
        if _VERIFIED.get(final) == signature:
            return final
        bad = damaged(final, digest)
        if bad:
            _repair(name, recipe, digest, final)
        _VERIFIED[final] = _signature(final)
    except OSError as error:
        raise Refusal(f"fixture '{name}': its cache folder {final} could not be verified or rebuilt "
                      f"({error.strerror or type(error).__name__}); make {final.parent} writable or point "
                      f"${CACHE_ENV} at a writable folder", path="model.key", stage="compile") from None
    return final


def _repair(name: str, recipe: dict[str, Any], digest: str, final: pathlib.Path) -> None:
    """Rebuild a fixture beside its folder and move each rebuilt file over the cached one (the record last),
    so a reader of the folder sees each file whole, old or new (builds are byte-identical, X1)."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        _build(name, recipe, digest, tmp)
        for file in sorted(tmp.iterdir(), key=lambda f: f.name == RECORD):
            os.replace(file, final / file.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def checkpoint_dir(key: str) -> pathlib.Path:
    """The fixture's checkpoint directory, built on first use (atomically) in the cache."""
    name = _name(key)
    recipe = _recipe(name)
    digest = hashlib.sha256(_canonical(recipe)).hexdigest()
    root = _cache_root()
    final = root / f"{name}-{digest[:12]}"
    if final.is_dir():
        return _verified(name, recipe, digest, final)
    root.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{name}-{digest[:12]}.", suffix=".tmp", dir=root))
    try:
        _build(name, recipe, digest, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():  # not a concurrent builder finishing first: a real error
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


_TOKENIZERS: dict[pathlib.Path, Any] = {}


def tokenizer(key: str):
    """AutoTokenizer.from_pretrained(checkpoint_dir(key)), cached per process."""
    d = checkpoint_dir(key)
    if d not in _TOKENIZERS:
        from transformers import AutoTokenizer

        _TOKENIZERS[d] = AutoTokenizer.from_pretrained(str(d))
    return _TOKENIZERS[d]
