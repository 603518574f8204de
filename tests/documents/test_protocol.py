"""The protocol format (protocol.py): told apart by shape, lowered to the plan-shaped pipeline, its
subset's refusals by name, its digest rule, and the protocol twin of patching.json."""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from causalab_ref import cli
from causalab_ref.documents import protocol

ROOT = Path(__file__).resolve().parents[2]
DATA = str(ROOT / "documents" / "data")
TWIN = json.loads((ROOT / "documents" / "minimal_protocol.json").read_text(encoding="utf-8"))
PATCHING = json.loads((ROOT / "documents" / "patching.json").read_text(encoding="utf-8"))


def _verb(tmp_path: Path, capsys, doc, *verb: str, after: tuple = ()) -> tuple[int, str, str]:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    status = cli.main([*verb, str(path), "--data-root", DATA, *after])
    captured = capsys.readouterr()
    return status, captured.out, captured.err.strip()


def _refusal(tmp_path, capsys, doc) -> str:
    status, _out, err = _verb(tmp_path, capsys, doc, "validate")
    assert status == 2, err
    return err


def _twin(edit) -> dict:
    doc = copy.deepcopy(TWIN)
    edit(doc)
    return doc


def test_the_format_is_told_apart_by_its_top_level():
    """SPEC.md:1599 [PR1] method (or data without steps) is protocol, data beside steps is steps-first."""
    assert protocol.format_of(TWIN) == "protocol"
    assert protocol.format_of(PATCHING) == "plan-shaped"
    assert protocol.format_of({"data": {}, "steps": {}}) == "steps-first"
    assert protocol.format_of({"header": {}, "data": {}}) == "protocol"
    assert protocol.format_of({"model": {}, "roles": {}}) == "plan-shaped"


def test_validate_says_valid_protocol_document(tmp_path, capsys):
    """SPEC.md:1646 [PR16] validate names the format; --json says format protocol."""
    status, out, _err = _verb(tmp_path, capsys, TWIN, "validate")
    assert status == 0 and out.strip() == f"ok: {tmp_path / 'doc.json'} is a valid protocol document, 1 step"
    status, out, _err = _verb(tmp_path, capsys, TWIN, "--json", "validate")
    assert status == 0 and json.loads(out)["format"] == "protocol"


def test_a_steps_first_document_goes_to_the_steps_first_reader(tmp_path, capsys):
    """SPEC.md:1604 [PR2] top-level data beside forward/metric steps: read as steps-first (here refused for a
    protocol-shaped data entry, by the steps-first reader), never as an unknown key `data`."""
    doc = {"model": TWIN["model"], "data": {"base": {"dataset": "weekdays/train", "field": "input"}},
           "steps": {"patched": {"kind": "forward"}, "score": {"kind": "metric"}}}
    line = _refusal(tmp_path, capsys, doc)
    assert line.startswith("validation: data.base.dataset: unknown key 'dataset'; allowed here: ['path']")


@pytest.mark.parametrize("edit, line", [
    (lambda d: d.update(extra=1), "validation: extra: unknown key 'extra'; allowed here: ['data', 'header', "
                                  "'method', 'model']"),
    (lambda d: d.update(axes={}), "validation: axes: axes (the protocol's sweep sugar) is not read by"),
    (lambda d: d["header"].update(protocol_version="2"), "validation: header.protocol_version: protocol_version "
                                                          "\"2\" is not \"3\""),
    (lambda d: d["header"].update(author="x"), "validation: header.author: unknown key 'author'"),
])
def test_the_top_level_and_header_are_checked_by_name(tmp_path, capsys, edit, line):
    """SPEC.md:1607 [PR3] exactly header, model, data, method; protocol_version "3"; axes refused by name."""
    assert _refusal(tmp_path, capsys, _twin(edit)).startswith(line)


def test_the_model_block_takes_key_revision_and_dtype_only(tmp_path, capsys):
    """SPEC.md:1611 [PR4] attn_implementation is refused by name, pointing at the plan-shaped model block."""
    line = _refusal(tmp_path, capsys, _twin(lambda d: d["model"].update(attn_implementation="eager")))
    assert line.startswith("validation: model.attn_implementation: the protocol format's model block takes key, "
                           "revision and dtype and rejects anything else")


def test_data_roles_become_roles_and_the_steps_rows():
    """SPEC.md:1614 [PR5] SPEC.md:1637 [PR13] the data block lowers to roles and one observe step's rows."""
    plan, _digest = protocol.lower(TWIN)
    assert plan["roles"] == PATCHING["roles"]
    step = plan["steps"]["observe"]
    assert step["rows"] == PATCHING["steps"]["score"]["rows"] and step["interventions"] == "method"
    assert plan["interventions"]["method"]["models"] == PATCHING["interventions"]["patching"]["models"]


@pytest.mark.parametrize("section", ["segments", "positions", "params", "code", "path_patching", "at_once",
                                     "featurizers", "train"])
def test_sections_outside_the_subset_are_refused_by_name(tmp_path, capsys, section):
    """SPEC.md:1617 [PR6] every method section the reader does not implement is refused by its name."""
    line = _refusal(tmp_path, capsys, _twin(lambda d: d["method"].update({section: {}})))
    assert line.startswith(f"validation: method.{section}: ") and "unknown key" not in line
    assert section.replace("_", " ") in line.replace("_", " ")


@pytest.mark.parametrize("edit, line", [
    (lambda d: d["method"]["sites"]["head"].update(layers=[0]), "method.sites.head.layers: lm_head takes no layers"),
    (lambda d: d["method"]["sites"]["target"].pop("layers"), "method.sites.target: block_output is addressed at "
                                                             "one layer"),
    (lambda d: d["method"]["sites"]["target"].update(layers=[0, 1]), "method.sites.target.layers: site 'target': "
                                                                     "layers must be a one-element band"),
    (lambda d: d["method"]["sites"]["target"].update(heads=[0]), "method.sites.target.heads: unknown key 'heads'"),
])
def test_sites_are_checked_both_ways(tmp_path, capsys, edit, line):
    """SPEC.md:1621 [PR7] lm_head takes no layers, block_output is addressed at one layer; no heads or units."""
    assert _refusal(tmp_path, capsys, _twin(edit)).startswith("validation: " + line)


@pytest.mark.parametrize("edit, line", [
    (lambda d: d["method"]["reads"]["v_cf"].update(pos={"span": [-2, -1]}),
     "method.reads.v_cf.pos: a protocol position is an integer or {\"index\": i}"),
    (lambda d: d["method"]["reads"]["v_cf"].pop("model"), "method.reads.v_cf.model: required field is missing"),
    (lambda d: d["method"]["reads"]["v_cf"].update(featurizer="rot"),
     "method.reads.v_cf.featurizer: featurizers in a protocol document are not implemented"),
])
def test_reads_take_the_subsets_fields(tmp_path, capsys, edit, line):
    """SPEC.md:1627 [PR8] a read's model is required, its pos an integer or {"index": i}, its featurizer identity."""
    assert _refusal(tmp_path, capsys, _twin(edit)).startswith("validation: " + line)


@pytest.mark.parametrize("edit, line", [
    (lambda d: d["method"]["writes"]["patch"].update(do={"lerp": "v_cf"}),
     "method.writes.patch.do.lerp: mechanism 'lerp' is not implemented by causalab_ref's protocol reader"),
    (lambda d: d["method"]["writes"]["patch"].update(do={"swap": "nope"}),
     "method.writes.patch.do.swap: the operand of swap is a read name of this method, got \"nope\""),
])
def test_a_write_does_swap_of_a_read(tmp_path, capsys, edit, line):
    """SPEC.md:1629 [PR9] the mechanism is a key of `do`, only swap, and its operand a read name."""
    assert _refusal(tmp_path, capsys, _twin(edit)).startswith("validation: " + line)


def test_a_write_is_lowered_to_mechanism_and_operand():
    """SPEC.md:1629 [PR9] do: {swap: v_cf} is the plan-shaped mechanism swap with operand v_cf."""
    plan, _digest = protocol.lower(TWIN)
    assert plan["interventions"]["method"]["writes"] == PATCHING["interventions"]["patching"]["writes"]


def test_every_write_is_in_a_model_once_per_place(tmp_path, capsys):
    """SPEC.md:1632 [PR10] a write in no intervened model, and two writes at one place of a model, are refused."""
    alone = _twin(lambda d: d["method"]["intervened_models"]["patched"].update(writes=[]))
    assert _refusal(tmp_path, capsys, alone).startswith("validation: method.writes.patch: write 'patch' is in no "
                                                        "intervened model")

    def twice(d):
        d["method"]["writes"]["again"] = dict(d["method"]["writes"]["patch"])
        d["method"]["intervened_models"]["patched"]["writes"] = ["patch", "again"]
    assert _refusal(tmp_path, capsys, _twin(twice)).startswith(
        "validation: method.intervened_models.patched.writes: model 'patched' has two writes at one site")


def test_metrics_need_token_form_and_a_save(tmp_path, capsys):
    """SPEC.md:1634 [PR11] a metric without token_form, and a metric never saved, are refused."""
    line = _refusal(tmp_path, capsys, _twin(lambda d: d["method"]["metrics"]["iia"].pop("token_form")))
    assert line == "validation: method.metrics.iia.token_form: required field is missing"
    line = _refusal(tmp_path, capsys, _twin(lambda d: d["method"]["save"].pop(0)))
    assert line == "validation: method.save: metrics ['iia'] are never saved; every metric of a protocol document " \
                   "is saved"


def test_a_save_restates_its_metrics_binding(tmp_path, capsys):
    """SPEC.md:1635 [PR12] a save whose model or input is not its metric's read's is refused."""
    line = _refusal(tmp_path, capsys, _twin(lambda d: d["method"]["save"][0].update(model="original")))
    assert line.startswith("validation: method.save.0: save 'iia' says model 'original' on 'base', and its metric "
                           "reads 'logits' in model 'patched' on 'base'")


def test_the_twin_compiles_to_patchings_plan(tmp_path, capsys):
    """SPEC.md:1640 [PR14] the same forwards, taps, addresses and positions; only names and the digest differ."""
    plans = []
    for doc in (TWIN, PATCHING):
        status, out, err = _verb(tmp_path, capsys, doc, "--json", "explain")
        assert status == 0, err
        plans.append(json.loads(out)["plan"])
    for leaf in plans:
        for step in leaf[0]["steps"]:
            step.pop("name"), step.pop("intervention")
        leaf[0].pop("produced_by")
    assert plans[0] == plans[1]


def test_the_twin_runs_to_patchings_tables_value_for_value(tmp_path, capsys):
    """SPEC.md:1640 [PR14] SPEC.md:1643 [PR15] SPEC.md:1646 [PR16] the same tables but produced_by, which is the
    protocol digest (header reduced to protocol_version); document.json is the document as given."""
    outs = {}
    for name, doc in (("twin", TWIN), ("plan", PATCHING)):
        status, _out, err = _verb(tmp_path, capsys, doc, "run", after=("--quiet", "--out", str(tmp_path / name)))
        assert status == 0, err
        outs[name] = tmp_path / name
    body = dict(TWIN, header={"protocol_version": "3"})
    expected = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    for table in ("iia.json", "logit_diff.json"):
        twin = json.loads((outs["twin"] / table).read_text(encoding="utf-8"))
        plan = json.loads((outs["plan"] / table).read_text(encoding="utf-8"))
        assert {r.pop("produced_by") for r in twin} == {expected}
        assert {r.pop("produced_by") for r in plan} != {expected}
        assert twin == plan
    assert json.loads((outs["twin"] / "document.json").read_text(encoding="utf-8")) == TWIN


def test_the_protocol_digest_ignores_the_title_and_description():
    """SPEC.md:1643 [PR15] only protocol_version of the header enters the digest."""
    retitled = _twin(lambda d: d["header"].update(title="another title", description="and words"))
    assert protocol.digest(retitled) == protocol.digest(TWIN)
    moved = _twin(lambda d: d["method"]["reads"]["v_cf"].update(pos=-2))
    assert protocol.digest(moved) != protocol.digest(TWIN)


@pytest.mark.parametrize("edit, line", [
    (lambda d: d["method"]["sites"]["target"].update(layers=[5]),
     "compile: method.sites.target: site 'target': layer 5 is outside the model's 2 layers"),
    (lambda d: d["method"]["reads"]["v_cf"].update(model="ghost"),
     "validation: method.reads.v_cf.model: interventions.method: read 'v_cf': model 'ghost' is neither"),
    (lambda d: d["data"]["base"].update(dataset="weekdays/nope"),
     "compile: data.base.dataset: dataset ref 'weekdays/nope'"),
])
def test_refusals_of_the_lowered_document_name_protocol_paths(tmp_path, capsys, edit, line):
    """SPEC.md:1648 [PR17] a plan-shaped refusal of the lowered document is re-pathed to the protocol's path."""
    assert _refusal(tmp_path, capsys, _twin(edit)).startswith(line)


@pytest.mark.parametrize("edit", [
    lambda d: d["method"]["metrics"]["iia"].update(kind=["match"]),
    lambda d: d["method"]["save"][0].update(value={"x": 1}),
    lambda d: d["method"]["metrics"]["iia"].update(of=[1]),
    lambda d: d["method"]["intervened_models"]["patched"].update(writes=[{"a": 1}]),
    lambda d: d["method"]["writes"]["patch"].update(do={"swap": ["v_cf"]}),
    lambda d: d.update(method=[1]),
    lambda d: d["data"].update(base="weekdays/train"),
    lambda d: d["method"]["writes"]["patch"].update(site={"patched": 1}),  # bench/fuzz.py case 8694
    lambda d: d["method"]["writes"]["patch"].update(pos={"index": [1]}),
])
def test_hostile_values_are_one_refusal_line(tmp_path, capsys, edit):
    """SPEC.md:1607 [PR3] whatever a protocol document holds, validate ends in one refusal line, never a traceback."""
    line = _refusal(tmp_path, capsys, _twin(edit))
    assert "\n" not in line and line.split(": ", 1)[0] in ("validation", "compile")


def test_a_swept_write_position_runs_one_point_per_value(tmp_path, capsys):
    """SPEC.md:1653 [PR18] document-format §11 — the write's `pos` swept over -1, -2, -3 runs three points
    labelled pos=-1, pos=-2, pos=-3, and the pos=-1 point's table is the unswept document's, value for value."""
    swept = _twin(lambda d: d["method"]["writes"]["patch"].update(pos={"sweep": [-1, -2, -3]}))
    status, _out, err = _verb(tmp_path, capsys, swept, "run", after=("--out", str(tmp_path / "swept"), "--quiet"))
    assert status == 0, err
    assert sorted(p.name for p in (tmp_path / "swept").iterdir() if p.is_dir()) == ["pos=-1", "pos=-2", "pos=-3"]
    status, _out, err = _verb(tmp_path, capsys, TWIN, "run", after=("--out", str(tmp_path / "plain"), "--quiet"))
    assert status == 0, err
    tables = sorted(p.relative_to(tmp_path / "plain") for p in (tmp_path / "plain").rglob("*.json")
                    if p.name not in ("document.json", "run.json"))
    assert tables
    for table in tables:
        swept_rows = json.loads((tmp_path / "swept" / "pos=-1" / table).read_text(encoding="utf-8"))
        plain_rows = json.loads((tmp_path / "plain" / table).read_text(encoding="utf-8"))
        assert [r["value"] for r in swept_rows] == [r["value"] for r in plain_rows]


def test_a_swept_position_that_is_not_a_protocol_position_is_refused_at_its_value(tmp_path, capsys):
    """SPEC.md:1653 [PR18] a value inside the wrapper that is not a protocol position is refused at its path."""
    swept = _twin(lambda d: d["method"]["writes"]["patch"].update(pos={"sweep": [-1, {"last": True}]}))
    err = _refusal(tmp_path, capsys, swept)
    assert err.startswith("validation: method.writes.patch.pos.sweep.1: a protocol position is an integer")
