"""`model KEY` states each layer's attention heads (SPEC.md L35), checked against each fixture's config.json."""
from __future__ import annotations

import json

import pytest

from causalab_ref.fixtures import builder
from inprocess import cli


def _from_config(key: str) -> dict[str, dict]:
    """What config.json says, read as plain JSON: heads, key/value heads (the heads where unset) and head width
    (`head_dim`, else the hidden width over the heads); a `linear_attention` layer has no heads."""
    config = json.loads((builder.checkpoint_dir(key) / "config.json").read_text(encoding="utf-8"))
    heads = config.get("num_attention_heads") or config["n_head"]
    width = config.get("head_dim") or (config.get("hidden_size") or config["n_embd"]) // heads
    counts = {"heads": heads, "kv_heads": config.get("num_key_value_heads") or heads, "head_dim": width}
    layers = config.get("num_hidden_layers") or config["n_layer"]
    kinds = config.get("layer_types") or ["full_attention"] * layers
    return {f"attention[{i}]": counts for i, kind in enumerate(kinds) if kind != "linear_attention"}


@pytest.mark.parametrize("engine", ["nnterp", "hooks"])
@pytest.mark.parametrize("key", ["fixture:weekday-llama", "fixture:tiny-gpt2", "fixture:tiny-gemma2",
                                 "fixture:tiny-gptoss", "fixture:tiny-qwen3next"])
def test_model_states_each_layers_heads_kv_heads_and_head_width(key, engine):
    """SPEC.md:443 [L35] `--json model` gives each attention layer's heads, key/value heads and head width as the
    config states them (Gemma-2's 256-wide heads on an 8-wide stream, GptOss's 2 key/value heads); a
    linear-attention layer is one refused line; the text prints a run of equal layers once."""
    done = cli("--json", "model", key, "--engine", engine)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)["attention"]
    want = _from_config(key)
    assert {label: {k: a[k] for k in ("heads", "kv_heads", "head_dim")} for label, a in got.items()
            if a["resolves"]} == want
    refused = {label for label, a in got.items() if not a["resolves"]}
    assert refused == ({"attention[0]"} if key == "fixture:tiny-qwen3next" else set())
    text = cli("model", key, "--engine", engine).stdout.splitlines()
    lines = [line for line in text if line.startswith("  attention[")]
    if key == "fixture:weekday-llama":
        assert lines == [f"  {'attention[0-2]':24s} ok   heads=4  kv_heads=4  head_dim=16"]
    if key == "fixture:tiny-qwen3next":
        assert lines[0].startswith(f"  {'attention[0]':24s} --   ") and "linear-attention layer" in lines[0]
        assert lines[1] == f"  {'attention[1]':24s} ok   heads=4  kv_heads=2  head_dim=4"
