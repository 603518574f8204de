"""The fit loop of fit.py on toy passes (no model): order, anneal, loss, optimizer, early stop (SPEC.md §9)."""
from __future__ import annotations

import random

import pytest
import torch

from causalab_ref.featurizers import kinds, fit

pytestmark = pytest.mark.fast  # the edit-test loop's subset: `pytest -m fast` (README)

D = 8


def test_schedule_is_one_seeded_generator_across_epochs():
    """SPEC.md:1487 [FZ12] each epoch is a fresh permutation from one random.Random(seed), split into minibatches of `pairs`."""
    order = random.Random(3)
    first, second = order.sample(range(5), 5), order.sample(range(5), 5)
    plan = fit.schedule(5, 2, 2, 3)
    assert plan == [[tuple(first[0:2]), tuple(first[2:4]), tuple(first[4:])],
                    [tuple(second[0:2]), tuple(second[2:4]), tuple(second[4:])]]
    assert fit.schedule(5, 2, 2, 3) == plan and fit.schedule(5, 2, 2, 4) != plan


def test_anneal_is_geometric_per_planned_update():
    """SPEC.md:1490 [FZ13] T = start·(end/start)^(done/(total−1)): dbm's 20 updates from 1.0 to 0.05 give
    1.000/0.532/0.242/0.110/0.050 at updates 1/5/10/15/20."""
    got = [round(fit.temperature(1.0, 0.05, u - 1, 20), 3) for u in (1, 5, 10, 15, 20)]
    assert got == [1.0, 0.532, 0.242, 0.110, 0.05]


def _toy(seed=0, epochs=6, patience=10, mode="min", lr=0.05):
    """Fit a k=2 subspace of an 8-wide space to carry a target direction: loss = squared distance."""
    rot = kinds.drawn("subspace", D, 2, seed)
    x = torch.eye(D)[:4]
    target = torch.zeros(4, 2)
    target[:, 0] = x @ torch.linspace(-1, 1, D)

    def update():
        f, _ = rot.featurize(x)
        return {"err": ((f - target) ** 2).sum(-1)}
    settings = fit.Settings(params=("rot",), objective=((1.0, "err"),), epochs=epochs, lr=lr,
                            early_stop="err", mode=mode, patience=patience)
    result = fit.train({"rot": rot}, settings, [[update] * 2 for _ in range(epochs)], update)
    return rot, result


def test_loss_falls_and_curves_have_their_shapes():
    """SPEC.md:1493 [FZ14] the loss is Σ weight·mean(term), minimized by AdamW over the trained leaves;
    train/loss has one float32 entry per update run, train/eval one row per epoch run."""
    rot, result = _toy()
    loss, evals = result["train/loss"], result["train/eval"]
    assert loss.dtype == torch.float32 and loss.shape == (12,) and evals.shape == (6, 1)
    assert loss[-1] < loss[0]
    assert not rot.weight.requires_grad


def test_same_seed_same_weights():
    """SPEC.md:1498 [FZ15] a fit is deterministic on CPU: the same seed trains the identical parameter, another
    seed a different one."""
    a, ra = _toy(seed=1)
    b, rb = _toy(seed=1)
    c, _ = _toy(seed=2)
    assert torch.equal(a.weight, b.weight) and torch.equal(ra["train/loss"], rb["train/loss"])
    assert not torch.equal(a.weight, c.weight)


def test_early_stop_is_strict_and_keeps_the_last_weights():
    """SPEC.md:1500 [FZ16] with mode max on a falling loss nothing improves after the first epoch, so patience
    p stops after p + 1 epochs; the weights kept are the last update's, not the best epoch's."""
    rot, result = _toy(mode="max", patience=2)
    assert result["train/eval"].shape == (3, 1)
    assert result["train/loss"].shape == (6,)
    assert result["train/eval"][2, 0] < result["train/eval"][0, 0]  # the first epoch was the best
    three, _ = _toy(epochs=3, patience=10)
    assert torch.equal(rot.weight, three.weight)  # yet the weights are those after the sixth update


def test_gate_trains_with_soft_mask_and_reports_hard_mask():
    """SPEC.md:1503 [FZ17] a trained gate's `<g>.mask` objective term is its soft mask's mean (L1 pressure)
    while updating; train/eval's column for it is the hard mask's mean, the fraction of units kept."""
    gate = kinds.drawn("gate", D, None, 0)
    x, source = torch.zeros(3, D), torch.ones(3, D)
    keep = torch.tensor([1.0] * 3 + [0.0] * 5)
    seen = []

    def update():
        seen.append(gate.training)
        out = kinds.change_through(gate, x, lambda f, o: o, None, source)
        return {"fit": ((out - keep) ** 2).sum(-1)}
    settings = fit.Settings(params=("mask",), objective=((1.0, "fit"), (0.01, "mask.mask")), epochs=30, lr=0.3,
                            anneal=(("mask", 1.0, 0.1),), early_stop="fit", mode="min", patience=30)
    result = fit.train({"mask": gate}, settings, [[update] for _ in range(30)], update)
    assert seen[0] is True and seen[-1] is False  # the last call is the eval pass
    assert result["train/eval"].shape == (30, 2)
    assert float(result["train/eval"][-1, 1]) == pytest.approx(3 / 8)
    assert gate.temperature == pytest.approx(0.1)
    assert torch.equal(gate.mask(), keep)
