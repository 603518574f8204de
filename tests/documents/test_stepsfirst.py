"""The steps-first format (stepsfirst.py): read into the plan-shaped document it means, its references,
stages and saves, its refusals by name at its own paths, and the original's documents adapted to the fixtures."""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from causalab_ref.documents import protocol, stepsfirst
from causalab_ref.runs import compile as compiler, run
from tests.inprocess import cli

ROOT = Path(__file__).resolve().parents[2]
DATA = str(ROOT / "documents" / "data")
SHIPPED = ROOT / "documents" / "steps_first"
TWINS = Path(__file__).resolve().parent / "twins"


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


POS_SWEEP = _load(SHIPPED / "pos_sweep.json")


def _verb(tmp_path: Path, doc, *verb: str):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return cli(*verb[:-1], verb[-1], str(path), "--data-root", DATA) if len(verb) > 1 else \
        cli(verb[0], str(path), "--data-root", DATA)


def _refusal(tmp_path: Path, doc) -> str:
    done = _verb(tmp_path, doc, "validate")
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    return done.stderr.strip()


def _edited(edit) -> dict:
    doc = copy.deepcopy(POS_SWEEP)
    edit(doc)
    return doc


@pytest.mark.fast
def test_a_steps_first_document_is_told_apart_and_read_into_the_pipeline(tmp_path):
    """SPEC.md:2502 [SF1] data beside steps is steps-first; validate says so, --json format steps-first."""
    assert protocol.format_of(POS_SWEEP) == "steps-first"
    done = _verb(tmp_path, POS_SWEEP, "validate")
    assert done.returncode == 0 and done.stdout.strip().endswith("is a valid steps-first document, 3 steps")
    done = _verb(tmp_path, POS_SWEEP, "--json", "validate")
    assert json.loads(done.stdout)["format"] == "steps-first"


@pytest.mark.fast
def test_a_steps_first_document_is_not_refused_as_a_protocol_one():
    """SPEC.md:1604 [PR2] the steps-first reader reads it; no unknown key `data`."""
    assert stepsfirst.lower(POS_SWEEP).plan["roles"]["base"] == {"field": "input"}


@pytest.mark.fast
@pytest.mark.parametrize("edit, line", [
    (lambda d: d.update(extra=1), "validation: extra: unknown key 'extra'; allowed here: ['data', 'header', "
                                  "'model', 'sites', 'steps']"),
    (lambda d: d.update(roles={}), "validation: roles: roles belong to the plan-shaped format"),
    (lambda d: d.update(interventions={}), "validation: interventions: a steps-first document declares no "
                                           "interventions"),
    (lambda d: d.update(featurizers={}), "validation: featurizers: featurizers in a steps-first document are not"),
    (lambda d: d["header"].update(author="x"), "validation: header.author: unknown key 'author'"),
    (lambda d: d["model"].update(revison="x"), "validation: model.revison: unknown key 'revison'"),
])
def test_the_top_level_is_checked_by_name(tmp_path, edit, line):
    """SPEC.md:2508 [SF2] header, model, data, sites, steps; roles/interventions/featurizers refused by name."""
    assert _refusal(tmp_path, _edited(edit)).startswith(line)


@pytest.mark.fast
@pytest.mark.parametrize("edit, line", [
    (lambda d: d["data"]["pairs"].update(dataset="x"), "validation: data.pairs.dataset: unknown key 'dataset'; "
                                                      "allowed here: ['path']"),
    (lambda d: d["data"]["pairs"].update(path=3), "validation: data.pairs.path: a dataset's path is a dataset ref"),
    (lambda d: d["steps"]["patched"].update(data="pair"), "validation: steps.patched.data: step 'patched' runs on "
                                                         "dataset \"pair\", which `data` does not declare"),
    (lambda d: d["steps"]["patched"]["reads"]["logits"].update(input="base"),
     "validation: steps.patched.reads.logits.input: unknown key 'input'; allowed here: ['pos', 'site', 'view']"),
    (lambda d: d["data"].update(nowhere={"path": "weekdays/nothing"}), None),
])
def test_data_names_datasets_and_a_forward_step_names_its_own(tmp_path, edit, line):
    """SPEC.md:2512 [SF3] data is {name: {path}}; a forward step names its dataset and field; reads take no input."""
    doc = _edited(edit)
    if line is None:  # a declared dataset no step runs on is rows nobody reads: not an error
        assert _verb(tmp_path, doc, "validate").returncode == 0
    else:
        assert _refusal(tmp_path, doc).startswith(line)


@pytest.mark.fast
def test_each_dataset_and_field_is_one_role_base_is_the_metrics():
    """SPEC.md:2517 [SF4] base is the first metric's read's role; the other is named after its first step."""
    plan = stepsfirst.lower(POS_SWEEP).plan
    assert plan["roles"] == {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}}
    assert plan["steps"]["stage1"]["rows"] == {"base": "weekdays/train", "counterfactual": "weekdays/train"}


@pytest.mark.fast
def test_references_are_reads_columns_and_reduce_values():
    """SPEC.md:2521 [SF5] step.read is a read, dataset.column a base column, a reduce's name a ref."""
    plan = stepsfirst.lower(_load(SHIPPED / "mean_ablation.json")).plan
    assert plan["interventions"]["stage1"]["metrics"]["clean_ld"] == {
        "kind": "logit_diff", "of": "clean:logits", "a": "cf_answer", "b": "base_answer"}
    assert plan["interventions"]["stage2"]["writes"]["ablated:ablate"]["operand"] == {"ref": "mean"}


@pytest.mark.fast
@pytest.mark.parametrize("edit, line", [
    (lambda d: d["steps"]["iia"].update(expected="other.cf_answer"),
     "validation: steps.iia.expected: 'other.cf_answer' is a column of dataset 'other', and a metric's columns"),
    (lambda d: d["steps"]["iia"].update(of="patched.logit"),
     "validation: steps.iia.of: 'patched.logit': step 'patched' has no read 'logit'; its reads: ['logits']; did "
     "you mean 'logits'?"),
    (lambda d: d["steps"]["iia"].update(of="pached.logits"),
     "validation: steps.iia.of: 'pached.logits' names no forward step 'pached'"),
    (lambda d: d["steps"]["iia"].update(of=3), "validation: steps.iia.of: a reference names a forward step's read"),
    (lambda d: d["steps"].update(pairs={"kind": "reduce", "reduce": "mean", "of": "counterfactual.v_cf"}),
     "validation: steps.pairs: 'pairs' names both a dataset and a step"),
])
def test_a_bad_reference_is_refused_at_its_path(tmp_path, edit, line):
    """SPEC.md:2521 [SF5] a column of another dataset, an unknown read or step, a name both a dataset and a step."""
    if "other" in line:
        edit = (lambda e: lambda d: (d["data"].update(other={"path": "weekdays/train"}), e(d)))(edit)
    assert _refusal(tmp_path, _edited(edit)).startswith(line)


def _cyclic(d):
    d["steps"]["counterfactual"]["interventions"] = {"writes": {"back": {
        "site": "target", "pos": -1, "mechanism": "swap", "operand": "patched.logits"}}}


@pytest.mark.fast
def test_a_cycle_of_references_is_refused_naming_it(tmp_path):
    """SPEC.md:2527 [SF6] counterfactual -> patched -> counterfactual: one line before any model."""
    line = _refusal(tmp_path, _edited(_cyclic))
    assert line == ("validation: steps.counterfactual.interventions.writes.back.operand: steps counterfactual -> "
                    "patched -> counterfactual name each other in a cycle; a step names only the values of steps "
                    "written before it")


@pytest.mark.fast
def test_a_long_cycle_is_found_without_recursion():
    """SPEC.md:2527 [SF6] 3000 steps in a ring: refused by the iterative search, no RecursionError."""
    n = 3000
    steps = {f"s{k}": {"kind": "reduce", "reduce": "mean", "of": f"s{(k + 1) % n}.x"} for k in range(n)}
    with pytest.raises(Exception) as caught:
        stepsfirst.check_order(steps)
    assert "name each other in a cycle" in str(caught.value) and caught.type.__name__ == "Refusal"


@pytest.mark.fast
def test_a_reference_to_a_later_step_is_refused(tmp_path):
    """SPEC.md:2529 [SF7] steps run in the order written."""
    doc = _edited(lambda d: d.update(steps={"iia": d["steps"].pop("iia"), **d["steps"]}))
    assert _refusal(tmp_path, doc).startswith("validation: steps.iia.of: step 'iia' names step 'patched', which is "
                                              "not written before it")


@pytest.mark.fast
def test_a_reduce_value_puts_its_user_in_a_later_stage():
    """SPEC.md:2531 [SF8] harvest and clean in stage1 (the mean its output), ablated in stage2."""
    plan = stepsfirst.lower(_load(SHIPPED / "mean_ablation.json")).plan
    assert list(plan["steps"]) == ["stage1", "stage2"]
    assert plan["steps"]["stage1"]["outputs"] == {"mean": {"read": "harvest:acts", "reduce": "mean"}}
    assert set(plan["interventions"]["stage1"]["reads"]) == {"harvest:acts", "clean:logits"}
    assert plan["interventions"]["stage2"]["models"] == {"ablated": {"input": "base", "writes": ["ablated:ablate"]}}


@pytest.mark.fast
def test_a_pass_that_needs_its_own_reduce_is_refused(tmp_path):
    """SPEC.md:2531 [SF8] a write of the reduce's value beside a read of the forward it reduces."""
    doc = _load(SHIPPED / "mean_ablation.json")
    doc["steps"]["ablated"]["interventions"]["writes"]["again"] = {
        "site": "head", "pos": -1, "mechanism": "swap", "operand": "harvest.acts"}
    assert _refusal(tmp_path, doc).startswith("validation: steps.ablated.interventions: step 'ablated' swaps in a "
                                              "reduce step's value and, in the same pass")


@pytest.mark.fast
@pytest.mark.parametrize("saves, files", [
    (["iia", "logit_diff"], ["iia.json", "logit_diff.json"]),
    ({"iia": "a/iia.json"}, ["a/iia.json"]),
])
def test_saves_is_a_map_or_a_list_of_steps(saves, files):
    """SPEC.md:2600 [SF9] the reserved steps.saves: {value: file} or [value] (a metric to <value>.json)."""
    plan = stepsfirst.lower(_edited(lambda d: d["steps"].update(saves=saves))).plan
    assert [s["file_path"] for s in plan["steps"]["stage1"]["saves"]] == files


@pytest.mark.fast
@pytest.mark.parametrize("saves, line", [
    ({"patched.logits": "x.safetensors"}, "validation: steps.saves.patched.logits: save 'patched.logits' names no "
                                          "metric, reduce or generate step"),
    ([3], "validation: steps.saves: a save list names steps"),
    ({"ia": "x.json"}, "validation: steps.saves.ia: save 'ia' names no metric, reduce or generate step"),
])
def test_a_save_names_a_step_or_is_refused(tmp_path, saves, line):
    """SPEC.md:2600 [SF9] a read's tensor, a number, an unknown name."""
    assert _refusal(tmp_path, _edited(lambda d: d["steps"].update(saves=saves))).startswith(line)


@pytest.mark.fast
def test_layers_is_an_integer_and_a_site_may_be_written_in_place():
    """SPEC.md:2604 [SF10] "layers": 0 is [0]; the in-place lm_head site is declared as patched:logits."""
    plan = stepsfirst.lower(POS_SWEEP).plan
    assert plan["sites"] == {"target": {"component": "block_output", "layers": [0]},
                             "patched:logits": {"component": "lm_head"}}
    swept = stepsfirst.lower(_edited(lambda d: d["sites"]["target"].update(layers={"sweep": [0, 1]}))).plan
    assert swept["sites"]["target"]["layers"] == {"sweep": [[0], [1]]}


def _generating(**extra):
    return {"model": POS_SWEEP["model"], "data": {"p": {"path": "weekdays/train"}},
            "steps": {"gen": {"kind": "generate", "data": "p", "field": "input", "max_new_tokens": 2,
                              "reads": {"first": {"site": {"component": "logits"},
                                                  "pos": {"frame": "generated", "index": 0}}}, **extra},
                      "saves": ["gen"]}}


@pytest.mark.fast
def test_a_generate_step_decodes_greedily_its_number_of_tokens():
    """SPEC.md:2607 [SF11] max_new_tokens is the intervention's decode; its name saved is its model's ids."""
    plan = stepsfirst.lower(_generating(min_new_tokens=2, do_sample=False)).plan
    assert plan["interventions"]["stage1"]["decode"] == 2
    assert plan["steps"]["stage1"]["saves"] == [{"value": "original.generated", "file_path": "gen.safetensors"}]


@pytest.mark.fast
@pytest.mark.parametrize("extra, line", [
    ({"min_new_tokens": 1}, "validation: steps.gen.min_new_tokens: a decode runs exactly its number of tokens"),
    ({"do_sample": True}, "validation: steps.gen.do_sample: a decode is greedy"),
    ({"max_new_tokens": "2"}, "validation: steps.gen.max_new_tokens: a generate step says how many tokens"),
])
def test_a_generate_step_the_plan_cannot_hold_is_refused(tmp_path, extra, line):
    """SPEC.md:2607 [SF11] sampling, an early stop, a length that is not an integer."""
    assert _refusal(tmp_path, _generating(**extra)).startswith(line)


@pytest.mark.fast
def test_a_forward_beside_a_generate_step_is_refused(tmp_path):
    """SPEC.md:2607 [SF11] one intervention has one decode."""
    doc = _generating()
    doc["steps"] = {"plain": {"kind": "forward", "data": "p", "field": "input",
                              "reads": {"x": {"site": {"component": "logits"}, "pos": -1}}}, **doc["steps"]}
    assert _refusal(tmp_path, doc).startswith("validation: steps.plain.kind: step 'plain' runs in one pass with "
                                              "generate step 'gen'")


@pytest.mark.fast
@pytest.mark.parametrize("edit, line", [
    (lambda d: d["steps"].update(train={"kind": "fit"}), "validation: steps.train.kind: a fit step of the "
                                                        "steps-first format is not read"),
    (lambda d: d["steps"].update(x={"kind": "forwrd"}), "validation: steps.x.kind: a step's kind is one of "
                                                        "['forward', 'generate', 'metric', 'reduce', 'fit'], got "
                                                        "\"forwrd\"; did you mean 'forward'?"),
    (lambda d: d["sites"].update(state={"component": "linear_attention_state", "layers": 0}),
     "validation: sites.state.component: linear_attention_state, the recurrent state a Gated DeltaNet layer"),
    (lambda d: d["steps"].update(x=[1]), "validation: steps.x: a step is an object with a kind, got a list"),
])
def test_what_has_no_plan_shaped_meaning_is_refused_by_name(tmp_path, edit, line):
    """SPEC.md:2610 [SF12] fit steps, an unknown kind, the Gated DeltaNet state."""
    assert _refusal(tmp_path, _edited(edit)).startswith(line)


@pytest.mark.parametrize("name", ["pos_sweep", "mean_ablation"])
def test_explain_of_a_steps_first_document_and_its_twin_agree(tmp_path, name):
    """SPEC.md:2614 [SF13] the same plan, point by point; a point's produced_by too (an unswept document's is
    its own format's digest, SF15)."""
    plans = []
    for doc in (SHIPPED / f"{name}.json", TWINS / f"{name}.json"):
        done = cli("--json", "explain", str(doc), "--data-root", DATA)
        assert done.returncode == 0, done.stderr
        plans.append(json.loads(done.stdout)["plan"])
    digests = [[leaf.pop("produced_by") for leaf in plan if leaf["label"] == ""] for plan in plans]
    assert plans[0] == plans[1] and len(plans[0]) == {"pos_sweep": 3, "mean_ablation": 1}[name]
    assert digests[0] != digests[1] or digests == [[], []]


def test_a_steps_first_run_writes_its_twins_tables(tmp_path, llama):
    """SPEC.md:2614 [SF13] mean_ablation run in both formats: every table equal, value for value."""
    tables = []
    for k, doc in enumerate((stepsfirst.lower(_load(SHIPPED / "mean_ablation.json")).plan,
                             _load(TWINS / "mean_ablation.json"))):
        plan = compiler.compile_document(doc, llama, Path(DATA))
        run.execute(plan, llama, tmp_path / str(k), progress=False)
        tables.append({f: [(r["example_id"], r["value"]) for r in _load(tmp_path / str(k) / f)]
                       for f in ("clean.json", "ablated.json")})
    assert tables[0] == tables[1] and len(tables[0]["clean.json"]) == 4


@pytest.mark.fast
@pytest.mark.parametrize("edit, line", [
    (lambda d: d["steps"]["patched"]["reads"]["logits"].update(pos={"index": -1, "span": [0, 1]}),
     "validation: steps.patched.reads.logits.pos: a position names exactly one of"),
    (lambda d: d["steps"]["patched"]["interventions"]["writes"]["patch"].update(mechanism="swop"),
     "validation: steps.patched.interventions.writes.patch.mechanism:"),
    (lambda d: d["steps"]["iia"].update(metric="mach"), "validation: steps.iia.metric:"),
    (lambda d: d["steps"]["iia"].update(expected="pairs.nothing"), None),
    (lambda d: d["sites"]["target"].update(layers=[0, 1]), "validation: sites.target.layers: layers must be a "
                                                           "one-element band"),
])
def test_a_refusal_of_the_lowered_document_names_the_steps_first_path(tmp_path, edit, line):
    """SPEC.md:2616 [SF14] a read's pos, a write's mechanism, a metric's kind, a site: the steps-first paths."""
    doc = _edited(edit)
    if line is None:  # a column no row has: refused at compile, at the metric's own step
        done = _verb(tmp_path, doc, "validate")
        assert done.returncode == 2 and done.stderr.startswith("compile: steps.iia"), done.stderr
        return
    assert _refusal(tmp_path, doc).startswith(line)


@pytest.mark.fast
def test_produced_by_is_the_document_as_given_without_its_header(tmp_path):
    """SPEC.md:2621 [SF15] sha256 of the raw document without header, keys sorted, compact separators."""
    body = {k: v for k, v in POS_SWEEP.items() if k != "header"}
    want = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert stepsfirst.digest(POS_SWEEP) == want
    assert stepsfirst.digest(dict(POS_SWEEP, header={"description": "other"})) == want


SHIPPED_NAMES = ["hydra_effect", "logit_lens_all", "mean_ablation", "multi_position_patch", "pos_sweep", "readout"]


def test_the_originals_adapted_steps_first_documents_validate(tmp_path):
    """SPEC.md:2630 [SF16] the six shipped adaptations validate (the corpus runs them); top_k's band is refused."""
    assert sorted(p.stem for p in SHIPPED.glob("*.json")) == SHIPPED_NAMES
    for name in SHIPPED_NAMES:
        done = cli("validate", str(SHIPPED / f"{name}.json"), "--data-root", DATA)
        assert done.returncode == 0, (name, done.stderr)
    top_k = _edited(lambda d: d["sites"].update(resid={"component": "block_output", "layers": [0, 1]}))
    top_k["steps"]["patched"]["reads"]["lens"] = {"site": "resid", "pos": -1, "view": "logits"}
    assert "layers must be a one-element band" in _refusal(tmp_path, top_k)
