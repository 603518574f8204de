"""A pass's memory (SPEC.md §11 Q8-Q12, §7 S46-S47): the head only where a tap names it, rows split into passes
under the memory budget, and a pass one row of which does not fit refused before it starts. Both engines."""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch

from causalab_ref.runs import compile as compiler
from causalab_ref import cli
from causalab_ref.engines import loading
from causalab_ref.runs import memory, run
from causalab_ref.shapes import Action, Batch, Model, Refusal, Selection

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
PATCHING = json.loads((ROOT / "documents" / "patching.json").read_text(encoding="utf-8"))
GENERATED = json.loads((ROOT / "documents" / "generated_answer.json").read_text(encoding="utf-8"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def hooked():
    return loading.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"), kind="hooks")


@pytest.fixture(params=["nnterp", "hooks"])
def eng(request, llama, hooked):
    return llama if request.param == "nnterp" else hooked


def _head_doc() -> dict:
    """patching.json plus a write at the head (+1 at the last position) and two more head reads: the logits
    at the last two positions and the model's output at -1."""
    doc = copy.deepcopy(PATCHING)
    doc["sites"]["out"] = {"component": "logits"}
    i = doc["interventions"]["patching"]
    i["writes"]["bump"] = {"site": "head", "pos": -1, "mechanism": "add_scaled", "operand": 1.0}
    i["models"]["patched"]["writes"].append("bump")
    i["reads"]["two"] = {"site": "head", "pos": {"last": 2}, "model": "patched", "input": "base"}
    i["reads"]["out"] = {"site": "out", "pos": -1, "model": "patched", "input": "base"}
    return doc


def _values(eng, doc, budget=memory.DEFAULT_BUDGET, batch_size=None):
    step = compiler.compile_document(doc, eng, DATA, budget=budget).steps[0]
    return run.run_step(eng, step, batch_size)


def _head_shapes(eng, call):
    """The shapes of what the head module computed during `call` (the contract's final_modules)."""
    shapes = []
    handle = eng.final_modules()[1].register_forward_hook(lambda m, a, o: shapes.append(tuple(o.shape)))
    try:
        call()
    finally:
        handle.remove()
    return shapes


def test_head_is_computed_only_at_the_positions_read(eng, tmp_path):
    """SPEC.md:1702 [Q8] A document reading lm_head at -1: the head computes one position per row, and a forward
    that reads no head is bounded to no position (the counterfactual forward, which Q36 also stops at its read
    of block_output[0], before the head)."""
    plan = compiler.compile_document(PATCHING, eng, DATA)
    shapes = _head_shapes(eng, lambda: run.execute(plan, eng, tmp_path / "out", progress=False))
    rows = len(plan.steps[0].example_ids)
    assert shapes == [(rows, 1, 32000)]
    forwards = {f.input: f for f in plan.steps[0].forwards}
    last = len(forwards["base"].ids[0]) - 1
    for role, kept in (("counterfactual", []), ("base", [last])):
        batch = Batch(ids=forwards[role].ids, mask=forwards[role].mask,
                      actions=tuple(Action(tap=t, selection=Selection(windows=((last,),) * rows, seq_axis=1))
                                    for t in forwards[role].taps))
        got = eng.forward_inputs(batch)[0]["logits_to_keep"]
        assert got.tolist() == kept, role


def test_head_bound_gives_the_values_of_the_whole_head(eng, monkeypatch):
    """SPEC.md:1702 [Q8] Reads and a write at lm_head and logits, and every metric, are exactly the values the
    head computed at every position gives."""
    doc = _head_doc()
    bound = _values(eng, doc)
    monkeypatch.setattr(eng, "forward_inputs", lambda batch: (eng.inputs(batch.ids, batch.mask), batch.actions))
    unbound: dict = {}
    whole = _head_shapes(eng, lambda: unbound.update(whole=_values(eng, doc)))
    assert whole[-1][1] == 11  # without the bound the head computes every position
    for name in ("logits", "two", "out"):
        assert torch.equal(bound.values[name], unbound["whole"].values[name]), name
    assert bound.scores == unbound["whole"].scores


def test_decode_computes_the_head_at_one_position_per_step(eng):
    """SPEC.md:1712 [Q9] In a decode, the prompt's forward included, the head computes the last position only."""
    step = compiler.compile_document(GENERATED, eng, DATA).steps[0]
    shapes = _head_shapes(eng, lambda: run.run_step(eng, step))
    rows = len(step.example_ids)
    assert len(shapes) == GENERATED["interventions"]["generation"]["decode"]
    assert set(shapes) == {(rows, 1, 32000)}


def test_estimate_counts_the_head_at_the_positions_read(llama):
    """SPEC.md:1715 [Q10] The estimate counts the head at the union of its taps' positions: reading every
    position instead of the last adds 2 x (length - 1) x vocab x 4 bytes of working set per row, and the read
    kept grows by (length - 1) x vocab x 4 (here the last 8, every row's whole content: a cut some row cannot
    fit is refused at compile, P58)."""
    one = compiler.compile_document(PATCHING, llama, DATA).steps[0]
    doc = copy.deepcopy(PATCHING)
    doc["interventions"]["patching"]["reads"]["logits"]["pos"] = {"last": 8}
    doc["interventions"]["patching"]["metrics"] = {}
    doc["steps"]["score"]["saves"] = []
    eight = compiler.compile_document(doc, llama, DATA).steps[0]
    assert memory.pass_cost(llama, eight)[0] - memory.pass_cost(llama, one)[0] == 7 * 32000 * 4 * 3


def test_rows_are_split_into_passes_under_the_budget(eng, monkeypatch):
    """SPEC.md:1727 [Q11] With no --batch-size the run uses the rows per pass the budget allows: 2 rows here,
    so 4 rows are 2 passes of 2 forwards; positions, reasons and eligibility are one pass's and values equal it to
    float32 rounding (R11); --batch-size wins over it."""
    per_row = memory.pass_cost(eng, compiler.compile_document(PATCHING, eng, DATA).steps[0])[0]
    plan = compiler.compile_document(PATCHING, eng, DATA, budget=2 * per_row + 1)
    assert plan.rows_per_pass == 2
    assert plan.text().endswith("\n  rows per pass: 2 (the memory budget's; --batch-size overrides it)")
    assert "rows per pass" not in compiler.compile_document(PATCHING, eng, DATA).text()
    one = run.run_step(eng, compiler.compile_document(PATCHING, eng, DATA).steps[0])
    calls = []
    forward = eng.forward
    monkeypatch.setattr(eng, "forward", lambda batch: calls.append(len(batch.ids)) or forward(batch))
    split = run.run_step(eng, plan.steps[0], plan.rows_per_pass)
    assert calls == [2, 2, 2, 2]
    assert split.placed == one.placed and split.eligible == one.eligible
    for name, scores in one.scores.items():  # a matrix product of fewer rows rounds differently (R11)
        assert split.scores[name] == pytest.approx(scores, rel=1e-6, abs=1e-6), name
    assert torch.allclose(split.values["logits"], one.values["logits"], rtol=0, atol=1e-5)
    calls.clear()
    run.run_step(eng, plan.steps[0], 4)
    assert calls == [4, 4]


def test_execute_takes_the_plans_rows_per_pass(llama, monkeypatch, tmp_path):
    """SPEC.md:1727 [Q11] `run` without --batch-size runs the plan's rows per pass and records it in run.json."""
    per_row = memory.pass_cost(llama, compiler.compile_document(PATCHING, llama, DATA).steps[0])[0]
    plan = compiler.compile_document(PATCHING, llama, DATA, budget=3 * per_row)
    calls = []
    forward = llama.forward
    monkeypatch.setattr(llama, "forward", lambda batch: calls.append(len(batch.ids)) or forward(batch))
    run.execute(plan, llama, tmp_path / "out", progress=False)
    assert calls == [3, 3, 1, 1]
    record = json.loads((tmp_path / "out" / "run.json").read_text(encoding="utf-8"))
    assert record["rows_per_pass"] == 3 and record["batch_size"] is None


def _cli(capsys, *args) -> tuple[int, list[str]]:
    code = cli.main(list(args))
    return code, capsys.readouterr().err.strip().splitlines()


def test_a_pass_one_row_of_which_does_not_fit_is_refused_at_compile(llama):
    """SPEC.md:1737 [Q12] One row above the budget is refused at compile (so by validate and explain too, before
    any forward), naming the step's rows, the sizes and what to change."""
    with pytest.raises(Refusal) as refused:
        compiler.compile_document(PATCHING, llama, DATA, budget=100 * 1024)
    assert (refused.value.stage, refused.value.path) == ("compile", "steps.score.rows")
    message = refused.value.message
    assert message.startswith("step 'score': one row of this pass needs about ") and "\n" not in message
    assert "the head at 1 position(s) x 32000 logits" in message
    assert "above the memory budget of 102400 bytes" in message and "raise --memory-budget" in message


def test_a_memory_budget_that_is_not_a_size_is_refused(capsys):
    """SPEC.md:1267 [S47] `--memory-budget 1x` is refused at validation in one line saying what to write."""
    code, lines = _cli(capsys, "validate", str(ROOT / "documents/patching.json"), "--memory-budget", "1x")
    assert code == 2 and lines == [
        "validation: --memory-budget: --memory-budget '1x' is not a size; write a number of bytes, or a number "
        "with KiB, MiB or GiB (the default is 1GiB)"]
    assert memory.parse_budget("1.5MiB") == 3 << 19 and memory.parse_budget(None) == 1 << 30


def test_many_rows_run_in_passes_under_the_default_budget(llama, tmp_path):
    """SPEC.md:1262 [S46] Many rows with no --batch-size (1,200 reading the head at 8 positions each): compile
    splits them into passes whose estimate fits the default budget (the run takes them, Q11), not one pass."""
    root = tmp_path / "data"
    (root / "weekdays").mkdir(parents=True)
    rows = json.loads((DATA / "weekdays" / "train.json").read_text(encoding="utf-8"))
    (root / "weekdays" / "train.json").write_text(json.dumps(rows * 300), encoding="utf-8")
    doc = copy.deepcopy(PATCHING)
    doc["interventions"]["patching"]["reads"]["logits"]["pos"] = {"last": 8}  # every row's content (P58)
    doc["interventions"]["patching"]["metrics"] = {}
    doc["steps"]["score"]["saves"] = []
    plan = compiler.compile_document(doc, llama, root)
    per_row = memory.pass_cost(llama, plan.steps[0])[0]
    assert len(plan.steps[0].example_ids) == 1200
    assert 0 < plan.rows_per_pass < 1200 and plan.rows_per_pass * per_row <= memory.DEFAULT_BUDGET < (plan.rows_per_pass + 1) * per_row


def test_a_read_only_metrics_use_is_kept_as_its_scores(eng):
    """SPEC.md:1715 [Q10] The run's own passes score a read only metrics use chunk by chunk and keep its scores,
    not its values: the tables are exactly those of the same chunks keeping every value."""
    step = compiler.compile_document(PATCHING, eng, DATA).steps[0]
    as_it_goes, kept = run.run_step(eng, step, 2, score_as_you_go=True), run.run_step(eng, step, 2)
    assert "logits" in kept.values and "logits" not in as_it_goes.values and "v_cf" in as_it_goes.values
    assert as_it_goes.scores == kept.scores and as_it_goes.eligible == kept.eligible
