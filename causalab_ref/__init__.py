"""causalab_ref: the reference implementation of a declarative language for causal interventions.

A JSON document names places in a model, positions in each row's tokens, reads,
writes and metrics; `explain` compiles it against a weightless model, `run` executes
it on nnsight through nnterp's standardized names. SPEC.md states the semantics, and
each of its section headers names the modules that implement that section; README's
"How it is built" follows a document through the modules in the order the data flows.
"""
__version__ = "0.1.0"
