"""causalab_ref: the reference implementation of a declarative language for causal interventions.

A JSON document names places in a model, positions in each row's tokens, reads,
writes and metrics; `explain` compiles it against a weightless model, `run` executes
it on nnsight through nnterp's standardized names. SPEC.md states the semantics;
each module owns one of its sections.
"""
__version__ = "0.1.0"
