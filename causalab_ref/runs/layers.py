"""Layers "all": the compiled layer points of a document read at every layer, folded into the plan it writes.

`validate.points_of` gives one point per layer of each point of the document's other sweeps; compile
compiles each (one shared forward, Q32) and `fold` makes each point of the other sweeps one leaf whose steps
are its layers' steps, layer by layer, each step and each metric of a read at an "all" site carrying its
layer, so the run writes one table per metric with a row per (layer, example). SPEC.md §1 (D34):

    plan = fold(raw, digest, [(point, compile_point(point, engine, data_root)) for point in points])
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from .plan import Plan


def fold(raw: Any, digest: str, compiled: list) -> Plan:
    """(point, its compiled leaf) of every layer point, in order -> the plan: one leaf per point of the other
    sweeps under a root (the document `raw`, its `digest`), or that one leaf itself when there are none; a
    leaf's produced_by is its point's with "all" as written (D19); a metric of a read at no "all" site is
    saved once, from layer 0."""
    names = set(compiled[0][0].every_layer)
    folds: dict[str, list] = {}
    for point, leaf in compiled:
        folds.setdefault(point.fold_label, []).append((point, leaf))
    leaves = []
    for label, members in folds.items():
        steps: list = []
        for point, leaf in members:
            for step in leaf.steps:
                reads = dict(dict(point.document.interventions)[step.intervention].reads)
                layered = {m.name for m in step.metrics if any(reads[r].site in names for r in m.reads)}
                parts = tuple(replace(m, layer=point.layer) if m.name in layered else m for m in step.metrics)
                steps.append(replace(step, layer=point.layer, metrics=parts,
                                     saves=tuple((v, f) for v, f in step.saves if point.layer == 0 or v in layered)))
        first = members[0][0]
        leaves.append(Plan(label=label, digest=first.fold_digest, document_json=first.fold_raw, steps=tuple(steps),
                           rows_per_pass=min((leaf.rows_per_pass for _, leaf in members if leaf.rows_per_pass),
                                             default=0),
                           frames=members[0][1].frames))
    if len(leaves) == 1 and leaves[0].label == "":
        return leaves[0]
    rows_per_pass = min((leaf.rows_per_pass for leaf in leaves if leaf.rows_per_pass), default=0)
    return Plan(label="", digest=digest, document_json=raw, points=tuple(leaves), rows_per_pass=rows_per_pass)
