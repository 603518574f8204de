"""Conformance (SPEC.md §6, §13): the corpus run against an implementation, and the refusal catalogue.

    conform.py    each case written, the implementation invoked, its answer compared
    catalogue.py  the refusal catalogue read from SPEC.md §13, and a refusal matched to its template

    from causalab_ref.conformance.conform import conform
"""
