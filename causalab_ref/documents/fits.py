"""Fits: the fit and weights steps (SPEC.md §9), and the order a document's steps use featurizers in.

A fit trains declared featurizers (`params`) through one intervention: its objective's terms
are that intervention's metrics or the mask of a gate it trains, an anneal a temperature of
such a gate, its early stop a metric; it has an optimizer, epochs, pairs, an eval pass over
other rows and the curves it may save. A weights step publishes fitted featurizers' tensors.
`check_order` holds the whole document: no step uses a featurizer before the fit that trains it.

    from causalab_ref.documents import fits
    fit = fits.fit_step(raw["steps"]["train"], "steps.train", interventions, roles, declared)
    fits.check_order(steps, interventions, declared)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..featurizers import kinds as featurizer_table
from . import metrics as metric_kinds
from . import steps as step_parts
from .fields import FLOAT32_MAX, FLOAT32_TINY, choice, mapping, number, positive, strict_object, seed, string
from ..shapes import Fit, Refusal, Weights, nearest

FIT_KEYS = ("kind", "rows", "interventions", "intervention", "params", "objective", "anneal", "epochs", "pairs",
            "seed", "optimizer", "early_stop", "eval", "saves")
CURVES = ["train/eval", "train/loss"]
MAX_EPOCHS = 10_000  # a fit's epochs (and its patience), as a sweep's points are bounded (SPEC.md S49)
BETA1 = 0.9  # AdamW's first beta (torch's default): its first step is lr / (1 - BETA1)


def _fail(path: str, message: str):
    raise Refusal(message, path=path, stage="validation")


# ---------------------------------------------------------------- a fit's terms


@dataclass(frozen=True)
class Terms:
    """What a fit's loss and schedule name: the featurizers it trains, its objective's (weight, term)
    pairs, its anneals (gate, start, end) and its early stop (metric, mode, patience)."""

    params: tuple[str, ...]
    objective: tuple[tuple[float, str], ...]
    anneal: tuple[tuple[str, float, float], ...]
    early_stop: tuple[str, str, int]


def _optimizer(raw: Any, path: str) -> tuple[float, float]:
    """AdamW's lr and weight decay as torch takes them (SPEC.md S51): neither below 0, its first step
    lr / (1 - β1) and its decay factor 1 - lr·weight_decay within float32."""
    strict_object(raw, path, ("name", "lr", "weight_decay"), ("name", "lr"))
    choice(raw["name"], f"{path}.name", ("adamw",))
    lr, decay = number(raw["lr"], f"{path}.lr"), number(raw.get("weight_decay", 0.0), f"{path}.weight_decay")
    for key, value in (("lr", lr), ("weight_decay", decay)):
        if value < 0:
            _fail(f"{path}.{key}", f"optimizer {key} {value!r} is below 0; AdamW takes 0 or more")
    most = FLOAT32_MAX * (1 - BETA1)
    if lr > most:
        _fail(f"{path}.lr", f"optimizer lr {lr!r} is above {most:.6g}: AdamW's first step, lr / (1 - {BETA1}), "
                            "would be past float32's range")
    if lr * decay > FLOAT32_MAX:
        _fail(f"{path}.weight_decay", f"optimizer lr x weight_decay = {lr * decay:.6g} is past float32's range "
                                      f"({FLOAT32_MAX:.6g}); AdamW's decay factor 1 - lr·weight_decay would overflow")
    return lr, decay


def _early_stop(raw: Any, path: str) -> tuple[str, str, int]:
    strict_object(raw, path, ("metric", "mode", "patience"), ("metric", "patience"))
    return (string(raw["metric"], f"{path}.metric"), choice(raw.get("mode", "max"), f"{path}.mode", ("max", "min")),
            positive(raw["patience"], f"{path}.patience", "patience", MAX_EPOCHS))


def _objective(raw: Any, path: str) -> tuple[tuple[float, str], ...]:
    if not isinstance(raw, list) or not raw:
        _fail(path, "an objective is a non-empty list of [weight, term] pairs")
    out = []
    for k, pair in enumerate(raw):
        if not isinstance(pair, list) or len(pair) != 2:
            _fail(f"{path}.{k}", "an objective term is [weight, term]: a number and a metric or '<gate>.mask'")
        out.append((number(pair[0], f"{path}.{k}.0"), string(pair[1], f"{path}.{k}.1")))
    return tuple(out)


def _anneal(raw: Any, path: str) -> tuple[tuple[str, float, float], ...]:
    out = []
    for gate, value in mapping(raw, path).items():
        strict_object(value, f"{path}.{gate}", ("start", "end"), ("start", "end"))
        ends = [number(value[e], f"{path}.{gate}.{e}") for e in ("start", "end")]
        if min(ends) <= 0:
            _fail(f"{path}.{gate}", "an anneal's start and end are temperatures above 0")
        if min(ends) < FLOAT32_TINY:  # θ / T in float32: a temperature that rounds to 0 makes the mask NaN
            _fail(f"{path}.{gate}", f"an anneal's temperature {min(ends)!r} is below {FLOAT32_TINY:.6g}, the least "
                                    "a float32 holds at full precision; the gate's θ / T would not be a number")
        out.append((gate, ends[0], ends[1]))
    return tuple(out)


def _trained(params: Any, path: str, step: str, declared: dict) -> tuple[str, ...]:
    if not isinstance(params, list) or not params:
        _fail(path, "params lists the featurizers this fit trains")
    names = tuple(string(p, f"{path}.{k}") for k, p in enumerate(params))
    missing = sorted(set(names) - set(declared))
    if missing:
        _fail(path, f"step '{step}': trains {missing}, which is not a declared featurizer")
    for name in names:
        if not featurizer_table.KINDS[declared[name].kind].trainable:
            _fail(path, f"step '{step}': trains '{name}', a {declared[name].kind}, which is fixed by definition — "
                        "a pca basis can be fine-tuned as a subspace loaded from it")
    return names


def _check_terms(terms: Terms, metrics: list, declared: dict, step: str, path: str) -> None:
    """An anneal is a trained gate's; early stop watches a metric; an objective term is a metric or a trained
    gate's mask."""
    gates = sorted(p for p in terms.params if declared[p].kind == "gate")
    extra = sorted(g for g, _s, _e in terms.anneal if g not in gates)
    if extra:
        _fail(f"{path}.anneal", f"step '{step}': anneals {extra}; only a gate this fit trains has a temperature "
                                f"(those are {gates})")
    if terms.early_stop[0] not in metrics:
        _fail(f"{path}.early_stop.metric", f"step '{step}': early_stop watches '{terms.early_stop[0]}', not a metric"
                                           f"{nearest(terms.early_stop[0], metrics)}")
    allowed = sorted(metrics + [f"{g}.mask" for g in gates])
    for k, (_w, term) in enumerate(terms.objective):
        if term not in allowed:
            _fail(f"{path}.objective.{k}", f"step '{step}': objective names '{term}', which is neither a metric "
                                           f"nor the mask of a gate this fit trains (one of {allowed})"
                                           f"{nearest(term, allowed)}")


def _check_listed(terms: Terms, declared_metrics: tuple, step: str, path: str) -> None:
    """A metric whose value is a list per row (top_k) is no loss and nothing to watch (SPEC.md D27)."""
    listed = {m for m, metric in declared_metrics if metric.kind in metric_kinds.LISTED}
    if terms.early_stop[0] in listed:
        _fail(f"{path}.early_stop.metric", f"step '{step}': early_stop watches '{terms.early_stop[0]}', a metric "
                                           "whose value is a list per row; a list cannot be watched: watch a metric "
                                           "of one number per row")
    for k, (_w, term) in enumerate(terms.objective):
        if term in listed:
            _fail(f"{path}.objective.{k}", f"step '{step}': objective names '{term}', a metric whose value is a list "
                                           "per row; a list cannot be minimized: name a metric of one number per row")


# ---------------------------------------------------------------- fit and weights steps


def fit_step(raw: dict, path: str, interventions: dict, roles: tuple, declared: dict) -> Fit:
    """A fit step (SPEC.md FZ20)."""
    strict_object(raw, path, FIT_KEYS, ("kind", "rows", "params", "objective", "epochs", "pairs", "optimizer",
                                        "early_stop", "eval"))
    step = path.split(".", 1)[1]
    rows = step_parts.rows(raw["rows"], f"{path}.rows", f"step '{step}'", roles)
    names = step_parts.named(raw, path, step, interventions)
    if len(names) != 1:
        _fail(f"{path}.interventions", f"step '{step}': a fit trains through one intervention, not {list(names)}")
    params = _trained(raw["params"], f"{path}.params", step, declared)
    objective, anneal = _objective(raw["objective"], f"{path}.objective"), _anneal(raw.get("anneal", {}),
                                                                                   f"{path}.anneal")
    lr, decay = _optimizer(raw["optimizer"], f"{path}.optimizer")
    terms = Terms(params=params, objective=objective, anneal=anneal,
                  early_stop=_early_stop(raw["early_stop"], f"{path}.early_stop"))
    metrics = sorted(m for m, _ in interventions[names[0]].metrics)
    _check_terms(terms, metrics, declared, step, path)
    _check_listed(terms, interventions[names[0]].metrics, step, path)
    ev = strict_object(raw["eval"], f"{path}.eval", ("rows", "saves"), ("rows",))
    eval_rows = step_parts.rows(ev["rows"], f"{path}.eval.rows", f"step '{step}'.eval", roles)
    eval_saves = step_parts.saves(ev.get("saves", []), f"{path}.eval.saves", f"step '{step}'.eval", metrics,
                                  what="that pass")
    saves = step_parts.saves(raw.get("saves", []), f"{path}.saves", f"step '{step}'", CURVES, tensors=tuple(CURVES))
    return Fit(rows=rows, interventions=names, params=terms.params, objective=terms.objective,
               epochs=positive(raw["epochs"], f"{path}.epochs", "epochs", MAX_EPOCHS),
               pairs=positive(raw["pairs"], f"{path}.pairs", "pairs"), lr=lr, early_stop=terms.early_stop,
               eval_rows=eval_rows, eval_saves=eval_saves, saves=saves, anneal=terms.anneal,
               seed=seed(raw.get("seed", 0), f"{path}.seed"), weight_decay=decay)


def weights_step(raw: dict, path: str, declared: dict) -> Weights:
    """A weights step: publish featurizers' tensors; each save a stamped .safetensors bundle."""
    strict_object(raw, path, ("kind", "names", "saves"), ("kind", "names"))
    step = path.split(".", 1)[1]
    if not isinstance(raw["names"], list) or not raw["names"]:
        _fail(f"{path}.names", "names lists the featurizers this step publishes")
    names = tuple(string(n, f"{path}.names.{k}") for k, n in enumerate(raw["names"]))
    missing = sorted(set(names) - set(declared))
    if missing:
        _fail(f"{path}.names", f"step '{step}': names {missing}, which is not a declared featurizer")
    for name in names:
        kind = declared[name].kind
        if not featurizer_table.KINDS[kind].publishable:
            _fail(f"{path}.names", f"step '{step}': '{name}' is a loaded {kind}; its tensors are the file it came "
                                   "from, and there is no fitted weight to publish")
    saves = step_parts.saves(raw.get("saves", []), f"{path}.saves", f"step '{step}'", sorted(names), tensors=names)
    return Weights(names=names, saves=saves)


# ---------------------------------------------------------------- the order of the steps


def uses(step, interventions: dict) -> set[str]:
    """The featurizers a step uses: those its intervention's reads and writes name, or a weights step's names."""
    if step.kind == "weights":
        return set(step.names)
    out = set()
    for name in step.interventions:
        intervention = interventions[name]
        out |= {op.featurizer for _n, op in intervention.reads + intervention.writes}
    return out - {"identity"}


def check_order(steps, interventions: dict, declared: dict) -> None:
    """No step uses a featurizer before the fit that trains it (SPEC.md FZ21)."""
    for i, (name, step) in enumerate(steps):
        for used in sorted(uses(step, interventions)):
            later = next((n for n, s in steps[i + 1:] if s.kind == "fit" and used in s.params), None)
            if later is not None:
                _fail(f"steps.{name}", f"step '{name}' uses featurizer '{used}' before step '{later}' trains it, "
                                       "so it would run on the untrained parameter. Move it after the fit — or, for "
                                       "a deliberate untrained baseline, declare a second featurizer that no fit names")
