"""SPEC.md §11 Performance (Q5-Q7): forwards that several steps compute identically run once.

Run through `run.execute` (the whole run) with the engine's `forward` counted, against each
step run on its own (`run.run_step`, which shares nothing): values must be identical.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import replace

import pytest

from causalab_ref.runs import compile as compiler
from causalab_ref.runs import run, share
from causalab_ref.shapes import Refusal, Where

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"


def _doc(name: str) -> dict:
    return json.loads((ROOT / "documents" / f"{name}.json").read_text(encoding="utf-8"))


def _counted(monkeypatch, eng) -> list:
    calls = []
    forward = eng.forward

    def counted(batch):
        calls.append(batch)
        return forward(batch)
    monkeypatch.setattr(eng, "forward", counted)
    return calls


def _tables(out: pathlib.Path) -> dict:
    return {p.relative_to(out).as_posix(): [r["value"] for r in json.loads(p.read_text(encoding="utf-8"))]
            for p in out.rglob("*.json") if p.name not in ("document.json", "run.json")}


@pytest.mark.parametrize("batch_size", [None, 3])
def test_a_forward_shared_by_sweep_points_runs_once_with_each_points_values(llama, monkeypatch, tmp_path,
                                                                            batch_size):
    """SPEC.md:1687 [Q5] head_patching's four points read one counterfactual forward: 5 forwards per chunk
    instead of 8, and every table equals the point run on its own."""
    plan = compiler.compile_document(_doc("head_patching"), llama, DATA)
    calls = _counted(monkeypatch, llama)
    run.execute(plan, llama, tmp_path / "out", batch_size=batch_size, progress=False)
    chunks = 1 if batch_size is None else 2  # 4 rows in chunks of 3
    assert len(calls) == 5 * chunks
    got = _tables(tmp_path / "out")
    for leaf in plan.leaves():
        alone = run.run_step(llama, leaf.steps[0], batch_size)
        for value, file_path in leaf.steps[0].saves:
            assert got[f"{leaf.label}/{file_path}"] == alone.scores[value], (leaf.label, value)


@pytest.mark.parametrize("batch_size", [None, 3])
def test_sweep_points_on_the_same_rows_build_each_frame_once(llama, monkeypatch, tmp_path, batch_size):
    """SPEC.md:1771 [Q15] head_patching's four points on one set of rows build the base and counterfactual
    frames once, not at every point: compile builds the two whole-row frames (P58), one pair for all four
    points, and the run builds neither again, in one pass or in two chunks (each chunk takes its rows of
    compile's frames, Q26); the tables are each point's own."""
    from causalab_ref.positions import resolve
    plan = compiler.compile_document(_doc("head_patching"), llama, DATA)
    assert len(plan.leaves()) == 4 and all(leaf.frames is plan.leaves()[0].frames for leaf in plan.leaves())
    assert len(plan.leaves()[0].frames) == 2
    built = []
    frame_of_ids = resolve.frame_of_ids

    def counted(*args, **kwargs):
        built.append(args[1])
        return frame_of_ids(*args, **kwargs)
    monkeypatch.setattr(resolve, "frame_of_ids", counted)
    run.execute(plan, llama, tmp_path / "out", batch_size=batch_size, progress=False)
    assert built == []
    got = _tables(tmp_path / "out")
    for leaf in plan.leaves():
        alone = run.run_step(llama, leaf.steps[0], batch_size)
        for value, file_path in leaf.steps[0].saves:
            assert got[f"{leaf.label}/{file_path}"] == alone.scores[value], (leaf.label, value)


def test_explain_names_the_steps_that_share_a_forward(llama):
    """SPEC.md:1695 [Q6] explain ends with the shared forwards and the `<point>/<step>` each serves."""
    lines = compiler.compile_document(_doc("layer_sweep"), llama, DATA).text().splitlines()
    assert lines[-2:] == ["  shared forwards (each runs once, its reads serve every step named):",
                          "    'original' on 'base'  (4 rows x 11 tokens): layers=0/score, layers=1/score"]
    assert "shared forwards" not in compiler.compile_document(_doc("patching"), llama, DATA).text()


def test_decoding_forwards_and_different_writes_are_not_shared(llama):
    """SPEC.md:1698 [Q7] a forward that decodes is never shared, and two points whose writes land in different
    places each run their own patched forward."""
    raw = _doc("generated_answer")
    raw["interventions"]["generation"]["reads"]["at_said"]["pos"]["index"] = {"sweep": [-1, -2]}
    plan = compiler.compile_document(raw, llama, DATA)
    assert len(plan.leaves()) == 2
    assert not any(f.computation for leaf in plan.leaves() for s in leaf.steps for f in s.forwards)
    patched = [f for leaf in compiler.compile_document(_doc("head_patching"), llama, DATA).leaves()
               for f in leaf.steps[0].forwards if f.model == "patched"]
    assert len(patched) == 4 and not any(f.computation for f in patched)


def test_a_read_that_cannot_be_placed_on_the_shared_rows_runs_its_own_forward(llama):
    """SPEC.md:1698 [Q7] the point that runs a shared forward leaves out another point's read that the rows
    refuse (index 99 past the prompt): its own values are its unshared ones, and the other point runs
    the forward itself and is refused with its own read's path."""
    raw = _doc("layer_sweep")
    raw["sites"]["resid"]["layers"] = [0]
    raw["interventions"]["lens"]["reads"]["lens"]["pos"] = {"sweep": [-1, -2]}
    plan = compiler.compile_document(raw, llama, DATA)
    # index 99 (past every prompt) put into the second point after compile, which would refuse it (P58)
    leaf = plan.points[1]
    step = leaf.steps[0]
    forwards = tuple(replace(f, taps=tuple(replace(t, pos=Where(index=99)) if t.name == "lens" else t
                                           for t in f.taps)) for f in step.forwards)
    plan = replace(plan, points=(plan.points[0], replace(leaf, steps=(replace(step, forwards=forwards),))))
    first, second = (leaf.steps[0] for leaf in plan.leaves())
    assert first.forwards[0].computation and first.forwards[0].computation == second.forwards[0].computation
    memo = share.Memo(plan)
    assert run.run_step(llama, first, memo=memo).scores == run.run_step(llama, first).scores
    with pytest.raises(Refusal) as refusal:
        run.run_step(llama, second, memo=memo)
    assert refusal.value.path == "interventions.lens.reads.lens.pos"
