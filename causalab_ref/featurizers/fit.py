"""Fit: the training loop of a `fit` step — minibatch order, anneal, AdamW, eval, early stopping
(SPEC.md §9, FZ12-FZ16).

The loop is independent of how a pass is run: `train` is handed, per planned update, a
callable that runs that minibatch's observe pass and returns its metric vectors (with
gradient), and one callable that runs the eval pass. It owns the order of updates
(`schedule`: one `random.Random(seed)` across epochs), the gate temperatures (`temperature`,
geometric per update), the loss (the objective's signed sum of term means, minimized), the
optimizer (AdamW over the trained featurizers' leaves, torch defaults otherwise), the eval
rows' metrics after every epoch and the early stop (strict comparison, the last weights kept).
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional

import torch


@dataclass(frozen=True)
class Settings:
    """What a fit step says besides its rows and intervention."""

    params: tuple[str, ...]
    objective: tuple[tuple[float, str], ...]
    epochs: int
    lr: float
    weight_decay: float = 0.0
    anneal: tuple[tuple[str, float, float], ...] = ()
    early_stop: str = ""
    mode: str = "max"
    patience: int = 1


def epochs_of(n: int, pairs: int, seed: int) -> Iterator[list[tuple[int, ...]]]:
    """Each epoch's updates as row indices, one epoch at a time and without end: a fresh permutation per
    epoch from one `random.Random(seed)`, split into minibatches of `pairs` (the last may be short). Every role is
    indexed by the same indices."""
    order = random.Random(seed)
    while True:
        perm = order.sample(range(n), n)
        yield [tuple(perm[i:i + pairs]) for i in range(0, n, pairs)]


def schedule(n: int, epochs: int, pairs: int, seed: int) -> list[list[tuple[int, ...]]]:
    """The first `epochs` epochs of `epochs_of`, as a list."""
    return list(itertools.islice(epochs_of(n, pairs, seed), epochs))


class Diverged(ArithmeticError):
    """An update left a trained featurizer's parameter with values that are not finite (run.py refuses the
    fit: nothing it trained is saved; SPEC.md S37)."""

    def __init__(self, name: str, epoch: int, update: int, bad: int, total: int):
        super().__init__(f"'{name}' at epochs[{epoch}][{update}]: {bad} of {total} values not finite")
        self.name, self.epoch, self.update, self.bad, self.total = name, epoch, update, bad, total


class Untrainable(ValueError):
    """An update's loss holds no gradient: no objective term depends on a featurizer the fit trains (its
    metrics read a model no write through them reaches). run.py refuses the fit (SPEC.md S79)."""

    def __init__(self, epoch: int, update: int):
        super().__init__(f"the loss at epochs[{epoch}][{update}] holds no gradient")
        self.epoch, self.update = epoch, update


def _update(optimizer, loss: torch.Tensor, epoch: int, update: int) -> None:
    """One optimizer step on the loss; a loss with no gradient is Untrainable (the model is frozen, so only
    the trained leaves can carry one)."""
    if not loss.requires_grad:
        raise Untrainable(epoch, update)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _check_finite(featurizers: dict, names, epoch: int, update: int) -> None:
    for name in names:
        for leaf in featurizers[name].params():
            bad = int((~torch.isfinite(leaf.detach())).sum())
            if bad:
                raise Diverged(name, epoch, update, bad, leaf.numel())


def temperature(start: float, end: float, done: int, total: int) -> float:
    """A gate's temperature at update `done` (0-based) of `total` planned: start·(end/start)^(done/(total−1))."""
    return start * (end / start) ** (done / max(total - 1, 1))


def mask_terms(gates: dict) -> dict[str, torch.Tensor]:
    """`<gate>.mask` for each trained gate: its mask over the d units (soft while training, hard after)."""
    return {f"{name}.mask": gate.mask() for name, gate in gates.items()}


def loss_of(objective, scored: dict[str, torch.Tensor]) -> torch.Tensor:
    """Σ weight · mean(term), in objective order."""
    total = None
    for weight, term in objective:
        part = weight * scored[term].mean()
        total = part if total is None else total + part
    assert total is not None, "an objective has at least one term (validated)"
    return total


def _improves(value: float, best: Optional[float], mode: str) -> bool:
    if best is None:
        return True
    if math.isnan(value):
        return False
    return value > best if mode == "max" else value < best


def _set_training(featurizers: dict, names, on: bool) -> None:
    for name in names:
        featurizers[name].training = on


def silent(epoch: int, loss: Optional[float]) -> None:
    """No progress shown: `train`'s report when nobody watches."""


def train(featurizers: dict, settings: Settings, updates: Iterable[list[Callable[[], dict]]],
          evaluate: Callable[[], dict], total: Optional[int] = None,
          report: Callable[[int, Optional[float]], None] = silent) -> dict[str, torch.Tensor]:
    """Run the fit: returns `train/loss` (float32, one entry per update run) and `train/eval` (float32,
    epochs run x (1 + trained gates): the watched metric's mean, then each gate's hard-mask mean).

    `updates` may be lazy (one epoch made when it is reached); `total`, the updates planned, is then given
    (the anneal's schedule needs it first). An update that leaves a parameter not finite raises Diverged;
    `report(epoch, loss)` (progress, 1-based) follows each update with its loss and each eval with None."""
    trained = [featurizers[name] for name in settings.params]
    leaves = [leaf for f in trained for leaf in f.params()]
    for leaf in leaves:
        leaf.requires_grad_(True)
    gates = {name: featurizers[name] for name in settings.params if featurizers[name].kind == "gate"}
    optimizer = torch.optim.AdamW(leaves, lr=settings.lr, weight_decay=settings.weight_decay)
    if total is None:
        updates = list(updates)
        total = sum(len(epoch) for epoch in updates)
    done, losses, evals, best, waited = 0, [], [], None, 0
    for e, epoch in enumerate(updates):
        _set_training(featurizers, settings.params, True)
        for u, update in enumerate(epoch):
            for name, start, end in settings.anneal:
                featurizers[name].temperature = temperature(start, end, done, total)
            done += 1
            scored = {**update(), **mask_terms(gates)}
            loss = loss_of(settings.objective, scored)
            _update(optimizer, loss, e, u)
            _check_finite(featurizers, settings.params, e, u)
            losses.append(loss.detach().float())
            report(e + 1, float(losses[-1]))
        _set_training(featurizers, settings.params, False)
        with torch.no_grad():
            scored = {**evaluate(), **mask_terms(gates)}
        names = (settings.early_stop, *mask_terms(gates))
        evals.append(torch.stack([scored[name].float().mean() for name in names]))
        report(e + 1, None)
        watched = float(scored[settings.early_stop].float().mean())
        if _improves(watched, best, settings.mode):
            best, waited = watched, 0
        else:
            waited += 1
            if waited >= settings.patience:
                break
    for leaf in leaves:
        leaf.requires_grad_(False)
    return {"train/loss": torch.stack(losses), "train/eval": torch.stack(evals)}
