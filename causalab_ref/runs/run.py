"""Run: walk a compiled plan on an engine, leaf by leaf and step by step, and hand the files to the folder.

Each leaf (a sweep point, or the document itself) builds its featurizers and walks its steps in order:
an observe step runs its passes (passes.py) and its outputs join what the leaf's later steps may read;
a fit trains the featurizers (featurizers/fit.py), each update and eval pass an observe step with its
own rows; a weights step writes the featurizers' tensors. Each save becomes a file's content (a metric
table, or tensors and metadata) that results.py's folder stages, confines and moves into place whole;
run.json records the run. SPEC.md §4 Runs, §9 Featurizers:

    plan = compile.compile_document(raw, engine, data_root)
    written = execute(plan, engine, Path("out"), batch_size=8)    # the files' names, in write order
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from ..documents import steps as document_steps
from ..featurizers import bundles, kinds, fit
from . import results, scoring, share
from .passes import RunContext, StepResult, run_step
from .plan import ObservePlan, Plan
from ..shapes import Refusal


@dataclass(frozen=True)
class Walk:
    """What every step of one run shares: the engine, the rows per pass, the memo of shared forwards."""

    engine: Any
    rows_per_pass: Optional[int] = None
    memo: Optional[share.Memo] = None


@dataclass(frozen=True)
class Fitted:
    """What a fit step produced: its curves (`train/loss`, `train/eval`: float32) and its last eval pass."""

    curves: dict[str, torch.Tensor]
    evaluation: StepResult


def metric_vectors(step: ObservePlan, result: StepResult) -> dict[str, torch.Tensor]:
    """Each metric over its eligible rows as one float32 vector, keeping the graph (a fit's loss terms)."""
    return {metric.name: scoring.vector(metric, result.values, result.placed, result.eligible[metric.name])
            for metric in step.metrics}


# ---------------------------------------------------------------- fit and weights steps (SPEC.md §9)


def fit_step(engine, step, featurizers: dict, rows_per_pass: Optional[int] = None, report=None) -> Fitted:
    """A fit: every update an observe pass with gradient, the eval pass after each epoch (fit.train).
    Returns the curves and the last eval pass's results; `report(epoch, loss)` is called after each update
    (its loss) and each eval (None)."""
    metric, mode, patience = step.early_stop
    settings = fit.Settings(params=step.params, objective=step.objective, epochs=step.epochs, lr=step.lr,
                            weight_decay=step.weight_decay, anneal=step.anneal, early_stop=metric, mode=mode,
                            patience=patience)
    last: dict[str, StepResult] = {}

    def update(plan):
        return lambda: metric_vectors(plan, run_step(engine, plan, rows_per_pass,
                                                     context=RunContext(featurizers=featurizers, grad=True)))

    def evaluate():
        last["results"] = run_step(engine, step.evaluation, rows_per_pass, context=RunContext(featurizers=featurizers))
        return metric_vectors(step.evaluation, last["results"])
    epochs = ([update(p) for p in epoch] for epoch in step.updates())  # each planned when it is reached
    try:
        with engine.frozen():  # the model is not trained: only the featurizers' leaves get a gradient (E8)
            curves = fit.train(featurizers, settings, epochs, evaluate, total=step.epochs * len(step.first),
                               report=report or fit.silent)
    except fit.Diverged as bad:  # nothing this fit trained is saved (SPEC.md S37)
        raise Refusal(f"step '{step.name}': update epochs[{bad.epoch}][{bad.update}] left {bad.bad} of {bad.total} "
                      f"values of '{bad.name}' not finite (NaN or infinite), so the fit is refused and nothing it "
                      "trained is saved; lower the lr or the objective's weights", path=f"steps.{step.name}",
                      stage="run") from None
    except fit.Untrainable as bad:  # nothing would be trained: refused before any update (SPEC.md S79)
        raise Refusal(f"step '{step.name}': its objective does not depend on the featurizers it trains "
                      f"({', '.join(step.params)}): at update epochs[{bad.epoch}][{bad.update}] no term's metric "
                      "reads a value a write or read through them reaches, so the fit is refused and nothing is "
                      "saved; score the objective's metrics on the intervened model whose writes go through "
                      "them", path=f"steps.{step.name}.objective", stage="run") from None
    return Fitted(curves=curves, evaluation=last["results"])


def _leaf_step(walk: Walk, leaf: Plan, step, context: RunContext, report=None) -> list[tuple[str, Any]]:
    """Run one step of a leaf; returns its files in write order as (file_path, content): a metric table
    (a list), or (tensors, metadata) for a .safetensors file. An observe step's outputs join
    `context.published`, the leaf's."""
    featurizers = context.featurizers
    if step.kind == "weights":
        stamps = {f.name: dict(f.stamp) for f in leaf.featurizers}
        return [(path, ({"weight": featurizers[name].tensors()["weight"]}, stamps[name])) for name, path in step.saves]
    if step.kind == "fit":
        fitted = fit_step(walk.engine, step, featurizers, walk.rows_per_pass, report)
        files: list[tuple[str, Any]] = [(path, ({"weight": fitted.curves[name]}, {})) for name, path in step.saves]
        return files + [(path, metric_table(step.evaluation, fitted.evaluation, name, leaf.digest))
                        for name, path in step.evaluation.saves]
    result = run_step(walk.engine, step, walk.rows_per_pass, walk.memo, score_as_you_go=True, context=context)
    if step.publishes:
        context.published.update(result.outputs)
    return [(path, _saved(step, result, name, leaf.digest)) for name, path in step.saves]


def metric_table(step: ObservePlan, result: StepResult, name: str, digest: str) -> list[dict]:
    """The saved table: every row of the step's base data, excluded rows included, in row order."""
    metric = next(m for m in step.metrics if m.name == name)
    positions = result.positions.get(metric.of, {})  # a pass of bare integers has no positions (P32-P33)
    rows = []
    for r, example_id in enumerate(step.example_ids):
        value = result.scores[name][r]
        lost = result.eligible[name][r] and value is None  # scored, and not finite (scoring.py; SPEC.md S52)
        rows.append({
            "example_id": example_id,
            "metric": name,
            **({} if metric.layer is None else {"layer": metric.layer}),  # a read at every layer (SPEC.md D34)
            "value": value,
            "eligible": result.eligible[name][r] and not lost,
            "positions": list(positions["rows"][r]) if step.dynamic else None,
            "reason": scoring.NON_FINITE if lost else positions["reason"][r] if step.dynamic else "",
            "tokens": positions["tokens"][r] if step.dynamic else "",
            "unit": metric.unit,
            "estimand_version": metric.estimand_version,
            "produced_by": digest,
        })
    return rows


@dataclass(frozen=True)
class RunPoint:
    """A leaf of the run: its label (its folder's name; "" unswept), its coordinates (each axis's name ->
    its value as JSON, as the label shows it) and its folder relative to the results folder ("." unswept)."""

    label: str
    coordinates: dict
    folder: str

    def as_json(self) -> dict:
        return {"label": self.label, "coordinates": self.coordinates, "folder": self.folder}


@dataclass(frozen=True)
class Computed:
    """A run held in memory: each file the folder would hold, in write order, as (relative path, content,
    the document path a write refusal names) with content a JSON value (a metric table is a list of rows) or
    (tensors, metadata) for a .safetensors file; the points; and run.json's record (written second)."""

    files: tuple
    points: tuple[RunPoint, ...]
    record: dict


def _add(files: list, relative: str, content: Any, path: str) -> None:
    """Append a file to the run's files; a metric table whose rows carry a `layer` (a read at every layer,
    SPEC.md D34) joins the table already at its path, its layers' rows in the order computed."""
    layered = type(content) is list and content and isinstance(content[0], dict) and "layer" in content[0]
    at = next((k for k, (other, _, _) in enumerate(files) if other == relative), None) if layered else None
    if at is None:
        files.append((relative, content, path))
    else:
        files[at] = (relative, files[at][1] + content, path)


def leaf_points(plan: Plan) -> tuple[RunPoint, ...]:
    """The plan's leaves as points: label, coordinates (the plan's, compile.compile_document) and folder."""
    return tuple(RunPoint(leaf.label, plan.coordinates.get(leaf.label, {}), leaf.label or ".")
                 for leaf in plan.leaves())


def compute(plan: Plan, engine, batch_size: Optional[int] = None, progress=True) -> Computed:
    """Run every leaf of the plan, writing nothing; `progress`: True a bar when stderr is a terminal, "always"
    a bar, False none (results.progress; SPEC.md R16, PY11)."""
    started = time.perf_counter()
    rows_per_pass = batch_size or plan.rows_per_pass or None  # --batch-size wins (SPEC.md Q11)
    leaves = plan.leaves()
    points = leaf_points(plan)
    passes = sum(-(-len(step.example_ids) // (rows_per_pass or len(step.example_ids) or 1))
                 for leaf in leaves for step in leaf.steps if isinstance(step, ObservePlan))
    passes += sum(step.epochs * (len(step.first) + 1) for leaf in leaves for step in leaf.steps
                  if step.kind == "fit")  # an update or an eval is one tick (fit_step's report)
    bar = results.progress(passes, progress, "run")
    walk = Walk(engine, rows_per_pass, share.Memo(plan))
    files: list[tuple[str, Any, str]] = [("document.json", plan.document_json, "")]
    try:
        for n, leaf in enumerate(leaves):
            if leaf.label:
                files.append((_within(leaf.label, "document.json"), leaf.document_json, ""))
            postfix = f"point {n + 1}/{len(leaves)} {leaf.label}" if leaf.label else ""
            if bar is not None:
                bar.set_postfix_str(postfix, refresh=False)
            # Each sweep point has its own featurizers and its own published outputs (SPEC.md M13).
            context = RunContext(featurizers=kinds.build(leaf.featurizers), published={}, bar=bar)
            for step in leaf.steps:
                report = _fit_report(bar, postfix, step) if step.kind == "fit" else None
                for file_path, content in _leaf_step(walk, leaf, step, context, report):
                    _add(files, _within(leaf.label, file_path), content, f"steps.{step.name}.saves")
        record = engine.run_record(batch_size) | {"rows_per_pass": rows_per_pass,
                                                  "causalab_ref": results.package_digest(),
                                                  "versions": results.versions()}
        record["dtype"] = record.get("served_dtype") or record.get("model", {}).get("dtype")
        record["points"] = [p.as_json() for p in points]
        record["wall_seconds"] = round(time.perf_counter() - started, 3)
    finally:
        if bar is not None:
            bar.close()
    return Computed(files=tuple(files), points=points, record=record)


def _fit_report(bar, postfix: str, step):
    """A fit's progress (SPEC.md PY11): each update and eval a tick, the epoch and its last loss in the bar."""
    if bar is None:
        return None

    last: list[float] = []

    def report(epoch: int, loss: Optional[float]) -> None:
        bar.update(1)
        if loss is not None:
            last[:] = [loss]
        shown = f" loss {last[0]:.4g}" if last else ""
        bar.set_postfix_str(f"{postfix} fit '{step.name}' epoch {epoch}/{step.epochs}{shown}".strip())
    return report


def confine_all(folder: results.Folder, plan: Plan) -> None:
    """Every destination is checked before any forward runs (SPEC.md R12)."""
    for leaf in plan.leaves():
        if leaf.label:
            folder.confine(leaf.label, f"sweep point '{leaf.label}'")
        for step in leaf.steps:
            for k, (_value, file_path) in enumerate(document_steps.all_saves(step)):
                folder.confine(_within(leaf.label, file_path), f"steps.{step.name}.saves.{k}.file_path")


def write_into(folder: results.Folder, computed: Computed) -> list[str]:
    """Hand a computed run's files to the claimed folder (run.json second) and move it into place."""
    for file_path, content, path in computed.files:
        if isinstance(content, tuple):
            folder.write_bytes(file_path, bundles.encode(*content), path=path)
        else:
            folder.write(file_path, content, path=path)
    folder.write("run.json", computed.record, at=1)
    return folder.commit()


def write(computed: Computed, out: Path, replace: bool = False) -> list[str]:
    """The folder `run` writes, from results in memory: claimed, staged, moved into place whole
    (results.Folder; SPEC.md S1-S7). The written paths, in write order."""
    with results.Folder(out, replace) as folder:
        for point in computed.points:
            if point.label:
                folder.confine(point.label, f"sweep point '{point.label}'")
        return write_into(folder, computed)


def into_folder(out: Path, replace: bool, plan: Plan, make: Callable[[], Computed]) -> list[str]:
    """Claim `out` (results.Folder), check every destination before any forward runs (SPEC.md R12), make the
    results (`compute`) and write them into it; the written paths, in write order."""
    with results.Folder(out, replace) as folder:
        confine_all(folder, plan)
        return write_into(folder, make())


def execute(plan: Plan, engine, out: Path, batch_size: Optional[int] = None, replace: bool = False,
            progress: bool = True) -> list[str]:
    """Run every leaf of the plan into the results folder `out` (`into_folder`); `progress` False is --quiet."""
    return into_folder(Path(out), replace, plan, lambda: compute(plan, engine, batch_size, progress))


def _saved(step: ObservePlan, result: StepResult, value: str, digest: str):
    """One save's content: a metric's table, or (tensors, metadata) for an output or `<model>.generated`
    (one tensor `weight`; an output stamped, generated ids not; SPEC.md M20)."""
    if any(m.name == value for m in step.metrics):
        return metric_table(step, result, value, digest)
    if value in result.outputs:
        return {"weight": result.outputs[value].value}, dict(dict(step.stamps)[value])
    return {"weight": result.values[value]}, {}


def _within(label: str, file_path: str) -> str:
    """A file's name inside the results folder: under its sweep point's folder, if it has one."""
    return f"{label}/{file_path}" if label else file_path
