"""Shared test fixtures: the Llama fixture engine, loaded once per test session."""
from __future__ import annotations

import pytest

from causalab_ref.engines import loading
from causalab_ref.engines.contract import Engine
from causalab_ref.shapes import Model


@pytest.fixture(scope="session")
def llama():
    """The seeded Llama fixture with weights, at its default attention (the shipped documents' model block)."""
    return loading.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"), weights=True)


class Delegate(Engine):
    """An engine that offers compile and run nothing but the contract, every answer delegated to `inner`
    (tests override a method to change one answer)."""

    name = "delegate"
    record_name = "Delegate"

    def __init__(self, inner):
        super().__init__(inner.spec, inner.tokenizer, inner.recipe)
        self.inner = inner

    config = property(lambda self: self.inner.config)
    num_layers = property(lambda self: self.inner.num_layers)
    vocab_size = property(lambda self: self.inner.vocab_size)

    def attention(self):
        return self.inner.attention()

    def locate(self, component, layer, site="target"):
        return self.inner.locate(component, layer, site=site)

    def forward(self, batch):
        return self.inner.forward(batch)

    def generate(self, batch):
        return self.inner.generate(batch)

    def final_modules(self):
        return self.inner.final_modules()

    def head_weight(self):
        return self.inner.head_weight()

    def generation_config(self):
        return self.inner.generation_config()

    def input_device(self):
        return self.inner.input_device()

    def detail(self, a):
        return self.inner.detail(a)

    def frozen(self):
        return self.inner.frozen()
