"""Conformance (SPEC.md §6, §13): the corpus run against an implementation, and the refusal catalogue.

    conform.py    each case read and written, the implementation invoked, its answer judged; the verb
    invoke.py     calling the implementation: in-process, or a subprocess bounded in time and output
    judge.py      an answer against a case's expectation (tolerance, exact fields, refusal templates)
    catalogue.py  the refusal catalogue read from SPEC.md §13, its path forms, a refusal matched to its line

    from causalab_ref import cli
    from causalab_ref.conformance import conform
    result = conform.conform(options=conform.Options(only="run_patching"), main=cli.main)  # in-process
    result["ok"], result["passed"]                                                           # True, 1
"""
