"""Runs (SPEC.md §4): a document compiled into a plan and executed, and the folder it writes.

    data.py      the data tables a document's roles read
    compile.py   a document and a model's tokenizer and config made a plan (no weights)
    plan.py      the plan's dataclasses, and the structured plan `explain --json` prints
    memory.py    passes sized to the memory budget
    share.py     forwards shared between steps that read the same rows
    run.py       the plan executed: passes, decode, scoring, fits, files
    results.py   the results folder: claimed, staged, moved into place whole

    from causalab_ref.runs import compile, run
"""
