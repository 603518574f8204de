"""What a metric table's rows say (SPEC.md §4, R7, R22)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

from causalab_ref import cli

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"


def test_a_qualified_saves_table_names_the_metric_by_its_declared_name(tmp_path):
    """SPEC.md:559 [R22] a step of two interventions saving `patching/logit_diff` and `plain/logit_diff` writes
    rows whose `metric` is `logit_diff` in both files: the qualifier picks the table, not the name."""
    raw = json.loads((ROOT / "documents" / "patching.json").read_text(encoding="utf-8"))
    plain = copy.deepcopy(raw["interventions"]["patching"])
    plain["models"]["patched"]["writes"] = []
    raw["interventions"]["plain"] = plain
    raw["steps"]["score"]["interventions"] = ["patching", "plain"]
    raw["steps"]["score"]["saves"] = [{"value": "patching/logit_diff", "file_path": "patched.json"},
                                      {"value": "plain/logit_diff", "file_path": "plain.json"}]
    doc = tmp_path / "two.json"
    doc.write_text(json.dumps(raw), encoding="utf-8")
    assert cli.main(["run", str(doc), "--data-root", str(DATA), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    for name in ("patched.json", "plain.json"):
        rows = json.loads((tmp_path / "out" / name).read_text(encoding="utf-8"))
        assert len(rows) == 4 and {r["metric"] for r in rows} == {"logit_diff"}


def test_explain_prints_outputs_before_saves_and_no_empty_saves(capsys):
    """SPEC.md:562 [R23] mean_ablation's harvest publishes `mean` and saves mean.safetensors: metrics, then
    outputs, then saves; steering's harvest saves nothing and prints no `saves=[]`."""
    assert cli.main(["explain", str(ROOT / "documents" / "mean_ablation.json"), "--data-root", str(DATA)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("harvest:"))
    assert line.strip() == ("harvest: Observe  metrics=[]  outputs=['mean=mean(acts)']  saves=['mean.safetensors']")
    assert cli.main(["explain", str(ROOT / "documents" / "steering.json"), "--data-root", str(DATA)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("harvest:"))
    assert line.strip() == "harvest: Observe  metrics=[]  outputs=['direction=mean(resid)']"


def test_forwards_with_no_dependency_between_them_run_sorted_by_model_and_input():
    """SPEC.md:562 [R23] LR§9.3 — three forwards on base, `steered_renormed` and `steered` both reading after
    `original`: the order is original, steered, steered_renormed whatever order the reads are declared in."""
    from causalab_ref.runs import order
    from causalab_ref.shapes import IntervenedModel, Read, Write

    reads = (("late", Read(site="s", pos=None, model="steered_renormed", input="base")),
             ("mid", Read(site="s", pos=None, model="steered", input="base")),
             ("first", Read(site="s", pos=None, model="original", input="base")))

    class Iv:
        pass

    iv = Iv()
    iv.reads = reads
    iv.writes = (("w", Write(site="s", pos=None, mechanism="swap", operand="first")),)
    iv.models = (("steered", IntervenedModel(input="base", writes=("w",))),
                 ("steered_renormed", IntervenedModel(input="base", writes=("w",))))
    needed = [(r.model, r.input) for _n, r in reads]
    assert order.forward_order(iv, needed, "interventions.x") == [
        ("original", "base"), ("steered", "base"), ("steered_renormed", "base")]


def test_an_untested_stack_is_named_in_one_line_and_the_tested_set_is_ci_s(monkeypatch, capsys):
    """SPEC.md:567 [R24] TESTED is what .ci/constraints.txt pins; with another transformers installed, `run` and
    `conform` print one note naming it (and nothing when the stack is the tested one)."""
    from causalab_ref.runs import results

    pins = dict(line.strip().split("==") for line in (ROOT / ".ci" / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert {name: pins[name] for name in results.TESTED} == results.TESTED
    assert results.untested_note() == ""
    monkeypatch.setattr(results, "versions", lambda: {**results.TESTED, "transformers": "5.99.0"})
    note = results.untested_note()
    assert note.startswith("note: installed versions are not the tested set: transformers 5.99.0 (tested 5.24.0)")
    cli._note_untested()
    assert capsys.readouterr().err.strip() == note


def test_the_untested_stack_note_never_joins_a_refusal_or_a_usage_line(monkeypatch, tmp_path):
    """SPEC.md:567 [R24] under an untested stack a refused `run` and a `conform` usage error print their one
    line alone (D4, C20); a run that writes its results prints the note after them."""
    from causalab_ref.runs import results
    from inprocess import cli as run_cli

    monkeypatch.setattr(results, "versions", lambda: {**results.TESTED, "transformers": "5.99.0"})
    refused = run_cli("run", str(tmp_path / "missing.json"), "--out", str(tmp_path / "o"))
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert not refused.stderr.startswith("note:")
    usage = run_cli("conform", "--impl", "no-such-program-here", "--only", "refuse_per_layer_without_layer")
    assert usage.returncode == 2 and usage.stderr.splitlines() == [
        "usage: conform: --impl 'no-such-program-here': no program 'no-such-program-here' (not an executable "
        "file, nor on $PATH)"]
    done = run_cli("run", str(ROOT / "documents" / "patching.json"), "--data-root", str(DATA), "--out",
                   str(tmp_path / "ok"), "--quiet")
    assert done.returncode == 0 and done.stderr.splitlines() == [results.untested_note()], done.stderr
