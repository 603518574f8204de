"""Loading: a document's model block made an engine, whichever engine is asked for.

`load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"))` builds or reuses the seeded
fixture (a `fixture:` key), or loads a local checkpoint folder or a hub key and revision (checkpoint.py),
and wraps it in the nnterp engine (nnterp.py) or, with `kind="hooks"`, the torch-hooks engine (hooks.py).
It stands apart from both engines so that neither imports the other. SPEC.md §12.
"""
from __future__ import annotations

from ..shapes import Model, Refusal
from . import checkpoint, contract
from .contract import Engine


def load(spec: Model, kind: str = "nnterp", weights: bool = True, extra=None, device_map: str = "cpu") -> Engine:
    """The engine for a document's model block.

    `extra` is the load-time extension point: {name: (module path relative to the layer, order)}
    adds places the component table does not have (Python only; SPEC.md §3 Locations, L23); `device_map`
    is `--device-map` (cpu, cuda, cuda:N, auto; SPEC.md R21), refused here when unknown or unavailable.
    """
    device_map = contract.device_map(device_map)
    if kind == "hooks":
        from .hooks import HooksEngine  # imported only when asked for

        return HooksEngine.load(spec, weights=weights, device_map=device_map)
    if kind != "nnterp":
        raise Refusal(f"engine '{kind}' is not implemented yet; use --engine nnterp", path="--engine",
                      stage="compile")
    from .nnterp import NNterpEngine

    model, _none, recipe = checkpoint.load(spec, weights=weights, device_map=device_map)
    return NNterpEngine(spec, model, recipe, extra=extra, device_map=device_map)
