"""Runs (SPEC.md §4): a document compiled into a plan and executed, and the folder it writes.

    data.py       the data tables a document's roles read
    compile.py    a document and a model's tokenizer and config made a plan (no weights)
    order.py      a step's forwards in dependency order
    layers.py     a read at every layer: its layer points folded into one plan
    plan.py       the plan's dataclasses, and the structured plan `explain --json` prints
    memory.py     passes sized to the memory budget
    share.py      forwards shared between steps that read the same rows
    placement.py  a pass's state, where its taps act on its rows, and what its writes land
    decode.py     a forward that generates: taps on the continuation, stacked reads cut afterwards
    scoring.py    each metric over the rows both halves admit
    passes.py     one observe step, chunk by chunk, and its result (StepResult)
    run.py        the plan walked: each leaf's observe, fit and weights steps, and their files
    results.py    the results folder: claimed, staged, moved into place whole

    from causalab_ref.runs import compile, run
    plan = compile.compile_document(raw, engine, data_root)
    run.execute(plan, engine, Path("out"))
"""
