"""Loading: a document's model block made an engine, whichever engine is asked for.

`load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"))` builds or reuses the seeded
fixture (a `fixture:` key), or loads a local checkpoint folder or a hub key and revision (checkpoint.py),
and wraps it in the nnterp engine (nnterp.py) or, with `kind="hooks"`, the torch-hooks engine (hooks.py).
It stands apart from both engines so that neither imports the other. `compiled` is the one compile of a
document with no weights: on the weightless engine (weightless.py) where it answers, else on a meta load
(SPEC.md §12, E9).
"""
from __future__ import annotations

from typing import Any, Callable

from ..locations.families import Uncovered
from ..shapes import Model, Refusal
from . import checkpoint, contract
from .contract import Engine


ENGINES = ("nnterp", "hooks", "ndif")  # what --engine names; ndif is known and refused (refuse_remote)


def refuse_remote(kind: str) -> None:
    """`--engine ndif` names remote execution on an NDIF server, which this stack cannot reach: refused by name,
    before any config or weights are read (SPEC.md E12). A remote engine is one module implementing the
    contract (E13); none is faked here."""
    if kind != "ndif":
        return
    import platform
    from importlib import metadata
    try:
        nnsight = metadata.version("nnsight")
    except metadata.PackageNotFoundError:
        nnsight = "not installed"
    raise Refusal(f"engine 'ndif' runs a document on a remote NDIF server, and this installation cannot reach "
                  f"one: NDIF's server stack needs nnsight >= 0.8 and Python >= 3.12 (a GPU on the server), and "
                  f"nnterp 1.3.0, whose names the nnterp engine uses, does not import under nnsight 0.8 "
                  f"(here: nnsight {nnsight}, Python {platform.python_version()}); run the same document here "
                  "with --engine nnterp or --engine hooks", path="--engine", stage="compile")


def compiled(spec: Model, compile: Callable[[Engine], Any], kind: str = "nnterp", weights: bool = False,
             device_map: str = "cpu") -> tuple[Engine, Any]:
    """(engine, compile(engine)) for a document's model block. With no weights on the nnterp engine, compile
    runs on the weightless engine, and again on a meta load when that engine cannot answer exactly: no row
    for the checkpoint (`weightless.load` is None) or a config question it was not built for (`Uncovered`)."""
    refuse_remote(kind)
    if kind == "nnterp" and not weights:
        from . import weightless

        view = weightless.load(spec, contract.device_map(device_map))
        if view is not None:
            try:
                return view, compile(view)
            except Uncovered:
                pass
    eng = load(spec, kind=kind, weights=weights, device_map=device_map)
    return eng, compile(eng)


def load(spec: Model, kind: str = "nnterp", weights: bool = True, extra=None, device_map: str = "cpu") -> Engine:
    """The engine for a document's model block.

    `extra` is the load-time extension point: {name: (module path relative to the layer, order)}
    adds places the component table does not have (Python only; SPEC.md §3 Locations, L23); `device_map`
    is `--device-map` (cpu, cuda, cuda:N, auto; SPEC.md R21), refused here when unknown or unavailable.
    """
    refuse_remote(kind)
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
