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


def test_all_is_the_layer_sweep_point_for_point(tmp_path):
    """SPEC.md:89 [D34] the plan of layers "all" on the 2-layer fixture is the explicit sweep's: labels
    layers=0, layers=1 in layer order, each point's produced_by the same."""
    swept, every = _explain(tmp_path, SWEEP), _explain(tmp_path, _all())
    assert swept.returncode == every.returncode == 0, every.stderr
    assert json.loads(every.stdout)["steps"] == ["layers=0", "layers=1"]
    assert json.loads(every.stdout)["plan"] == json.loads(swept.stdout)["plan"]


@pytest.mark.fast
@pytest.mark.parametrize("count", [1, 2, 48])
def test_all_is_one_point_per_layer_of_the_model(count):
    """SPEC.md:96 [D35] lowered with the model's count: 1 layer is one point, 48 layers 48, in order."""
    points = validate.points_of(_all(), layers=count)
    assert [p.label for p in points] == [f"layers={k}" for k in range(count)]
    assert [p.document.sites[0][1].layers for p in points] == [(k,) for k in range(count)]


@pytest.mark.fast
def test_before_compile_the_document_is_checked_as_one_layer():
    """SPEC.md:96 [D35] with no layer count yet, one stand-in point, and a refusal elsewhere comes first."""
    assert [p.label for p in validate.points_of(_all())] == ["layers=0"]
    bad = _all()
    bad["interventions"]["lens"]["reads"]["lens"]["pos"] = {"index": -1, "last": 2}
    with pytest.raises(Refusal, match="a position names exactly one of"):
        validate.points_of(bad)


def test_compile_lowers_all_with_the_engines_layer_count():
    """SPEC.md:96 [D35] compile asks the engine its num_layers: an engine that says 1 gives one point."""
    doc = _all()
    points = validate.points_of(doc)

    class OneLayer(Delegate):
        num_layers = property(lambda self: 1)
    engine, plan = loading.compiled(points[0].document.model,
                                    lambda e: compiler.compile_document(doc, OneLayer(e), DATA, points))
    assert [leaf.label for leaf in plan.leaves()] == ["layers=0"]


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
    """SPEC.md:102 [D36] a whole-model component, all as a sweep value, another spelling of all."""
    with pytest.raises(Refusal) as caught:
        validate.points_of(doc)
    assert caught.value.stage == "validation" and caught.value.path.startswith(path)
    assert words in caught.value.message


@pytest.mark.fast
def test_all_beside_another_sweep_on_the_layers_axis_is_refused():
    """SPEC.md:102 [D36] the axis layers is all's; a second sweep on it is refused naming it."""
    doc = _all()
    doc["sites"]["other"] = {"component": "block_output", "layers": {"sweep": [[0], [1]]}}
    with pytest.raises(Refusal, match="which sweeps the axis 'layers' itself") as caught:
        validate.points_of(doc)
    assert caught.value.path == "sites.other.layers"


@pytest.mark.fast
def test_the_sweep_bound_counts_the_layers():
    """SPEC.md:102 [D36] 48 layers x a 300-point sweep is past the 10,000-point bound."""
    doc = _all()
    doc["interventions"]["lens"]["reads"]["lens"]["pos"] = {"sweep": {"range": [-300, 0]}}
    with pytest.raises(Refusal, match="points; a sweep has at most 10000 points"):
        validate.points_of(doc, layers=48)


@pytest.mark.fast
def test_a_band_of_named_layers_stays_refused():
    """SPEC.md:113 [D37] layers [0, 1] is one address over two layers: refused by name, as L2."""
    doc = _all()
    doc["sites"]["resid"]["layers"] = [0, 1]
    with pytest.raises(Refusal, match="a band spanning several layers is one address and is not implemented"):
        validate.points_of(doc)


def test_a_read_only_all_document_runs_one_forward():
    """SPEC.md:1678 [Q32] every point's forward is one computation, marked shared by all of them (Q5)."""
    doc = _all()
    points = validate.points_of(doc)
    _engine, plan = loading.compiled(points[0].document.model,
                                     lambda e: compiler.compile_document(doc, e, DATA, points))
    forwards = [f for leaf in plan.leaves() for step in leaf.steps for f in step.forwards]
    assert len(forwards) == 2 and forwards[0].computation and {f.computation for f in forwards} == {
        forwards[0].computation}
    assert forwards[0].shared == ("layers=0/score", "layers=1/score")


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
    """SPEC.md:102 [D36] a path key whose config.json says 10^9 or 10,001 layers (validate ran past 120 s: the
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
