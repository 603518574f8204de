"""The load's fast paths against their plain definitions, and its checks kept (SPEC.md §11 Q40-Q42; issue 39 item 3).

Q40: the load timed against nnsight's keeps every check. Q41: while nnterp's StandardizedTransformer is built, an nnsight envoy's miss names its path instead of
printing its subtree; every envoy must get exactly the aliases nnsight's own lookup gives, and outside a load
the lookup is nnsight's. Q42: nnterp's renaming scan is skipped only for a recipe's config where it passes; the
loads with and without it must agree on every fixture under every attention implementation. No timings here:
bench (m) times the load against nnsight.LanguageModel.
"""
from __future__ import annotations

import contextlib
import json
import shutil

import pytest
import torch
from nnsight.intervention.envoy import Envoy
from nnterp import rename_utils

from causalab_ref.engines import checkpoint, loading
from causalab_ref.fixtures import builder, recipes
from causalab_ref.shapes import Model, Refusal, read_json


def _aliases(envoy) -> list:
    """Every envoy of the tree, in order: its path and the alias tables nnsight built on it."""
    alias = envoy._alias
    rows = [(envoy.path, None if alias is None else (alias.alias_to_name, alias.name_to_aliases, alias.extras))]
    for child in envoy._children:
        rows += _aliases(child)
    return rows


@pytest.mark.parametrize("key", ["fixture:tiny-llama", "fixture:tiny-gpt2", "fixture:tiny-qwen3next"])
def test_plain_misses_give_every_envoy_nnsights_aliases(key, monkeypatch):
    """SPEC.md:1879 [Q41] — the shell built with the misses named by path has, envoy by envoy, the aliases (and
    the tree) of the shell built with nnsight's own lookup, which prints the subtree on each miss."""
    path = str(builder.checkpoint_dir(key))
    fast = checkpoint.standardized(path, weights=False)
    monkeypatch.setattr(checkpoint, "plain_misses", contextlib.nullcontext)
    plain = checkpoint.standardized(path, weights=False)
    assert _aliases(fast) == _aliases(plain)
    assert fast.layers[0].path == plain.layers[0].path and fast.ln_final.path == plain.ln_final.path


def test_the_lookup_is_nnsights_outside_a_load(tmp_path):
    """SPEC.md:1879 [Q41] — inside, a miss is an AttributeError naming the envoy's path and an alias or a module
    is found as nnsight finds it; after a load, and after a load that is refused, the lookup is nnsight's own
    again (a miss prints the subtree)."""
    original = Envoy.__getattr__
    model = loading.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"), weights=False).model
    assert Envoy.__getattr__ is original
    layer = model.layers[0]
    with checkpoint.plain_misses():
        with pytest.raises(AttributeError, match=r"^envoy 'model\.model\.layers\.0' has no attribute nothing_here$"):
            layer.nothing_here  # noqa: B018
        assert layer.self_attn is model.layers[0].self_attn and model.layers is model.model.layers
    with pytest.raises(AttributeError) as miss:
        layer.nothing_here  # noqa: B018
    assert "LlamaDecoderLayer(" in str(miss.value)  # nnsight's message: the subtree printed
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 0, "hidden_size": 0}')
    with pytest.raises(Refusal):
        checkpoint.load(Model(key=str(bad), revision="main", dtype="fp32"), weights=False)
    assert Envoy.__getattr__ is original


def _outcome(spec: Model):
    """What a meta load gives: the tree's module paths and whether the pattern is on, or the refusal."""
    try:
        model = loading.load(spec, weights=False).model
    except Refusal as refusal:
        return (refusal.message, refusal.path, refusal.stage)
    return [name for name, _ in model._model.named_modules()], model.attn_probs_available


@pytest.mark.parametrize("attn", [None, "sdpa", "eager"])
@pytest.mark.parametrize("key", builder.names())
def test_the_renaming_scan_is_skipped_only_where_it_passes(key, attn, monkeypatch):
    """SPEC.md:1886 [Q42] — on every fixture under each attention implementation: where the load skips nnterp's
    renaming check (a recipe's config, no pattern enabled), the load that runs it runs its scan, which passes
    (no fallback to a trace), and both loads give the same tree and pattern accessor, or the same refusal."""
    spec = Model(key=key, revision="seeded", dtype="fp32", attn_implementation=attn)
    assert recipes.vouched(read_json(builder.checkpoint_dir(key) / "config.json"))
    skipped = []
    known = checkpoint.renaming_known
    monkeypatch.setattr(checkpoint, "renaming_known", lambda raw, kw: skipped.append(known(raw, kw)) or skipped[-1])
    fast = _outcome(spec)
    monkeypatch.setattr(checkpoint, "renaming_known", lambda raw, kw: False)
    scans = []
    scan = rename_utils.try_with_scan
    monkeypatch.setattr(rename_utils, "try_with_scan", lambda *a, **k: scans.append(scan(*a, **k)) or scans[-1])
    plain = _outcome(spec)
    assert fast == plain
    if any(skipped) and isinstance(plain, tuple) and isinstance(plain[0], list):
        assert scans[:1] == [True]  # the plain load ran the check first, and its scan passed
    assert any(skipped) == (attn != "eager" or key == "fixture:tiny-qwen3next") or isinstance(plain[0], str)


def test_a_config_that_is_no_recipes_keeps_the_renaming_scan(tmp_path, monkeypatch):
    """SPEC.md:1886 [Q42] — a checkpoint folder whose config.json is not a recipe's (one key added) is loaded
    with nnterp's renaming check: its scan runs."""
    folder = tmp_path / "llama"
    shutil.copytree(builder.checkpoint_dir("fixture:tiny-llama"), folder)
    config = (folder / "config.json").read_text(encoding="utf-8")
    (folder / "config.json").write_text(config.rstrip().rstrip("}") + ', "mystery": 1}', encoding="utf-8")
    calls = []
    check = rename_utils.check_model_renaming
    from nnterp import standardized_transformer

    monkeypatch.setattr(standardized_transformer, "check_model_renaming", lambda *a, **k: calls.append(1) or check(*a, **k))
    loading.load(Model(key=str(folder), revision="main", dtype="fp32"), weights=True)
    assert calls == [1]
    calls.clear()
    loading.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"), weights=True)
    assert calls == []


def test_the_timed_load_keeps_every_check(tmp_path):
    """SPEC.md:1863 [Q40] — the load bench (m) times, of an exported folder: records its files' digests and the
    recipe; a weight file swapped for one of other values is recorded by its new digest and without the recipe
    (S29); one lacking a tensor is refused naming it (S22); a config naming its own code is refused (S20)."""
    from safetensors.torch import load_file, save_file

    from causalab_ref.fixtures import exported

    folder = exported.export(tmp_path / "fx", keys=["fixture:tiny-llama"])[0][1].resolve()
    spec = Model(key=str(folder), revision="main", dtype="fp32")
    record = loading.load(spec).recipe
    assert record["fixture_recipe"] == builder.recipe_digest("fixture:tiny-llama")
    assert record["model_files"] == {p.name: builder.sha256_file(p) for p in folder.iterdir()}
    weights = load_file(folder / "model.safetensors")
    name = sorted(weights)[0]
    save_file({**weights, name: weights[name] + 1.0}, folder / "model.safetensors", metadata={"format": "pt"})
    changed = loading.load(spec)
    assert "fixture_recipe" not in changed.recipe
    assert changed.recipe["model_files"]["model.safetensors"] == builder.sha256_file(folder / "model.safetensors")
    assert torch.equal(changed.model._model.state_dict()[name], weights[name] + 1.0)
    save_file({k: v for k, v in weights.items() if k != name}, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(Refusal, match=rf"do not match its config \(missing {name}\)"):
        loading.load(spec)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "x.Y"}}), encoding="utf-8")
    with pytest.raises(Refusal, match="config.json has an `auto_map`"):
        loading.load(spec)
