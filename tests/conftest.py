"""Shared test fixtures: the Llama fixture engine, loaded once per test session."""
from __future__ import annotations

import pytest

from causalab_ref import engine
from causalab_ref.shapes import Model


@pytest.fixture(scope="session")
def llama():
    """The seeded Llama fixture with weights, at its default attention (the shipped documents' model block)."""
    return engine.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"), weights=True)
