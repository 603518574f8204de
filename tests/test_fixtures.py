"""The six fixtures: keys, tokenizers, chat template, reproducible builds, refusals."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from causalab_ref import fixtures
from causalab_ref.shapes import Refusal

REPO = pathlib.Path(__file__).resolve().parents[1]
PROMPT = "If today is Thursday, tomorrow is"


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    """Every in-process build goes to a fresh cache dir, never ~/.cache."""
    old = os.environ.get(fixtures.CACHE_ENV)
    os.environ[fixtures.CACHE_ENV] = str(tmp_path_factory.mktemp("fixture-cache"))
    yield
    if old is None:
        os.environ.pop(fixtures.CACHE_ENV, None)
    else:
        os.environ[fixtures.CACHE_ENV] = old


def test_keys():
    """SPEC.md:18 [D6] / SPEC.md:175 [X1] — fixture keys carry the `fixture:` prefix; others are hub keys."""
    assert fixtures.names() == (
        "fixture:tiny-llama", "fixture:tiny-gpt2", "fixture:tiny-gemma2", "fixture:tiny-gptoss",
        "fixture:tiny-olmo2", "fixture:tiny-qwen3next")
    assert fixtures.is_fixture("fixture:tiny-gpt2")
    assert not fixtures.is_fixture("hf-internal-testing/tiny-random-gpt2")
    assert not fixtures.is_fixture("tiny-gpt2")


def test_unknown_fixture_refused():
    """SPEC.md:18 [D6] — an unknown `fixture:` key is refused, naming it and the known ones."""
    with pytest.raises(Refusal) as e:
        fixtures.checkpoint_dir("fixture:tiny-mistral")
    msg = str(e.value)
    assert "fixture:tiny-mistral" in msg
    assert all(n in msg for n in fixtures.names())


def test_llama_ids():
    """SPEC.md:176 [X2] / SPEC.md:178 [X4] — the Llama fixture's tokenizer reproduces the Llama-2 ids, BOS added."""
    tok = fixtures.tokenizer("fixture:tiny-llama")
    assert tok(PROMPT).input_ids == [1, 960, 9826, 338, 498, 1295, 3250, 29892, 6454, 22396, 338]
    assert tok("").input_ids == [1]
    assert tok.padding_side == "left"


def test_llama_chat_template():
    """SPEC.md:176 [X2] — the Llama fixture renders the standard Llama-2 chat template."""
    tok = fixtures.tokenizer("fixture:tiny-llama")
    msgs = [{"role": "user", "content": "Name a weekday."},
            {"role": "assistant", "content": "Thursday."},
            {"role": "user", "content": PROMPT}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == ("<s>[INST] Name a weekday. [/INST] Thursday. </s>"
                    "<s>[INST] If today is Thursday, tomorrow is [/INST]")


def test_gpt2_bpe():
    """SPEC.md:177 [X3] — the 1000-id byte-level BPE: no BOS, "If" splits in two, 'I' is 41."""
    tok = fixtures.tokenizer("fixture:tiny-gpt2")
    ids = tok(PROMPT).input_ids
    assert ids[:2] == [41, 70]
    assert tok.convert_ids_to_tokens(ids[:2]) == ["I", "f"]
    assert tok("If").input_ids == [41, 70]
    assert tok("").input_ids == []
    assert len(tok(" Friday").input_ids) >= 3
    assert len(tok) == 1000
    assert tok.convert_ids_to_tokens(0) == "<|endoftext|>"
    assert tok.bos_token == tok.eos_token == tok.unk_token == "<|endoftext|>"
    assert tok.padding_side == "left"
    assert tok.decode(ids) == PROMPT
    assert fixtures.tokenizer("fixture:tiny-gptoss")(PROMPT).input_ids == ids


def test_committed_bpe_matches_training(tmp_path):
    """SPEC.md:177 [X3] — the committed vocab.json / merges.txt are what train_bpe() produces."""
    from bpe_trainer import train_bpe

    out = train_bpe(out_dir=tmp_path)
    for fn in ("vocab.json", "merges.txt"):
        assert (out / fn).read_bytes() == (fixtures.BPE_DIR / fn).read_bytes(), fn


def test_olmo2_and_qwen3next_reuse_the_bpe_and_olmo2_ships_its_json(tmp_path):
    """SPEC.md:179 [X10] — the two structure fixtures tokenize as the GPT-2 fixture does (same ids, no BOS,
    left padding); OLMo-2's checkpoint carries tokenizer.json, which is the committed BPE serialized."""
    from bpe_trainer import tokenizer_json

    ids = fixtures.tokenizer("fixture:tiny-gpt2")(PROMPT).input_ids
    for key in ("fixture:tiny-olmo2", "fixture:tiny-qwen3next"):
        tok = fixtures.tokenizer(key)
        assert tok(PROMPT).input_ids == ids and tok("").input_ids == [] and tok.padding_side == "left", key
    olmo2 = fixtures.checkpoint_dir("fixture:tiny-olmo2")
    assert (olmo2 / "tokenizer.json").read_bytes() == (fixtures.BPE_DIR / "tokenizer.json").read_bytes()
    assert not (fixtures.checkpoint_dir("fixture:tiny-qwen3next") / "tokenizer.json").exists()
    out = tokenizer_json(out_dir=tmp_path)
    assert (out / "tokenizer.json").read_bytes() == (fixtures.BPE_DIR / "tokenizer.json").read_bytes()


def test_zero_centred_norms_start_at_zero_the_others_at_one():
    """SPEC.md:180 [X11] — Qwen3-Next's RMSNorm weights are 0 (it scales by 1 + weight), its gated DeltaNet
    norm's 1; OLMo-2's norms 1; Gemma-2's 0 and Llama's 1 as before."""
    from safetensors.torch import load_file

    def norms(key):
        sd = load_file(str(fixtures.checkpoint_dir(key) / "model.safetensors"))
        return {k: set(v.unique().tolist()) for k, v in sd.items() if "norm" in k and k.endswith("weight")}

    q = norms("fixture:tiny-qwen3next")
    assert q["model.layers.0.linear_attn.norm.weight"] == {1.0}
    assert q["model.layers.0.input_layernorm.weight"] == q["model.layers.1.self_attn.q_norm.weight"] == {0.0}
    assert q["model.norm.weight"] == {0.0}
    assert all(v == {1.0} for v in norms("fixture:tiny-olmo2").values())
    assert all(v == {0.0} for v in norms("fixture:tiny-gemma2").values())
    assert all(v == {1.0} for v in norms("fixture:tiny-llama").values())


_BUILD_SCRIPT = """
import hashlib, json, sys
from causalab_ref import fixtures
out = {}
for key in fixtures.names():
    d = fixtures.checkpoint_dir(key)
    out[key] = {"dir": d.name, "digest": fixtures.recipe_digest(key),
                **{fn: hashlib.sha256((d / fn).read_bytes()).hexdigest()
                   for fn in ("model.safetensors", "config.json", "tokenizer_config.json")}}
print(json.dumps(out))
"""


def _builds_in_fresh_processes(*caches: pathlib.Path) -> list[dict]:
    """Build every fixture into each empty cache, one fresh process per cache, the processes side by side."""
    def start(cache: pathlib.Path) -> subprocess.Popen:
        env = dict(os.environ, **{fixtures.CACHE_ENV: str(cache)})
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        return subprocess.Popen([sys.executable, "-c", _BUILD_SCRIPT], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=str(REPO))

    builds = []
    for proc in [start(cache) for cache in caches]:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        builds.append(json.loads(out.strip().splitlines()[-1]))
    return builds


def test_builds_are_byte_identical(tmp_path):
    """SPEC.md:175 [X1] / SPEC.md:179 [X10] — two builds in fresh processes and caches give identical files and
    digests, all six fixtures."""
    a, b = _builds_in_fresh_processes(tmp_path / "a", tmp_path / "b")
    assert set(a) == set(fixtures.names())
    assert a == b
    for key, rec in a.items():
        assert rec["dir"] == f"{key.split(':', 1)[1]}-{rec['digest'][:12]}"


def test_checkpoints_load_cleanly():
    """SPEC.md:175 [X1] / SPEC.md:179 [X10] — each checkpoint loads with no missing or unexpected keys, tied where
    the hub ties."""
    import torch
    from transformers import AutoModelForCausalLM

    expected = {  # parameter counts of the hub checkpoints (fixtures-configs.md)
        "fixture:tiny-llama": (1_032_272, False), "fixture:tiny-gpt2": (111_968, True),
        "fixture:tiny-gemma2": (2_100_752, True), "fixture:tiny-gptoss": (352_976, False),
        "fixture:tiny-olmo2": (None, False), "fixture:tiny-qwen3next": (None, False),  # no hub checkpoint
    }
    for key, (n_params, tied) in expected.items():
        d = fixtures.checkpoint_dir(key)
        model, info = AutoModelForCausalLM.from_pretrained(str(d), output_loading_info=True)
        assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), (key, info)
        assert n_params is None or sum(p.numel() for p in model.parameters()) == n_params, key
        same = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        assert same == tied, key
        ids = fixtures.tokenizer(key)(PROMPT, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        assert torch.isfinite(logits).all(), key
        assert json.loads((d / "config.json").read_text()) == fixtures.RECIPES[key.split(":", 1)[1]]["config"]


def test_concurrent_builder_accepted(monkeypatch, tmp_path):
    """SPEC.md:175 [X1] — a build that loses the rename race to a finished concurrent build uses it."""
    monkeypatch.setenv(fixtures.CACHE_ENV, str(tmp_path))
    real_build = fixtures._build

    def racing_build(name, recipe, digest, out):
        real_build(name, recipe, digest, out)
        final = tmp_path / f"{name}-{digest[:12]}"
        final.mkdir()
        (final / "config.json").write_text("{}")  # the other builder finished first

    monkeypatch.setattr(fixtures, "_build", racing_build)
    d = fixtures.checkpoint_dir("fixture:tiny-gpt2")
    assert (d / "config.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == [d.name]  # the temp dir is gone


def test_missing_llama_tokenizer_names_all_three_places(monkeypatch, tmp_path):
    """SPEC.md:176 [X2] — with no tokenizer.model anywhere, one Refusal names env var, shared dir and hub."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(fixtures.LLAMA_TOKENIZER_ENV, str(empty))
    monkeypatch.setenv(fixtures.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(fixtures, "_shared_llama_dir", lambda: tmp_path / "no-shared" / "llama-2")

    def no_hub():
        raise OSError("hub unreachable (test)")

    monkeypatch.setattr(fixtures, "_hub_llama_tokenizer", no_hub)
    for key in ("fixture:tiny-llama", "fixture:tiny-gemma2"):
        with pytest.raises(Refusal) as e:
            fixtures.checkpoint_dir(key)
        err = e.value
        assert err.stage == "compile" and err.path == "model.key"
        msg = str(err)
        assert fixtures.LLAMA_TOKENIZER_ENV in msg and str(empty) in msg
        assert str(tmp_path / "no-shared" / "llama-2") in msg
        assert fixtures.LLAMA_HUB_REPO in msg and fixtures.LLAMA_HUB_REVISION in msg
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    # the GPT-2 family does not need it
    assert fixtures.recipe_digest("fixture:tiny-gpt2")


def test_digest_covers_tokenizer_file(monkeypatch, tmp_path):
    """SPEC.md:175 [X1] — the recipe digest covers the Llama tokenizer.model bytes."""
    before = fixtures.recipe_digest("fixture:tiny-llama")
    other = tmp_path / "tok"
    other.mkdir()
    src = fixtures.llama_tokenizer_model()
    (other / "tokenizer.model").write_bytes(src.read_bytes() + b"\0")
    monkeypatch.setenv(fixtures.LLAMA_TOKENIZER_ENV, str(other))
    assert fixtures.recipe_digest("fixture:tiny-llama") != before
    assert len(before) == 64
