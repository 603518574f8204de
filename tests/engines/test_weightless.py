"""weightless.py and families.py: compile's engine from config.json and the tokenizer, against the meta load.

For every fixture under each attention implementation the weightless engine must say what the meta load
says: the same layers, attention, config values, tokenizer, and for every place at every layer the same
address or the same refusal; where the meta load refuses the checkpoint, or the config is not a recipe's,
it must not answer at all, so the meta load refuses as it always has.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from causalab_ref.engines import loading, weightless
from causalab_ref.engines.nnterp import NNterpEngine
from causalab_ref.fixtures import builder
from causalab_ref.locations import address, families
from causalab_ref.shapes import Model, Refusal

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["If today is Thursday, tomorrow is", " Monday comes", "a\nb  c", "日本"]


def _answer(eng, component: str, layer):
    try:
        return eng.locate(component, layer, site="s")
    except Refusal as refusal:
        return (refusal.message, refusal.path, refusal.stage)


def _tokenizer_facts(tok) -> dict:
    return {"side": tok.padding_side, "size": len(tok),
            "special": {k: getattr(tok, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")},
            "template": tok.chat_template, "ids": tok(TEXTS, padding=True)["input_ids"],
            "mask": tok(TEXTS, padding=True)["attention_mask"],
            "pieces": [tok.convert_ids_to_tokens(ids) for ids in tok(TEXTS)["input_ids"]]}


@pytest.mark.parametrize("attn", [None, "eager", "sdpa"])
@pytest.mark.parametrize("key", builder.names())
def test_the_weightless_engine_answers_as_the_meta_load(key, attn):
    """SPEC.md:1948 [E9] — on every fixture under each attention implementation: the weightless engine is
    there exactly where the meta load loads, and its layers, attention, config values (families.READS), its
    tokenizer and every place at every layer (and one past the stack) resolve to the same answer."""
    spec = Model(key=key, revision="seeded", dtype="fp32", attn_implementation=attn)
    view = weightless.load(spec)
    try:
        meta = loading.load(spec, weights=False)
    except Refusal:
        assert view is None
        return
    assert view is not None
    assert (view.num_layers, view.attention()) == (meta.num_layers, meta.attention())
    for name in families.READS:
        assert getattr(view.config, name, None) == getattr(meta.config, name, None), name
        assert getattr(view.config.get_text_config(), name, None) == getattr(meta.config.get_text_config(), name, None)
    assert _tokenizer_facts(view.tokenizer) == _tokenizer_facts(meta.tokenizer)
    for component, row in address.TABLE.items():
        for layer in (range(meta.num_layers + 1) if row.layered else [None, 0]):
            assert _answer(view, component, layer) == _answer(meta, component, layer), (component, layer)


def test_a_config_that_is_no_recipes_gets_the_meta_load(tmp_path):
    """SPEC.md:1948 [E9] — a checkpoint folder whose config.json is not a fixture recipe's (one key added)
    gets no weightless engine, and `loading.compiled` compiles on the meta load instead."""
    folder = tmp_path / "llama"
    shutil.copytree(builder.checkpoint_dir("fixture:tiny-llama"), folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, "mystery": 1}), encoding="utf-8")
    spec = Model(key=str(folder), revision="main", dtype="fp32")
    assert weightless.load(spec) is None
    eng, layers = loading.compiled(spec, lambda e: e.num_layers)
    assert isinstance(eng, NNterpEngine) and layers == 2


def test_a_config_question_the_view_was_not_built_for_is_compiled_on_the_meta_load():
    """SPEC.md:1948 [E9] — a compile that asks the config a name outside families.READS meets `Uncovered` on
    the weightless engine and is redone on the meta load, which answers it."""
    spec = Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32")
    tried = []

    def compile_(eng):
        tried.append(type(eng).__name__)
        return eng.config.rms_norm_eps

    eng, value = loading.compiled(spec, compile_)
    assert tried == ["WeightlessEngine", "NNterpEngine"] and value == 1e-6 and isinstance(eng, NNterpEngine)


DRIVER = """
import sys
from causalab_ref import cli
status = cli.main(sys.argv[1:])
print(status, *(name for name in ("nnsight", "nnterp", "transformers") if name in sys.modules))
"""


@pytest.mark.parametrize("verb", ["validate", "explain"])
def test_validate_and_explain_import_no_nnsight_nnterp_or_transformers(verb):
    """SPEC.md:1948 [E9] SPEC.md:2005 [E17] — `validate` and `explain` of documents/patching.json, in a new process
    and once the fixture's tokenizer.json is cached, answer (status 0) without nnsight, nnterp or transformers
    ever being imported."""
    weightless.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"))  # the tokenizer cached
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", DRIVER, verb, "documents/patching.json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "0", proc.stdout[-2000:]
