"""`layers: "all"` (sweeps.with_layers): one point per layer of the model, lowered at compile once the layer
count is known, validated before that as a one-layer stand-in; its refusals; one forward serves every point."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from causalab_ref.documents import validate
from causalab_ref.engines import loading
from causalab_ref.runs import compile as compiler
from causalab_ref.shapes import Refusal
from tests.conftest import Delegate
from tests.inprocess import cli

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
SWEEP = json.loads((ROOT / "documents" / "layer_sweep.json").read_text(encoding="utf-8"))


def _all(**site) -> dict:
    doc = copy.deepcopy(SWEEP)
    doc["sites"]["resid"] = {"component": "block_output", "layers": "all", **site}
    return doc


def _explain(tmp_path: Path, doc: dict):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return cli("--json", "explain", str(path), "--data-root", str(DATA))


def test_all_is_one_plan_whose_steps_are_the_layer_sweeps_points(tmp_path):
    """SPEC.md:89 [D34] the plan of layers "all" on the 2-layer fixture is one plan (no point folders): the
    explicit sweep's steps, layer by layer, each carrying its layer, its produced_by the document's own."""
    swept, every = _explain(tmp_path, SWEEP), _explain(tmp_path, _all())
    assert swept.returncode == every.returncode == 0, every.stderr
    assert json.loads(swept.stdout)["steps"] == ["layers=0", "layers=1"]
    leaves = json.loads(every.stdout)["plan"]
    assert [leaf["label"] for leaf in leaves] == [""]
    assert [(s["name"], s["layer"]) for s in leaves[0]["steps"]] == [("score", 0), ("score", 1)]
    for layer, point in enumerate(json.loads(swept.stdout)["plan"]):
        step = {k: v for k, v in leaves[0]["steps"][layer].items() if k != "layer"}
        assert step == point["steps"][0]


@pytest.mark.fast
@pytest.mark.parametrize("count", [1, 2, 48])
def test_all_is_one_point_per_layer_of_the_model(count):
    """SPEC.md:108 [D35] lowered with the model's count: 1 layer is one point, 48 layers 48, in order."""
    points = validate.points_of(_all(), layers=count)
    assert [p.label for p in points] == [f"layers={k}" for k in range(count)]
    assert [p.document.sites[0][1].layers for p in points] == [(k,) for k in range(count)]


@pytest.mark.fast
def test_before_compile_the_document_is_checked_as_one_layer():
    """SPEC.md:108 [D35] with no layer count yet, one stand-in point, and a refusal elsewhere comes first."""
    assert [p.label for p in validate.points_of(_all())] == ["layers=0"]
    bad = _all()
    bad["interventions"]["lens"]["reads"]["lens"]["pos"] = {"index": -1, "last": 2}
    with pytest.raises(Refusal, match="a position names exactly one of"):
        validate.points_of(bad)


def test_compile_lowers_all_with_the_engines_layer_count():
    """SPEC.md:108 [D35] compile asks the engine its num_layers: an engine that says 1 gives one point."""
    doc = _all()
    points = validate.points_of(doc)

    class OneLayer(Delegate):
        num_layers = property(lambda self: 1)
    engine, plan = loading.compiled(points[0].document.model,
                                    lambda e: compiler.compile_document(doc, OneLayer(e), DATA, points))
    assert [leaf.label for leaf in plan.leaves()] == [""]
    assert [(step.name, step.layer) for step in plan.leaves()[0].steps] == [("score", 0)]


def test_the_plans_coordinates_are_the_points_the_run_writes():
    """SPEC.md:89 [D34] SPEC.md:2709 [PY9] a plan's coordinates are those of the points the run writes: layers
    "all" alone is one point with none; beside a pos sweep, each pos point with its pos alone (no layer)."""
    alone, beside = _all(), _all()
    beside["interventions"]["lens"]["reads"]["lens"]["pos"] = {"sweep": [-1, -2]}
    for doc, want in ((alone, {"": {}}), (beside, {"pos=-1": {"pos": -1}, "pos=-2": {"pos": -2}})):
        _engine, plan = loading.compiled(validate.points_of(doc)[0].document.model,
                                         lambda e: compiler.compile_document(doc, e, DATA))
        assert plan.coordinates == want
        assert [leaf.label for leaf in plan.leaves()] == [label for label in want]


@pytest.mark.fast
@pytest.mark.parametrize("doc, path, words", [
    (_all(component="lm_head"), "sites.resid", "lm_head"),
    ({**_all(), "sites": {"resid": {"component": "block_output", "layers": {"sweep": ["all", [0]]}}}},
     "sites.resid.layers", 'layers "all" is not a sweep value'),
    ({**_all(), "sites": {"resid": {"component": "block_output", "layers": "ALL"}}}, "sites.resid.layers",
     "layers is a one-element list"),
    ({**_all(), "sites": {"resid": {"component": "block_output", "layers": ["all"]}}}, "sites.resid.layers.0",
     "expected an integer"),
])
def test_a_bad_all_is_refused_at_validation(doc, path, words):
    """SPEC.md:114 [D36] a whole-model component, all as a sweep value, another spelling of all."""
    with pytest.raises(Refusal) as caught:
        validate.points_of(doc)
    assert caught.value.stage == "validation" and caught.value.path.startswith(path)
    assert words in caught.value.message


@pytest.mark.fast
def test_all_beside_another_sweep_on_the_layers_axis_is_refused():
    """SPEC.md:114 [D36] the axis layers is all's; a second sweep on it is refused naming it."""
    doc = _all()
    doc["sites"]["other"] = {"component": "block_output", "layers": {"sweep": [[0], [1]]}}
    with pytest.raises(Refusal, match="which sweeps the axis 'layers' itself") as caught:
        validate.points_of(doc)
    assert caught.value.path == "sites.other.layers"


@pytest.mark.fast
def test_the_sweep_bound_counts_the_layers():
    """SPEC.md:114 [D36] 48 layers x a 300-point sweep is past the 10,000-point bound."""
    doc = _all()
    doc["interventions"]["lens"]["reads"]["lens"]["pos"] = {"sweep": {"range": [-300, 0]}}
    with pytest.raises(Refusal, match="points; a sweep has at most 10000 points"):
        validate.points_of(doc, layers=48)


@pytest.mark.fast
def test_a_band_of_named_layers_stays_refused():
    """SPEC.md:125 [D37] layers [0, 1] is one address over two layers: refused by name, as L2."""
    doc = _all()
    doc["sites"]["resid"]["layers"] = [0, 1]
    with pytest.raises(Refusal, match="a band spanning several layers is one address and is not implemented"):
        validate.points_of(doc)


def test_a_read_only_all_document_runs_one_forward():
    """SPEC.md:1811 [Q32] every point's forward is one computation, marked shared by all of them (Q5)."""
    doc = _all()
    points = validate.points_of(doc)
    _engine, plan = loading.compiled(points[0].document.model,
                                     lambda e: compiler.compile_document(doc, e, DATA, points))
    forwards = [f for leaf in plan.leaves() for step in leaf.steps for f in step.forwards]
    assert len(forwards) == 2 and forwards[0].computation and {f.computation for f in forwards} == {
        forwards[0].computation}
    assert forwards[0].shared == ("score@layer=0", "score@layer=1")


def _exported_with_layers(tmp_path: Path, field: str, count) -> str:
    """A path-key document (documents/layer_sweep.json with layers "all") on an exported tiny-llama whose
    config.json says `count` layers under `field`."""
    import shutil
    from tests import fuzz_surfaces
    folder = tmp_path / "exp" / "tiny-llama"
    shutil.copytree(fuzz_surfaces.fixtures_folder(tmp_path) / "tiny-llama", folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if field.startswith("text_config."):
        config["text_config"] = {field.split(".", 1)[1]: count}
    else:
        config[field] = count
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    doc = _all()
    doc["model"]["key"] = str(folder)
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("field, count, shown", [
    ("num_hidden_layers", 10 ** 9, "1000000000"), ("num_hidden_layers", 10_001, "10001"),
    ("num_hidden_layers", 0, "0"), ("num_hidden_layers", -1, "-1"), ("num_hidden_layers", 2.0, "a number"),
    ("num_hidden_layers", True, "a boolean"), ("num_hidden_layers", 10 ** 30, "an integer of 31 digits"),
    ("text_config.num_hidden_layers", 10 ** 9, "1000000000"),
])
def test_a_config_layer_count_out_of_bounds_is_refused_before_anything_is_built(tmp_path, field, count, shown):
    """SPEC.md:114 [D36] a path key whose config.json says 10^9 or 10,001 layers (validate ran past 120 s: the
    meta load built every layer before any bound) or 0 or -1 (an internal IndexError inside nnterp's renaming
    check) is one refusal at model.key naming the field and the count, at once (issue 38)."""
    import time
    started = time.perf_counter()
    done = cli("validate", _exported_with_layers(tmp_path, field, count), "--data-root", str(DATA))
    text = done.stderr.strip()
    assert done.returncode == 2 and len(text.splitlines()) == 1 and "internal error" not in text, text
    assert text.startswith("compile: model.key: model '") and text.endswith(
        f"config.json's `{field}` is {shown}; a model has from 1 to 1,000 layers"), text
    assert time.perf_counter() - started < 60


LENS_ALL = ROOT / "documents" / "steps_first" / "logit_lens_all.json"


def _run(tmp_path: Path, doc, name: str) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    out = tmp_path / name
    done = cli("run", str(path), "--data-root", str(DATA), "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    return out


def _rows(folder: Path, table: str) -> list:
    return json.loads((folder / table).read_text(encoding="utf-8"))


def test_the_originals_logit_lens_all_writes_one_table_per_metric_with_a_layer_on_every_row(tmp_path):
    """SPEC.md:89 [D34] the original's logit_lens_all.json (adapted): one p_answer.json and one top1.json, 8 rows
    each on the 2-layer fixture, ordered (layer, example) with `layer` right after `metric` (its test_lens.py:
    `[(row["layer"], row["example_id"])] == [(layer, str(row)) for layer in (0, 1) for row in range(4)]`), no
    folder per layer; each layer's rows are the explicit layer sweep's point, value for value (the original's
    "the same lens, to the bit"); produced_by is the steps-first document's own digest (SF15)."""
    from causalab_ref.documents import stepsfirst
    raw = json.loads(LENS_ALL.read_text(encoding="utf-8"))
    every = _run(tmp_path, raw, "every")
    assert sorted(p.name for p in every.iterdir()) == ["document.json", "p_answer.json", "run.json", "top1.json"]
    swept = _run(tmp_path, SWEEP, "swept")
    for table in ("p_answer.json", "top1.json"):
        rows = _rows(every, table)
        assert [(r["layer"], r["example_id"]) for r in rows] == [(layer, str(e)) for layer in (0, 1) for e in range(4)]
        assert all(list(r)[:3] == ["example_id", "metric", "layer"] for r in rows)
        assert {r["produced_by"] for r in rows} == {stepsfirst.digest(raw)}
        for layer in (0, 1):
            point = _rows(swept / f"layers={layer}", table)
            assert [r["value"] for r in rows[4 * layer:4 * layer + 4]] == [r["value"] for r in point]


def test_a_metric_of_a_read_at_one_layer_in_an_all_document_is_one_table_of_its_rows(tmp_path):
    """SPEC.md:89 [D34] only a metric of a read at an "all" site has a layer axis: a metric of the head in the
    same document is written once, a row per example, with no `layer`."""
    doc = _all()
    iv = doc["interventions"]["lens"]
    doc["sites"]["head"] = {"component": "lm_head"}
    iv["reads"]["head"] = {"site": "head", "pos": -1, "input": "base"}
    iv["metrics"]["p_head"] = {"kind": "token_prob", "of": "head", "token": "base_answer"}
    doc["steps"]["score"]["saves"].append({"value": "p_head", "file_path": "p_head.json"})
    out = _run(tmp_path, doc, "mixed")
    head = _rows(out, "p_head.json")
    assert [r["example_id"] for r in head] == ["0", "1", "2", "3"] and all("layer" not in r for r in head)
    assert [r["layer"] for r in _rows(out, "p_answer.json")] == [0] * 4 + [1] * 4


def test_all_beside_another_sweep_is_a_folder_per_point_of_that_sweep_each_table_by_layer(tmp_path):
    """SPEC.md:89 [D34] a sweep over layers stays what {"sweep": ...} is for: with a pos sweep beside "all", a
    folder per pos point, each holding one table of a row per (layer, example), its coordinates that sweep's
    alone; SPEC.md:2709 [PY9] run.json lists them, the layer a column of the rows and no coordinate."""
    doc = _all()
    doc["interventions"]["lens"]["reads"]["lens"]["pos"] = {"sweep": [-1, -2]}
    out = _run(tmp_path, doc, "both")
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["pos=-1", "pos=-2"]
    for point in ("pos=-1", "pos=-2"):
        assert [r["layer"] for r in _rows(out / point, "top1.json")] == [0] * 4 + [1] * 4
    assert json.loads((out / "run.json").read_text(encoding="utf-8"))["points"] == [
        {"label": "pos=-1", "coordinates": {"pos": -1}, "folder": "pos=-1"},
        {"label": "pos=-2", "coordinates": {"pos": -2}, "folder": "pos=-2"}]


@pytest.mark.fast
@pytest.mark.parametrize("edit, path, words", [
    (lambda iv, doc: iv["writes"].update(zero={"site": "resid", "pos": -1, "mechanism": "swap", "operand": 0.0}),
     "interventions.lens.writes.zero.site", "a write at every layer is as many experiments"),
    (lambda iv, doc: iv["reads"].update(rot={"site": "resid", "pos": -1, "input": "base", "featurizer": "rot"})
     or doc.update(featurizers={"rot": {"kind": "subspace", "k": 4}}), "featurizers.rot",
     "a featurizer is one parameter set"),
    (lambda iv, doc: doc["steps"]["score"].update(outputs={"kept": {"read": "lens"}}),
     "steps.score.outputs.kept", "a read at every layer; score it with a metric"),
    (lambda iv, doc: (doc["sites"].update(one={"component": "block_output", "layers": [0]}),
                      iv["reads"].update(raw={"site": "resid", "pos": -1, "input": "base"}),
                      iv["writes"].update(w={"site": "one", "pos": -1, "mechanism": "swap", "operand": "raw"})),
     "interventions.lens.writes.w.operand", "an operand is one value at one layer"),
], ids=["a write", "a featurizer", "an output", "an operand"])
def test_what_a_read_at_every_layer_may_not_be(edit, path, words):
    """SPEC.md:89 [D34] (the original's test_lens.py: a write at every layer is as many experiments, a read at
    every layer takes no featurizer, a reduction or an operand of it is refused): each is one refusal at
    validation at its path, naming the sweep that writes one experiment per layer."""
    doc = _all()
    iv = doc["interventions"]["lens"]
    iv.setdefault("writes", {})
    edit(iv, doc)
    if not iv["writes"]:
        del iv["writes"]
    with pytest.raises(Refusal) as caught:
        validate.points_of(doc)
    assert (caught.value.stage, caught.value.path) == ("validation", path), caught.value.message
    assert words in caught.value.message and '{"sweep": [[0], [1], ...]}' in caught.value.message


@pytest.mark.fast
def test_the_explain_case_of_all_is_the_layer_sweep_case_step_for_step():
    """SPEC.md:89 [D34] the corpus's explain_layers_all rests on an identity: its one leaf's steps are
    explain_layer_sweep_logits_view's points' steps in layer order, each with its `layer`, and its produced_by
    is the document's own digest (D19)."""
    from causalab_ref.documents import reader
    corpus = ROOT / "causalab_ref" / "conformance" / "corpus"
    every = json.loads((corpus / "explain_layers_all.json").read_text(encoding="utf-8"))
    swept = json.loads((corpus / "explain_layer_sweep_logits_view.json").read_text(encoding="utf-8"))
    (leaf,) = every["expect"]["plan"]
    assert leaf["label"] == "" and leaf["produced_by"] == reader.digest(every["document"])
    points = swept["expect"]["plan"]
    assert [p["label"] for p in points] == [f"layers={k}" for k in range(len(leaf["steps"]))]
    for layer, (step, point) in enumerate(zip(leaf["steps"], points)):
        assert step.pop("layer") == layer and [step] == point["steps"]


def test_plot_ticks_a_table_by_layer_with_each_rows_layer(tmp_path):
    """SPEC.md:2461 [FG4] a table of rows by layer is drawn a bar per row ticked `<layer>/<example_id>`."""
    from causalab_ref.figures import plot
    out = _run(tmp_path, _all(), "every")
    bars = [p for p in plot.panels(out) if p.title.startswith("top1.json")]
    assert bars[0].xticks == tuple(f"{layer}/{e}" for layer in (0, 1) for e in range(4))
