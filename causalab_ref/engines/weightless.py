"""Weightless: the engine compile gets from a checkpoint's config.json and tokenizer alone (SPEC.md E9).

`load(spec, device_map)` answers compile's questions (`tokenizer`, `config`, `num_layers`, `locate`,
`width`, `attention`: contract.py) without a meta load, so `validate` and `explain` import neither nnsight,
nnterp nor transformers' modeling code: the tokenizer is loaded as nnsight loads it, and the module tree is
locations/families.py's row for the config's family (`families.skeleton`). It answers only for a checkpoint
whose config.json is one of the fixture recipes' (recipes.py), where every answer is checked against a meta
load (tests/engines/test_weightless.py); for any other config transformers' config class decides the defaults
and which configs load at all, and `load` returns None: the caller makes the meta load (loading.py).
The engine runs nothing: `run` always loads weights.
"""
from __future__ import annotations

import types
from pathlib import Path
from typing import ContextManager, Optional

import torch

from ..fixtures import builder, recipes
from ..locations import families
from ..shapes import Address, Batch, Model, read_json
from . import checkpoint, tokenjson
from .contract import Engine


RUNS_NOTHING = "the weightless engine compiles and runs nothing; a run loads the checkpoint (loading.load)"


class WeightlessEngine(Engine):
    """Compile's engine: the tokenizer, the config view and the module tree as data (`families.Skeleton`).
    It stands in for the nnterp engine's meta load, so it has that engine's name."""

    name = "nnterp"
    record_name = "NNterpEngine"

    def __init__(self, spec: Model, tokenizer, tree: families.Skeleton, recipe: dict, device_map: str = "cpu"):
        super().__init__(spec, tokenizer, recipe, device_map=device_map)
        self.standard = tree

    def detail(self, a: Address) -> dict:
        return {}

    # -------------------------------------------------------------- it runs nothing: a run loads weights

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        raise NotImplementedError(RUNS_NOTHING)

    def generate(self, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        raise NotImplementedError(RUNS_NOTHING)

    def frozen(self) -> ContextManager[None]:
        raise NotImplementedError(RUNS_NOTHING)

    def final_modules(self):
        raise NotImplementedError(RUNS_NOTHING)

    def head_weight(self):
        return None  # no weights

    def input_device(self):
        raise NotImplementedError(RUNS_NOTHING)

    def generation_config(self):
        return None


def tokenizer(path: str, raw: dict):
    """The checkpoint's tokenizer as nnsight's LanguageModel loads it (AutoTokenizer with the model's config,
    left padding), given the three config attributes AutoTokenizer reads (model_type, tokenizer_class,
    model_name) and the name it was loaded by; nnsight's missing-pad fix-up is the contract's (`with_pad`)."""
    from transformers import AutoTokenizer

    config = types.SimpleNamespace(_name_or_path=path, **{key: raw[key] for key in (
        "model_type", "tokenizer_class", "model_name") if key in raw})
    return AutoTokenizer.from_pretrained(path, config=config, revision=None, padding_side="left")


def loaded(path: str, raw: dict):
    """`tokenizer`, with transformers' loading chatter off (checkpoint.quiet_transformers)."""
    checkpoint.quiet_transformers()
    return tokenizer(path, raw)


def fixture_tokenizer(key: str, path: str, raw: dict, digest: Optional[str] = None):
    """A fixture's tokenizer served from its cached tokenizer.json (tokenjson.py, SPEC.md E14): the AutoTokenizer
    is loaded only to derive the cached files, or to render a chat template. `digest` is the key's recipe digest
    where the caller has it (checkpoint.find's), so its files are not hashed again."""
    digest = builder.recipe_digest(key) if digest is None else digest
    return tokenjson.cached(Path(path), digest, lambda: loaded(path, raw), builder.tokenizer_sources(key))


def load(spec: Model, device_map: str = "cpu") -> Optional[WeightlessEngine]:
    """The weightless engine of a model block, or None where only a meta load answers exactly: a config that
    is not a recipe's, a family or attention implementation families.py has no row for, or a tokenizer that
    does not load (the meta load then refuses as it always has)."""
    path, recipe = checkpoint.find(spec, weights=False)
    checkpoint.own_code(path, spec)
    raw = read_json(Path(path) / "config.json")  # None: the meta load meets it and refuses it as it always has
    tree = families.skeleton(raw, spec.attn_implementation) if recipes.vouched(raw) else None
    if tree is None:
        return None
    try:
        tok = (fixture_tokenizer(spec.key, path, raw, recipe["fixture_recipe"]) if builder.is_fixture(spec.key)
               else loaded(path, raw))
    except Exception:  # noqa: BLE001 -- whatever it is, the meta load meets it and says it as it always has
        return None
    return WeightlessEngine(spec, tok, tree, recipe, device_map=device_map)
