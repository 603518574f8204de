"""causalab_ref: the reference implementation of a declarative language for causal interventions.

A JSON document names places in a model, positions in each row's tokens, reads, writes and metrics;
`explain` compiles it against a weightless model, `run` executes it on nnsight through nnterp's
standardized names. SPEC.md states the semantics (§16 this API), and each of its section headers names
the modules that implement that section; README's "How it is built" follows a document through the
modules in the order the data flows. From Python (api.py; torch is imported only by `load` and `run`):

    import causalab_ref as cr
    model = cr.load("fixture:weekday-llama", revision="trained")     # loaded once, for every document
    results = cr.run(cr.read("documents/weekday_tracing.json"), model)    # in memory; nothing written
    rows = results.table("iia")           # tidy records: point, layer, position, file, then each row's fields
    results.save("out/tracing")          # the folder `run --out out/tracing` writes, byte for byte
"""
__version__ = "0.1.0"
__all__ = ["Document", "Plan", "Refusal", "Results", "compile", "load", "read", "run"]

from .shapes import Refusal

_API = {"Document", "Plan", "Results", "compile", "load", "read", "run"}


def __getattr__(name: str):
    """The API's names, from api.py when first asked for (`import causalab_ref` stays light)."""
    if name in _API:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'causalab_ref' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
