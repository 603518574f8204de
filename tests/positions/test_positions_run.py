"""Positions, complete: the resolver wired through compile and run on the Llama fixture.

Documents are documents/entity_patch.json, documents/chat_turn.json, and variants of
documents/patching.json built in code; rows that must be special come from a tmp data
root. The engine is loaded once for the module. `seed 000:N` is the line of
../shared/seeds/000_3398400d1caa6bb3.txt (beside the checkout) that states the behaviour.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import inprocess

from causalab_ref.runs import compile as compiler
from causalab_ref.runs import run
from causalab_ref.documents import validate
from causalab_ref.shapes import Refusal

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
PATCHING = json.loads((ROOT / "documents" / "patching.json").read_text())
ENTITY_PATCH = json.loads((ROOT / "documents" / "entity_patch.json").read_text())
CHAT_TURN = json.loads((ROOT / "documents" / "chat_turn.json").read_text())
TRAIN = json.loads((DATA / "weekdays" / "train.json").read_text())
ENTITY = {"index": -1, "scope": {"variable": "entity"}}
FIXED_WIDTH_TAIL = ("A position of a fixed width names the same number of tokens on every row, so a row it does "
                    "not fit is refused rather than skipped; a position anchored to the row's own text may skip a "
                    "row, and says why")


def _rows_root(tmp_path: Path, rows: list[dict]) -> Path:
    (tmp_path / "t").mkdir(parents=True, exist_ok=True)
    (tmp_path / "t" / "rows.json").write_text(json.dumps(rows))
    return tmp_path


def _on_rows(raw: dict, tmp_path: Path, rows: list[dict]):
    """The document with every role of its step reading `rows` from a tmp data root."""
    raw = copy.deepcopy(raw)
    raw["steps"]["score"]["rows"] = {role: "t/rows" for role in raw["steps"]["score"]["rows"]}
    return raw, _rows_root(tmp_path, rows)


def _variant(base: dict, **pos) -> dict:
    """`base` with the named reads/writes moved to a new position (`v_cf=…`, `patch=…`, `logits=…`)."""
    raw = copy.deepcopy(base)
    intervention = raw["interventions"]["patching"]
    for name, where in pos.items():
        kind = "writes" if name in intervention["writes"] else "reads"
        intervention[kind][name]["pos"] = where
    return raw


def _step(raw, llama, root=DATA):
    plan = compiler.compile_document(raw, llama, root)
    return plan.steps[0]


def _results(raw, llama, root=DATA):
    return run.run_step(llama, _step(raw, llama, root))


def _refusal(raw, llama, root=DATA) -> Refusal:
    with pytest.raises(Refusal) as caught:
        _results(raw, llama, root)
    return caught.value


# ---------------------------------------------------------------- the shipped documents


def test_entity_patch_reproduces_the_seeds_provenance(llama):
    """SPEC.md:296 [P32] seed 000:240-244 — where.py on entity_patch.json: the same spec on both roles,
    each row's own entity; the write lands on 'day' where the read took ' Saturday' whole, both at 6."""
    results = _results(ENTITY_PATCH, llama)
    where = results.positions
    assert list(where) == ["v_cf", "patch", "logits"]
    assert where["v_cf"]["rows"] == ((6,), (6,), (6,), (6,))
    assert where["v_cf"]["tokens"] == ("' Saturday'", "' Sunday'", "'day'", "' Friday'")
    assert where["patch"]["rows"] == ((6,), (6,), (6,), (6,))
    assert where["patch"]["tokens"] == ("'day'", "' Friday'", "' Saturday'", "' Sunday'")
    assert where["logits"]["rows"] == ((10,), (10,), (10,), (10,))
    assert where["logits"]["tokens"] == ("' is'",) * 4
    assert all(record["reason"] == ("", "", "", "") for record in where.values())
    assert results.eligible == {"iia": (True,) * 4, "logit_diff": (True,) * 4}


def test_entity_patch_tables_carry_the_metric_reads_window(llama, tmp_path):
    """SPEC.md:304 [P34] seed 000:248-262 — every table row carries the metric's own read's window
    (logits at -1, not the entity): positions [10], reason "", tokens "' is'"."""
    plan = compiler.compile_document(ENTITY_PATCH, llama, DATA)
    run.execute(plan, llama, tmp_path / "out")
    for name in ("iia", "logit_diff"):
        rows = json.loads((tmp_path / "out" / f"{name}.json").read_text())
        assert [r["example_id"] for r in rows] == ["0", "1", "2", "3"]
        for row in rows:
            assert (row["eligible"], row["positions"], row["reason"], row["tokens"]) == (True, [10], "", "' is'")
            assert row["value"] is not None


def test_chat_turn_compiles_the_seeds_sample_and_segments(llama):
    """SPEC.md:208 [P9] SPEC.md:211 [P10] SPEC.md:213 [P11] seed 000:83-87 — a list of messages is rendered
    through the chat template (no BOS text), and each turn's content's character range is recorded."""
    step = _step(CHAT_TURN, llama)
    sample = "[INST] Name a weekday. [/INST] Thursday. </s><s>[INST] If today is Thursday, tomorrow is [/INST]"
    for forward in step.forwards:
        assert forward.sample == sample
        assert forward.segments[0] == {"user[0]": (7, 22), "assistant[0]": (31, 40), "user[1]": (55, 88),
                                       "assistant": (31, 40)}
        assert "user" not in forward.segments[0]  # the user spoke twice: no bare name


def test_chat_turn_positions_are_the_questions_and_the_templates(llama):
    """SPEC.md:213 [P11] SPEC.md:199 [P5] seed 000:89-92 — the last token of user[1] is the question's ' is' at 32 on every
    row; -1 of the whole prompt is the template's closing ']' at 36. The write lands at user[1] too."""
    results = _results(CHAT_TURN, llama)
    where = results.positions
    for name in ("blank", "at_question"):
        assert where[name]["rows"] == ((32,),) * 4
        assert where[name]["tokens"] == ("' is'",) * 4
    assert where["logits"]["rows"] == ((36,),) * 4
    assert where["logits"]["tokens"] == ("']'",) * 4
    assert all(all(v is not None for v in values) for values in results.scores.values())


def test_a_bare_turn_name_spoken_twice_and_a_cut_past_the_turn_are_reported_not_refused(llama):
    """SPEC.md:218 [P12] SPEC.md:239 [P21] seed 000:81 — 'user' spoke twice, so the bare name is
    alignment_ambiguous; index 5 of the four-token assistant turn is out_of_range. Both are anchored reads,
    so they are reported per row and the pass runs."""
    raw = copy.deepcopy(CHAT_TURN)
    reads = raw["interventions"]["blanking"]["reads"]
    reads["at_user"] = {"site": "head", "pos": {"index": -1, "scope": {"segment": "user"}}, "model": "original",
                        "input": "base"}
    reads["past_turn"] = {"site": "head", "pos": {"index": 5, "scope": {"segment": "assistant"}},
                          "model": "original", "input": "base"}
    where = _results(raw, llama).positions
    assert where["at_user"]["reason"] == ("alignment_ambiguous",) * 4
    assert where["past_turn"]["reason"] == ("out_of_range",) * 4
    assert where["at_user"]["rows"] == where["past_turn"]["rows"] == ((),) * 4


# ---------------------------------------------------------------- eligibility


def test_a_read_whose_anchor_is_missing_is_an_excluded_measurement(llama, tmp_path):
    """SPEC.md:262 [P27] SPEC.md:312 [P35] seed 000:199, seed 000:265 — the row stays in the table with
    value null, eligible false, positions [], reason alignment_missing; the other rows score."""
    rows = copy.deepcopy(TRAIN)
    rows[1]["entity"] = "Tuesday"  # not in 'If today is Friday, tomorrow is'
    raw, root = _on_rows(_variant(PATCHING, logits=ENTITY), tmp_path, rows)
    results = _results(raw, llama, root)
    assert results.positions["logits"]["reason"] == ("", "alignment_missing", "", "")
    assert results.positions["logits"]["rows"][1] == ()
    assert results.eligible["iia"] == (True, False, True, True)
    plan = compiler.compile_document(raw, llama, root)
    run.execute(plan, llama, tmp_path / "out")
    table = json.loads((tmp_path / "out" / "iia.json").read_text())
    assert len(table) == 4
    assert {k: table[1][k] for k in ("value", "eligible", "positions", "reason", "tokens")} == {
        "value": None, "eligible": False, "positions": [], "reason": "alignment_missing", "tokens": ""}
    assert [r["value"] is not None for r in table] == [True, False, True, True]
    assert table[0]["tokens"] == "'day'" and table[0]["positions"] == [6]


def test_a_write_whose_anchor_is_missing_is_refused_with_the_seeds_message(llama, tmp_path):
    """SPEC.md:264 [P28] seed 000:200-204 — a write may not skip a row."""
    rows = copy.deepcopy(TRAIN)
    rows[1]["entity"] = "Tuesday"
    raw, root = _on_rows(ENTITY_PATCH, tmp_path, rows)
    refusal = _refusal(raw, llama, root)
    assert refusal.stage == "compile"  # P58: the prompt frame is placed at compile
    assert refusal.path == "interventions.patching.writes.patch.pos"
    assert refusal.message == (
        "write 'patch' has nothing to write on row(s) {1: 'alignment_missing'}. A read may skip a row; a write "
        "may not — writing nothing somewhere is not an intervention, and the row would score as if one had "
        "happened. `alignment_missing` is an anchor the row's prompt does not hold (a variable's text it does "
        "not contain, a turn it does not have): correct the row, or leave it out of the rows the write runs on")


def test_a_write_whose_anchor_is_ambiguous_keeps_the_seeds_last_sentence(llama, tmp_path):
    """SPEC.md:264 [P28] the message's last words explain the rows' own reason: a value twice in its prompt is
    `alignment_ambiguous`, and the seed's sentence about scoping is the one said."""
    rows = copy.deepcopy(TRAIN)
    rows[2]["input"] = rows[2]["input"] + " " + rows[2]["entity"]  # row 2's entity now stands twice in its prompt
    raw, root = _on_rows(ENTITY_PATCH, tmp_path, rows)
    refusal = _refusal(raw, llama, root)
    assert (refusal.stage, refusal.path) == ("compile", "interventions.patching.writes.patch.pos")
    assert refusal.message.startswith("write 'patch' has nothing to write on row(s) {2: 'alignment_ambiguous'}.")
    assert refusal.message.endswith(". `alignment_ambiguous` is a value that is in the prompt more than once, and "
                                    "scoping the anchor is what makes it one")
    assert "alignment_missing" not in refusal.message


@pytest.mark.parametrize("kind, name, where, bad", [
    ("read", "v_cf", {"index": 40}, {0: "out_of_range", 1: "out_of_range", 2: "out_of_range", 3: "out_of_range"}),
    ("read", "v_cf", {"last": 12}, {0: "out_of_range", 1: "out_of_range", 2: "out_of_range", 3: "out_of_range"}),
    # the counterfactual rows: only row 2 (Thursday) has ten content tokens, the others eight
    ("read", "v_cf", {"last": 9}, {0: "out_of_range", 1: "out_of_range", 3: "out_of_range"}),
    ("write", "patch", {"index": 40}, {0: "out_of_range", 1: "out_of_range", 2: "out_of_range", 3: "out_of_range"}),
])
def test_a_fixed_width_cut_that_does_not_fit_is_refused(llama, kind, name, where, bad):
    """SPEC.md:270 [P29] seed 000:206 — refused where it is resolved, naming the op, the rows, the reason."""
    moved = {name: where}
    if kind == "read" and "last" in where:
        moved["patch"] = where  # a write and its operand must have the same fixed width
    raw = _variant(PATCHING, **moved)
    validate.document(raw)  # the document is valid: the positions refuse it, where they resolve
    refusal = _refusal(raw, llama)
    assert refusal.stage == "compile"  # P58: the prompt frame is placed at compile
    assert refusal.path == f"interventions.patching.{kind}s.{name}.pos"
    label = "{" + ", ".join(f"{k}: {v!r}" for k, v in bad.items()) + "}"
    cut = next(iter(where))
    assert refusal.message == (f"{kind} '{name}' at {{{cut}:{where[cut]}}} has no position on row(s) {label}. "
                               + FIXED_WIDTH_TAIL)


def test_a_metric_none_of_whose_rows_survive_is_refused(llama, tmp_path):
    """SPEC.md:275 [P31] seed 000:208 — rows 0-1 fail the position half, rows 2-3 the column half."""
    rows = copy.deepcopy(TRAIN)
    rows[0]["entity"], rows[1]["entity"] = "Tuesday", "Monday"
    rows[2]["cf_answer"], rows[3]["cf_answer"] = "", "  "
    raw, root = _on_rows(_variant(PATCHING, logits=ENTITY), tmp_path, rows)
    refusal = _refusal(raw, llama, root)
    assert refusal.stage == "compile"  # P58
    assert refusal.message.endswith("a metric of nothing has no mean")
    assert "'iia'" in refusal.message and "'logits'" in refusal.message


def test_the_column_half_excludes_a_blank_answer_and_keeps_its_positions(llama, tmp_path):
    """SPEC.md:273 [P30] seed 000:208 — a blank cf_answer excludes that row only; its window is still
    reported (the position half placed it)."""
    rows = copy.deepcopy(TRAIN)
    rows[2]["cf_answer"] = " "
    raw, root = _on_rows(ENTITY_PATCH, tmp_path, rows)
    results = _results(raw, llama, root)
    assert results.eligible == {"iia": (True, True, False, True), "logit_diff": (True, True, False, True)}
    assert [v is None for v in results.scores["logit_diff"]] == [False, False, True, False]
    plan = compiler.compile_document(raw, llama, root)
    run.execute(plan, llama, tmp_path / "out")
    row = json.loads((tmp_path / "out" / "logit_diff.json").read_text())[2]
    assert {k: row[k] for k in ("value", "eligible", "positions", "reason", "tokens")} == {
        "value": None, "eligible": False, "positions": [10], "reason": "", "tokens": "' is'"}


# ---------------------------------------------------------------- provenance


def test_a_pass_of_bare_integers_reports_nothing(llama, tmp_path):
    """SPEC.md:296 [P32] SPEC.md:302 [P33] seed 000:214 — no character map, no results.positions, and
    table rows with positions null, reason "" and tokens ""; eligibility is still reported."""
    step = _step(PATCHING, llama)
    assert not step.dynamic
    results = run.run_step(llama, step)
    assert results.positions == {}
    assert results.eligible == {"iia": (True,) * 4, "logit_diff": (True,) * 4}
    table = run.metric_table(step, results, "iia", "digest")
    assert all((r["positions"], r["reason"], r["tokens"]) == (None, "", "") for r in table)


def test_the_where_py_record_is_plain_tuples_per_op(llama):
    """SPEC.md:296 [P32] seed 000:222-238 — results.positions[op] has rows, tokens and reason, one entry
    per row, plain integers and strings."""
    results = _results(ENTITY_PATCH, llama)
    for name, record in results.positions.items():
        assert set(record) == {"rows", "tokens", "reason"}, name
        assert all(isinstance(part, tuple) and len(part) == 4 for part in record.values())
        assert all(isinstance(i, int) for window in record["rows"] for i in window)
        assert all(isinstance(s, str) for s in record["tokens"] + record["reason"])


def test_a_last_cut_makes_a_pass_report_its_positions(llama):
    """SPEC.md:296 [P32] only a pass of bare `index` cuts reports nothing; a `last` cut is the row's own
    and is reported."""
    doc = copy.deepcopy(PATCHING)
    for op in (doc["interventions"]["patching"]["reads"]["v_cf"], doc["interventions"]["patching"]["writes"]["patch"]):
        op["pos"] = {"last": 1}
    step = compiler.compile_document(doc, llama, DATA).steps[0]
    assert step.dynamic
    results = run.run_step(llama, step)
    assert results.positions["patch"]["rows"] == ((10,),) * 4
    assert results.positions["patch"]["tokens"] == ("' is'",) * 4


# ---------------------------------------------------------------- anchors


def test_an_anchor_takes_the_variable_sibling_first_then_the_top_level_column(llama):
    """SPEC.md:228 [P16] SPEC.md:232 [P18] seed 000:98 — the counterfactual role finds
    counterfactual_inputs_variables[0].entity, the base role the column entity; without the sibling the
    counterfactual role falls back to the column; the text travels on the tap."""
    taps = {tap.name: tap for f in _step(ENTITY_PATCH, llama).forwards for tap in f.taps}
    assert taps["v_cf"].anchors == ("Saturday", "Sunday", "Thursday", "Friday")
    assert taps["patch"].anchors == ("Thursday", "Friday", "Saturday", "Sunday")
    assert taps["logits"].anchors is None


def test_without_the_sibling_the_top_level_column_is_used(llama, tmp_path):
    """SPEC.md:228 [P16] — rows with no counterfactual_inputs_variables: the counterfactual role's anchor is
    the row's top-level entity (the base's), which is then not in the counterfactual prompt."""
    rows = [{k: v for k, v in row.items() if k != "counterfactual_inputs_variables"} for row in TRAIN]
    raw, root = _on_rows(ENTITY_PATCH, tmp_path, rows)
    # the write lands a number, so the read that finds nothing on these rows feeds nothing compile refuses (P58)
    raw["interventions"]["patching"]["writes"]["patch"]["operand"] = 0.0
    taps = {tap.name: tap for f in _step(raw, llama, root).forwards for tap in f.taps}
    assert taps["v_cf"].anchors == ("Thursday", "Friday", "Saturday", "Sunday")


def test_a_variable_that_is_neither_is_refused_before_any_model_work(llama, tmp_path):
    """SPEC.md:231 [P17] seed 000:98 — refused at compile, naming both places it looked."""
    raw = _variant(ENTITY_PATCH, v_cf={"index": -1, "scope": {"variable": "x"}},
                   patch={"index": -1, "scope": {"variable": "x"}})
    with pytest.raises(Refusal) as caught:
        compiler.compile_document(raw, llama, DATA)
    refusal = caught.value
    assert refusal.stage == "compile"
    assert refusal.path == "interventions.patching.reads.v_cf.pos.scope.variable"
    assert refusal.message.startswith(
        "variable 'x': this row has neither 'counterfactual_inputs_variables[0].x' nor a column 'x'")


def test_a_ragged_write_whose_operand_differs_on_some_row_is_refused(llama):
    """SPEC.md:372 [P51] (seed-tables A6, A11) — the whole entity is 3 tokens on a Thursday
    row and 1 on the others, so swapping whole entities between rows 0 and 2 is refused naming them."""
    whole = {"all": True, "scope": {"variable": "entity"}}
    refusal = _refusal(_variant(ENTITY_PATCH, v_cf=whole, patch=whole), llama)
    assert refusal.stage == "compile"  # P58
    assert refusal.message == (
        "write 'patch' covers [3, 1, 1, 1] positions per row but its operand 'v_cf' was read over [1, 1, 3, 1]; "
        "rows [0, 2] differ. Landing a window of one width in another is a policy this slice does not "
        "implement — the protocol's `exact_length_buckets` and `padded_masked` — so it refuses")


@pytest.mark.parametrize("read_pos, write_pos", [(ENTITY, -1), (-1, ENTITY)])
def test_an_anchored_window_and_a_bare_one_of_equal_widths_interchange(llama, read_pos, write_pos):
    """SPEC.md:366 [P48] SPEC.md:372 [P51] — an anchored read is flat and a bare write rectangular (or the
    reverse); with one position on every row the value lands as if both were bare. The entity's last
    token is at 6 = {"index": -5} on every row of this batch, so the two runs must agree exactly."""
    bare = {"index": -5}
    anchored = _results(_variant(ENTITY_PATCH, v_cf=read_pos, patch=write_pos), llama)
    plain = _results(_variant(ENTITY_PATCH, v_cf=bare if read_pos == ENTITY else -1,
                              patch=bare if write_pos == ENTITY else -1), llama)
    assert anchored.positions["v_cf" if read_pos == ENTITY else "patch"]["rows"] == ((6,),) * 4
    assert anchored.scores["logit_diff"] == plain.scores["logit_diff"]


def test_a_bare_write_fed_by_an_anchored_read_that_skipped_a_row_is_refused(llama, tmp_path):
    """SPEC.md:372 [P51] SPEC.md:262 [P27] — the read may skip counterfactual row 1, but then the write has
    no value to land there; refused naming the row (at compile, P58), not as a shape the engine cannot land."""
    rows = copy.deepcopy(TRAIN)
    rows[1]["counterfactual_inputs_variables"][0]["entity"] = "Tuesday"
    raw, root = _on_rows(_variant(ENTITY_PATCH, patch=-1), tmp_path, rows)
    refusal = _refusal(raw, llama, root)
    assert refusal.stage == "compile"  # P58
    assert refusal.message.startswith("write 'patch' covers [1, 1, 1, 1] positions per row but its operand "
                                      "'v_cf' was read over [1, 0, 1, 1]; rows [1] differ.")


# ---------------------------------------------------------------- left padding


def test_left_padding_same_last_index_each_rows_own_first_token(llama):
    """SPEC.md:258 [P26] SPEC.md:253 [P24] seed 000:175-177 — rows of different lengths: -1 is index 10 on
    every row, index 0 is each row's own first token (after its padding and BOS), 'If' on all."""
    raw = copy.deepcopy(ENTITY_PATCH)
    raw["interventions"]["patching"]["reads"]["first"] = {"site": "head", "pos": 0, "model": "original",
                                                          "input": "base"}
    step = _step(raw, llama)
    base = next(f for f in step.forwards if f.input == "base")
    lengths = {sum(m) for m in base.mask}
    assert len(lengths) > 1  # the rows really are of different lengths
    results = run.run_step(llama, step)
    first = results.positions["first"]
    assert first["rows"] == tuple((m.index(1) + 1,) for m in base.mask) == ((1,), (3,), (3,), (3,))
    assert first["tokens"] == ("'If'",) * 4
    assert results.positions["logits"]["rows"] == ((10,),) * 4


# ---------------------------------------------------------------- the command line


def test_cli_tokens_shows_a_documents_rows_with_indices():
    """SPEC.md:611 [R19] seed 000:175-195 (document-format §16) — `tokens --document DOC` prints each role's rows of the
    first step as index:'piece', indices into the padded batch."""
    done = inprocess.cli("tokens", "--document", "documents/entity_patch.json")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "step 'score', role 'base': 4 rows x 11 tokens"
    assert lines[1] == "  0: 1:'If' 2:' today' 3:' is' 4:' Th' 5:'urs' 6:'day' 7:',' 8:' tom' 9:'orrow' 10:' is'"
    assert lines[2] == "  1: 3:'If' 4:' today' 5:' is' 6:' Friday' 7:',' 8:' tom' 9:'orrow' 10:' is'"
    assert lines[5] == "step 'score', role 'counterfactual': 4 rows x 11 tokens"
    assert lines[6].startswith("  0: 3:'If' 4:' today' 5:' is' 6:' Saturday'")


@pytest.mark.parametrize("name", ["minimal_protocol.json", "steps_first/readout.json", "steps_first/pos_sweep.json"])
def test_cli_tokens_of_another_format_are_those_of_the_document_it_lowers_to(name, tmp_path):
    """SPEC.md:611 [R19] SPEC.md:2502 [SF1] SPEC.md:1599 [PR1] — a protocol or steps-first document
    is read as the plan-shaped document it lowers to, so `tokens --document` prints what it prints for that one.
    Ground: that identity (the lowered text written to a file and shown the same way). Before, an unswept one
    ended in an internal error (KeyError 'roles'): its plan carries the document as given (PR15, SF15)."""
    lowered = tmp_path / "lowered.json"
    lowered.write_text(json.dumps(validate.read(ROOT / "documents" / name).raw), encoding="utf-8")
    given = inprocess.cli("tokens", "--document", f"documents/{name}")
    plain = inprocess.cli("tokens", "--document", str(lowered))
    assert given.returncode == plain.returncode == 0, given.stderr + plain.stderr
    assert given.stdout == plain.stdout and "role 'base': 4 rows x 11 tokens" in given.stdout


def test_cli_tokens_shows_the_first_observe_step_and_refuses_a_document_with_none(tmp_path):
    """SPEC.md:611 [R19] — `tokens --document` shows the first observe step's rows (the Reading: a fit's rows
    run in shuffled minibatches, a weights step has none); a document with no observe step is refused at compile
    in one line. Before, a document whose first step is a fit (the shipped distributed_das.json) ended in an
    internal error (AttributeError: a FitPlan has no forwards), which the fuzz found once it ran this verb."""
    done = inprocess.cli("tokens", "--document", "documents/distributed_das.json")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "step 'score', role 'base': 64 rows x 14 tokens"
    raw = json.loads((ROOT / "documents" / "distributed_das.json").read_text(encoding="utf-8"))
    del raw["steps"]["score"]  # the fit alone
    fit_only = tmp_path / "fit_only.json"
    fit_only.write_text(json.dumps(raw), encoding="utf-8")
    refused = inprocess.cli("tokens", "--document", str(fit_only))
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == "compile: steps: this document has no observe step, so it has no rows to show"


def test_a_run_tokenizer_that_disagrees_with_the_plans_is_refused(llama):
    """SPEC.md:374 [P52] row 0 decoded by the run's tokenizer and by the plan's must agree, compared as
    decoded strings (seed 000:334-336)."""
    from causalab_ref.fixtures import builder
    plan = compiler.compile_document(copy.deepcopy(PATCHING), llama, DATA)
    other = builder.tokenizer("fixture:tiny-gpt2")

    class Swapped:
        tokenizer = other

    with pytest.raises(Refusal, match="the tokenizer at run time decodes row 0") as refusal:
        run.run_step(Swapped(), plan.steps[0])
    assert refusal.value.stage == "run"
