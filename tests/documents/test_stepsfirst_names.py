"""The steps-first lowering's names (stepsfirst.py): no two things a document writes lower to one name, each
shape the reader once took for an internal error is one refusal line, the stages and the forward order are
what their plain definitions say, and SPEC's worked lowered document is what the code lowers."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from causalab_ref.documents import reader, stepsfirst, stepstages, validate
from causalab_ref.shapes import Refusal
from tests.inprocess import cli

ROOT = Path(__file__).resolve().parents[2]
DATA = str(ROOT / "documents" / "data")
POS_SWEEP = json.loads((ROOT / "documents" / "steps_first" / "pos_sweep.json").read_text(encoding="utf-8"))
CORPUS = ROOT / "causalab_ref" / "conformance" / "corpus"
HEAD = {"component": "lm_head"}


def _refusal(tmp_path: Path, doc) -> str:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    done = cli("validate", str(path), "--data-root", DATA)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr and "internal error" not in done.stderr
    return done.stderr.strip()


def _unswept() -> dict:
    doc = copy.deepcopy(POS_SWEEP)
    doc["steps"]["patched"]["interventions"]["writes"]["patch"]["pos"] = -1
    return doc


def _forward(field: str, reads: dict, writes: dict | None = None) -> dict:
    step = {"kind": "forward", "data": "pairs", "field": field, "reads": reads}
    if writes:
        step["interventions"] = {"writes": writes}
    return step


def _logit_diff(of: str) -> dict:
    return {"kind": "metric", "metric": "logit_diff", "of": of, "a": "pairs.cf_answer", "b": "pairs.base_answer"}


def colliding_reads() -> dict:
    """Issue 38's first High defect: step `p` reads `q:logits` (the clean run), step `p:q` reads `logits`
    (patched); both were lowered to the read `p:q:logits`, and the clean table scored the patched run."""
    doc = _unswept()
    doc["sites"]["head"] = HEAD
    patched = doc["steps"]["patched"]
    patched["reads"]["logits"]["site"] = "head"
    doc["steps"] = {"counterfactual": doc["steps"]["counterfactual"],
                    "p": _forward("input", {"q:logits": {"site": "head", "pos": -1}}),
                    "p:q": patched,
                    "clean": _logit_diff("p.q:logits"), "patched_ld": _logit_diff("p:q.logits"),
                    "saves": {"clean": "clean.json", "patched_ld": "patched.json"}}
    return doc


def colliding_roles(source: str = "base") -> dict:
    """Issue 38's second High defect: the interchange's source step `base` runs on the counterfactual column,
    step `base-1` on another; both roles were named `base-1`, and the source read the other column's prompts."""
    doc = _unswept()
    steps = doc["steps"]
    steps["patched"]["interventions"]["writes"]["patch"]["operand"] = f"{source}.v_cf"
    doc["steps"] = {source: steps["counterfactual"],
                    "base-1": _forward("entity", {"e": {"site": "target", "pos": -1}}),
                    "patched": steps["patched"], "logit_diff": steps["logit_diff"],
                    "saves": {"logit_diff": "logit_diff.json"}}
    return doc


@pytest.mark.fast
def test_a_step_and_a_read_that_would_lower_to_one_name_are_refused(tmp_path):
    """SPEC.md:2638 [SF20] the replayed document of `p` / `q:logits` and `p:q` / `logits`: one refusal line at
    the first name holding ':', where it once lowered both reads to `p:q:logits` and scored one run twice."""
    assert _refusal(tmp_path, colliding_reads()) == (
        "validation: steps.p.reads.q:logits: read 'q:logits' holds ':', and the lowering names a step's read, write "
        "or in-place site '<step>:<name>', so two names with ':' can lower to one; rename it without ':'")


@pytest.mark.fast
@pytest.mark.parametrize("edit, path", [
    (lambda d: d["steps"].update({"p:q": d["steps"].pop("patched")}), "steps.p:q"),
    (lambda d: d["steps"]["patched"]["interventions"]["writes"].update(
        {"x:y": {"site": "target", "pos": -1, "mechanism": "zero"}}), "steps.patched.interventions.writes.x:y"),
    (lambda d: d["sites"].update({"patched:logits": HEAD}), "sites.patched:logits"),
])
def test_every_name_the_lowering_joins_with_a_colon_is_refused_holding_one(tmp_path, edit, path):
    """SPEC.md:2638 [SF20] a step, a write and a declared site holding ':' (a declared 'patched:logits' would be
    the name of patched's in-place read site)."""
    doc = _unswept()
    edit(doc)
    assert _refusal(tmp_path, doc).startswith(f"validation: {path}: ")


@pytest.mark.fast
def test_a_step_named_base_on_other_rows_is_refused(tmp_path):
    """SPEC.md:2638 [SF20] SPEC.md:2517 [SF4] the replayed document whose `base` and `base-1` steps were both
    given the role `base-1`: one refusal line naming the step and the fix."""
    assert _refusal(tmp_path, colliding_roles()) == (
        "validation: steps.base: step 'base' runs on dataset 'pairs', field 'counterfactual_inputs[0]', which are "
        "not the rows the metrics score, and those rows are the role named 'base'; a step named 'base' runs on "
        "them or not at all, so rename the step")


@pytest.mark.fast
def test_renamed_the_roles_are_one_per_column_each_its_own_field():
    """SPEC.md:2517 [SF4] the same document with the source renamed: three roles, each its step's column, the
    source's read on its own role."""
    plan = stepsfirst.lower(colliding_roles("cf")).plan
    assert plan["roles"] == {"base": {"field": "input"}, "cf": {"field": "counterfactual_inputs[0]"},
                             "base-1": {"field": "entity"}}
    assert plan["interventions"]["stage1"]["reads"]["cf:v_cf"]["input"] == "cf"


@pytest.mark.fast
def test_a_step_named_base_on_the_base_rows_is_the_base_role():
    """SPEC.md:2517 [SF4] a step named `base` that runs on the metrics' rows is read as before."""
    doc = _unswept()
    doc["steps"] = {("base" if k == "patched" else k): v for k, v in doc["steps"].items()}
    doc["steps"]["iia"]["of"] = doc["steps"]["logit_diff"]["of"] = "base.logits"
    plan = stepsfirst.lower(doc).plan
    assert plan["roles"] == {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}}


@pytest.mark.fast
@pytest.mark.parametrize("edit, line", [
    (lambda d: d["steps"]["patched"]["interventions"]["writes"].update(
        {"logits": {"site": {"component": "block_output", "layers": 0}, "pos": -1, "mechanism": "zero"}}),
     "validation: steps.patched.interventions.writes.logits: step 'patched' has a read and a write both named "
     "'logits'"),
    (lambda d: d.update(steps=json.loads(json.dumps(d["steps"]).replace("patched", "original"))),
     "validation: steps.original.interventions: a step that writes is the intervened model named after it, and "
     "'original' is the model with no writes"),
])
def test_a_read_and_write_of_one_name_and_a_writing_step_named_original_are_refused(tmp_path, edit, line):
    """SPEC.md:2638 [SF20] both would name one in-place site `<step>:<name>`; a writing `original` would be both
    the model with no writes and the one with this step's."""
    doc = _unswept()
    edit(doc)
    assert _refusal(tmp_path, doc).startswith(line)


def _two_generations() -> dict:
    gen = {"kind": "generate", "data": "pairs", "max_new_tokens": 2,
           "reads": {"l": {"site": {"component": "logits"}, "pos": -1}}}
    return {"model": POS_SWEEP["model"], "data": {"pairs": {"path": "weekdays/train"}},
            "steps": {"g1": dict(gen, field="input"), "g2": dict(gen, field="counterfactual_inputs[0]"),
                      "saves": ["g1"]}}


@pytest.mark.fast
def test_two_writeless_generations_on_other_rows_cannot_share_original_generated(tmp_path):
    """SPEC.md:2638 [SF20] both are the original model's ids, `original.generated`, which a pass keeps once."""
    assert _refusal(tmp_path, _two_generations()).startswith(
        "validation: steps.saves.0: generate step 'g1' writes nothing, so its ids are the original model's "
        "('original.generated'), and so are those of step 'g2' in the same pass on other rows")
    same_rows = _two_generations()
    same_rows["steps"]["g2"]["field"] = "input"  # one role: one forward, one set of ids
    assert stepsfirst.lower(same_rows).plan["steps"]["stage1"]["saves"] == [
        {"value": "original.generated", "file_path": "g1.safetensors"}]


@pytest.mark.fast
def test_a_read_in_a_metric_column_is_refused(tmp_path):
    """SPEC.md:2521 [SF5] `expected` is a column of the base rows; a read there once lowered to a column named
    `patched:logits`."""
    doc = _unswept()
    doc["steps"]["iia"]["expected"] = "patched.logits"
    assert _refusal(tmp_path, doc).startswith(
        "validation: steps.iia.expected: 'patched.logits' names a read of step 'patched', and `expected` is a "
        "column of the rows the metric scores; write it 'pairs.<column>'")


# ---------------------------------------------------------------- no two things lower to one name


STEP_NAMES = ["p", "p:q", "base", "base-1", "base-2", "original", "stage1", "x"]
PART_NAMES = ["q:logits", "logits", "q", "p:q", "x"]


@st.composite
def documents(draw):
    """Steps-first documents of forwards on three columns whose step, read and write names are drawn to meet
    the lowering's own (':' joined names, base, base-<n>, original, stage<k>)."""
    names = draw(st.lists(st.sampled_from(STEP_NAMES), min_size=1, max_size=5, unique=True))
    steps: dict = {}
    for k, name in enumerate(names):
        reads = draw(st.lists(st.sampled_from(PART_NAMES), min_size=1, max_size=2, unique=True))
        step = _forward(draw(st.sampled_from(["input", "entity", "counterfactual_inputs[0]"])),
                        {r: {"site": draw(st.sampled_from(["head", HEAD])), "pos": -1} for r in reads})
        if k and draw(st.booleans()):
            source = draw(st.sampled_from([n for n in names[:k] if n in steps]))
            write = draw(st.sampled_from(PART_NAMES))
            step["interventions"] = {"writes": {write: {"site": "target", "pos": -1, "mechanism": "swap",
                                                        "operand": f"{source}.{next(iter(steps[source]['reads']))}"}}}
        steps[name] = step
    sites = {draw(st.sampled_from(["head", "q:logits", "p:q"])): HEAD, "target": {"component": "block_output",
                                                                                "layers": 0}}
    sites["head"] = HEAD
    last = names[-1]
    steps["m"] = _logit_diff(f"{last}.{next(iter(steps[last]['reads']))}")
    return {"model": POS_SWEEP["model"], "data": {"pairs": {"path": "weekdays/train"}}, "sites": sites,
            "steps": steps}


@settings(max_examples=300, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(doc=documents())
def test_the_lowering_is_refused_or_gives_every_read_write_site_and_role_its_own_name(doc):
    """SPEC.md:2638 [SF20] SPEC.md:2531 [SF8] whatever names a document draws to meet the lowering's: a refusal,
    or a lowered document in which each step's every read and write is there once, on a role whose field is
    its step's, each in-place site its own, each writing step its own model."""
    try:
        plan = stepsfirst.lower(doc).plan
    except Refusal:
        return
    intervention = plan["interventions"]["stage1"]
    runs = {n: s for n, s in doc["steps"].items() if s["kind"] == "forward"}
    reads = [(n, r) for n, s in runs.items() for r in s["reads"]]
    writes = [(n, w) for n, s in runs.items() for w in s.get("interventions", {}).get("writes", {})]
    assert len(intervention["reads"]) == len(reads) and len(intervention.get("writes", {})) == len(writes)
    in_place = [(n, r) for n, s in runs.items() for r, read in s["reads"].items() if isinstance(read["site"], dict)]
    assert len(plan["sites"]) == len(doc["sites"]) + len(in_place)
    for n, r in reads:
        lowered = intervention["reads"][f"{n}:{r}"]
        assert plan["roles"][lowered["input"]]["field"] == runs[n]["field"]
        assert lowered["model"] == (n if runs[n].get("interventions") else "original")
    assert len(intervention.get("models", {})) == sum(1 for s in runs.values() if s.get("interventions"))
    assert len(plan["roles"]) == len({s["field"] for s in runs.values()})


# ---------------------------------------------------------------- shapes once taken for internal errors


@pytest.mark.fast
@pytest.mark.parametrize("edit, line", [
    (lambda d: d["steps"]["patched"].update(data=["pairs"]), "validation: steps.patched.data: a step's `data` is "
                                                            "the name of a dataset `data` declares, a string; got a "
                                                            "list"),
    (lambda d: d["steps"]["patched"].update(data={"a": 1}), "validation: steps.patched.data: a step's `data` is "
                                                           "the name of a dataset"),
    (lambda d: d["steps"]["patched"].update(field=["input"]), "validation: steps.patched.field: a step's `field` is "
                                                             "the column its prompt is (such as 'input'), a string; "
                                                             "got a list"),
    (lambda d: d["steps"]["counterfactual"].update(field={"a": 1}), "validation: steps.counterfactual.field: a "
                                                                   "step's `field` is the column its prompt is"),
    (lambda d: d["steps"].update(saves=3), "validation: steps.saves: steps.saves is {value: file} or [value, ...], "
                                           "naming metric, reduce or generate steps; got an integer"),
    (lambda d: d["steps"].update(saves=None), "validation: steps.saves: steps.saves is {value: file}"),
    (lambda d: d["steps"].update(saves=True), "validation: steps.saves: steps.saves is {value: file}"),
    (lambda d: d["steps"].update(saves=["iia", "logit_diff", "iia"]), "validation: steps.saves.2: 'iia' is listed "
                                                                      "twice; a step is saved once"),
    (lambda d: d.update(steps={"iia": d["steps"]["iia"], "saves": ["iia"]}),
     "validation: steps: no forward or generate step: a steps-first document runs the model in at least one"),
])
def test_a_wrong_type_of_data_field_or_saves_and_no_forward_are_one_refusal(tmp_path, edit, line):
    """SPEC.md:2512 [SF3] SPEC.md:2600 [SF9] data and field a list or an object, saves a number, null or true, a
    save listed twice, metric steps with no forward: one line at the path (once `unhashable type`, `not
    iterable`, StopIteration)."""
    doc = _unswept()
    edit(doc)
    assert _refusal(tmp_path, doc).startswith(line)


# ---------------------------------------------------------------- stages: the plain definition


@st.composite
def step_graphs(draw):
    """Forward, reduce and metric steps each naming earlier ones (`of`, `against`, operands)."""
    steps: dict = {}
    for k in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["forward", "forward", "reduce", "metric"]))
        earlier = list(steps)
        forwards = [n for n in earlier if steps[n]["kind"] == "forward"]
        if kind == "forward":
            named = draw(st.lists(st.sampled_from(earlier), max_size=3)) if earlier else []
            writes = {f"w{i}": {"operand": n if steps[n]["kind"] == "reduce" else f"{n}.r"}
                      for i, n in enumerate(named) if steps[n]["kind"] != "metric"}
            steps[f"s{k}"] = {"kind": "forward", "reads": {"r": {}},
                              **({"interventions": {"writes": writes}} if writes else {})}
        elif forwards:
            step = {"kind": kind, "of": f"{draw(st.sampled_from(forwards))}.r"}
            if kind == "metric" and draw(st.booleans()):
                step["against"] = f"{draw(st.sampled_from(forwards))}.r"
            steps[f"s{k}"] = step
    return steps


@settings(max_examples=400, deadline=None, database=None, derandomize=True)
@given(steps=step_graphs())
def test_stages_are_the_plain_definitions(steps):
    """SPEC.md:2531 [SF8] SPEC.md:1855 [Q39] the grouped, one-pass stages equal the round-by-round fixpoint,
    and a graph that never settles is refused."""
    want = stepstages.stages_by_rounds(steps)
    if want is None:
        with pytest.raises(Refusal, match="swaps in a reduce step's value and, in the same pass"):
            stepstages.stages(steps)
    else:
        assert stepstages.stages(steps) == want


@pytest.mark.fast
def test_a_chain_of_forwards_and_reduces_is_staged_in_one_pass():
    """SPEC.md:2531 [SF8] SPEC.md:1855 [Q39] 3,000 steps alternating forward and reduce, each forward swapping in
    the last reduce's value: stage k for the k-th pair, found without rounds over every step."""
    steps: dict = {"f0": {"kind": "forward", "reads": {"r": {}}}}
    for k in range(1, 1500):
        steps[f"m{k}"] = {"kind": "reduce", "of": f"f{k - 1}.r"}
        steps[f"f{k}"] = {"kind": "forward", "reads": {"r": {}},
                          "interventions": {"writes": {"w": {"operand": f"m{k}"}}}}
    stage = stepstages.stages(steps)
    assert stage["f1499"] == 1499 and stage["m1499"] == 1498 and stage["f0"] == 0


# ---------------------------------------------------------------- SPEC's worked lowered document


def _spec_block(marker: str) -> str:
    text = (ROOT / "SPEC.md").read_text(encoding="utf-8")
    found = re.search(re.escape(marker) + r".*?\n```json\n(.*?)\n```", text, re.S)
    assert found, marker
    return found.group(1)


@pytest.mark.fast
def test_specs_worked_lowered_document_is_the_lowering_of_the_corpus_case():
    """SPEC.md:2531 [SF8] SPEC.md:2621 [SF15] the lowered first point SPEC shows is what lower() gives for
    run_steps_first_pos_sweep's document, and its D19 digest is the produced_by the corpus case pins (checked
    there against the tables an independent lowering reproduces)."""
    case = json.loads((CORPUS / "run_steps_first_pos_sweep.json").read_text(encoding="utf-8"))
    shown = json.loads(_spec_block("Worked lowering"))
    point = validate.points_of(stepsfirst.lower(case["document"]).plan)[0]
    assert point.label == "pos=-1" and point.raw == dict(shown, header=point.raw["header"])
    assert point.raw["header"] == {"description": case["document"]["header"]["description"]}
    pinned = {row["produced_by"] for row in case["expect"]["tables"]["pos=-1/iia.json"]}
    assert pinned == {reader.digest(shown)}


@pytest.mark.fast
def test_an_unswept_documents_produced_by_hashes_its_positions_as_written():
    """SPEC.md:2621 [SF15] unswept: the document as given, `-1` and {"index": -1} two digests; a swept point:
    its lowered point's D19 digest, where the two spellings are one."""
    spelled = _unswept()
    spelled["steps"]["patched"]["interventions"]["writes"]["patch"]["pos"] = {"index": -1}
    assert stepsfirst.digest(spelled) != stepsfirst.digest(_unswept())
    case = json.loads((CORPUS / "run_steps_first_gpt2_reach.json").read_text(encoding="utf-8"))
    pinned = {row["produced_by"] for rows in case["expect"]["tables"].values() for row in rows}
    assert pinned == {stepsfirst.digest(case["document"])} != {reader.digest(case["document"])}
    points = [validate.points_of(stepsfirst.lower(d).plan)[0].raw for d in (spelled, _unswept())]
    assert reader.digest(points[0]) == reader.digest(points[1])


@pytest.mark.fast
def test_stages_times_roles_past_the_bound_is_refused_before_lowering(tmp_path):
    """SPEC.md:2654 [SF21] 101 datasets, each forward swapping in the mean of the one before: 101 passes over
    101 roles, 10,201 pass-rows, refused at `steps` naming both counts; 100 x 100 lowers."""
    def chain(n: int) -> dict:
        steps: dict = {"f0": _forward("input", {"v": {"site": "target", "pos": -1}})}
        steps["f0"]["data"] = "d0"
        for k in range(1, n):
            steps[f"m{k}"] = {"kind": "reduce", "reduce": "mean", "of": f"f{k - 1}.v"}
            steps[f"f{k}"] = dict(_forward("input", {"v": {"site": "target", "pos": -1}},
                                           {"w": {"site": "target", "pos": -1, "mechanism": "swap",
                                                  "operand": f"m{k}"}}), data=f"d{k}")
        return {"model": POS_SWEEP["model"], "data": {f"d{k}": {"path": "weekdays/train"} for k in range(n)},
                "sites": POS_SWEEP["sites"], "steps": steps}
    assert _refusal(tmp_path, chain(101)).startswith(
        "validation: steps: the steps run in 101 passes (a reduce step's value is used a pass after its forward) "
        "over 101 (dataset, field) pairs, and each pass runs over every pair's rows: 10201 pass-rows, above the "
        "10000 a document lowers to")
    plan = stepsfirst.lower(chain(100)).plan
    assert len(plan["steps"]) == 100 and len(plan["roles"]) == 100
