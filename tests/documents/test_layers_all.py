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
    """SPEC.md:106 [D37] layers [0, 1] is one address over two layers: refused by name, as L2."""
    doc = _all()
    doc["sites"]["resid"]["layers"] = [0, 1]
    with pytest.raises(Refusal, match="a band spanning several layers is one address and is not implemented"):
        validate.points_of(doc)


def test_a_read_only_all_document_runs_one_forward():
    """SPEC.md:1742 [Q32] every point's forward is one computation, marked shared by all of them (Q5)."""
    doc = _all()
    points = validate.points_of(doc)
    _engine, plan = loading.compiled(points[0].document.model,
                                     lambda e: compiler.compile_document(doc, e, DATA, points))
    forwards = [f for leaf in plan.leaves() for step in leaf.steps for f in step.forwards]
    assert len(forwards) == 2 and forwards[0].computation and {f.computation for f in forwards} == {
        forwards[0].computation}
    assert forwards[0].shared == ("layers=0/score", "layers=1/score")
