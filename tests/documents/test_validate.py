"""Validation without a model: JSON in, a frozen PointDocument or one Refusal with its dotted path (one D16 test
runs the two tables a step of two interventions saves, on the session's Llama fixture).

Every test starts from a deep copy of documents/patching.json, changes one thing and checks
one behaviour. Exact refusal texts come from ../shared/reference/seed-tables.md (A9, A11, B11)
and document-format.md §11/§20; the dotted path (Refusal.path) is asserted every time.
"""
from __future__ import annotations

import copy
import hashlib
import json
import pathlib

import pytest

from causalab_ref.runs import compile as compiler
from causalab_ref.documents import places, reader, sweeps, validate
from causalab_ref.runs import run
from causalab_ref.shapes import Anchor, PointDocument, Read, Refusal, Site, Where

pytestmark = pytest.mark.fast  # the edit-test loop's subset: `pytest -m fast` (README)

REPO = pathlib.Path(__file__).resolve().parents[2]
_SHIPPED = json.loads((REPO / "documents" / "patching.json").read_text(encoding="utf-8"))
IV = "interventions.patching"  # the dotted path of the shipped intervention


def doc() -> dict:
    """A fresh, mutable copy of the shipped document."""
    return copy.deepcopy(_SHIPPED)


def iv(raw: dict) -> dict:
    return raw["interventions"]["patching"]


def _patching(document: PointDocument):
    """The validated counterpart of `iv`: the shipped intervention as it is in the PointDocument."""
    return dict(document.interventions)["patching"]


def refused(raw, call=validate.document) -> Refusal:
    """The Refusal `call(raw)` raises; it must be decided at validation."""
    with pytest.raises(Refusal) as caught:
        call(raw)
    assert caught.value.stage == "validation"
    return caught.value


def patched(dotted: str, value) -> dict:
    """The shipped document with its intervention's `dotted` field (`writes.patch.pos`) set to `value`."""
    raw = doc()
    *parents, last = dotted.split(".")
    node = iv(raw)
    for key in parents:
        node = node[key]
    node[last] = value
    return raw


def said(raw) -> tuple[str, str]:
    """The refusal of a document: (its path, its message)."""
    r = refused(raw)
    return r.path, r.message


def refused_where(raw, path: str = "p") -> Refusal:
    return refused(raw, lambda r: places.where(r, path))


# ================================================================ documents


def test_shipped_document_validates():
    """SPEC.md:13 [D1] A document is model/roles/sites/interventions/steps (+ header); the shipped one is valid."""
    raw = doc()
    parsed = validate.document(raw)
    assert isinstance(parsed, PointDocument)
    assert parsed.model.key == "fixture:tiny-llama"
    assert [k for k, _ in parsed.roles] == ["base", "counterfactual"]
    assert [k for k, _ in parsed.steps] == ["score"]
    assert sweeps.points(raw) == [("", raw)]


def test_unknown_key_is_refused_with_its_dotted_path():
    """SPEC.md:15 [D2] An unknown key at any depth is refused naming its dotted path (F§2 example)."""
    path, message = said(patched("reads.v_cf.position", -1))
    assert path == f"{IV}.reads.v_cf.position" and message.startswith("unknown key 'position'")


def test_unknown_top_level_key_is_refused():
    """SPEC.md:15 [D2] The top-level object rejects a key it does not know, path = the key."""
    raw = doc()
    raw["protocol_version"] = "3"
    path, message = said(raw)
    assert path == "protocol_version" and "unknown key 'protocol_version'" in message


def test_unknown_key_inside_a_scope_is_refused():
    """SPEC.md:15 [D2] Nested objects (a position's scope) reject unknown keys with the full path."""
    r = refused_where({"index": -1, "scope": {"variable": "entity", "colour": "red"}},
                      f"{IV}.reads.v_cf.pos")
    assert r.path == f"{IV}.reads.v_cf.pos.scope.colour"


def test_unknown_header_key_is_refused():
    """SPEC.md:15 [D2] `header` has only `description` (F§2); anything else there is refused by path."""
    raw = doc()
    raw["header"]["author"] = "me"
    assert refused(raw).path == "header.author"


def test_missing_model_block_is_refused():
    """SPEC.md:17 [D3] A missing required block is refused at validation with its path."""
    raw = doc()
    del raw["model"]
    assert said(raw) == ("model", "required field is missing")


def test_missing_metric_column_is_refused_with_its_path():
    """SPEC.md:17 [D3] A metric without the column field its kind needs is refused at that field (F§20)."""
    raw = doc()
    del iv(raw)["metrics"]["iia"]["expected"]
    assert said(raw) == (f"{IV}.metrics.iia.expected", "required field is missing")


def test_wrong_type_is_refused():
    """SPEC.md:17 [D3] A value of the wrong type is refused with its dotted path."""
    raw = doc()
    raw["model"]["revision"] = 7
    assert said(raw) == ("model.revision", "expected a string, got an integer")


def test_wrong_type_of_a_block_is_refused():
    """SPEC.md:17 [D3] A block of the wrong shape (sites as a list) is refused at the block's path."""
    raw = doc()
    raw["sites"] = [raw["sites"]["target"]]
    path, message = said(raw)
    assert path == "sites" and "got a list" in message


def test_boolean_is_not_an_integer():
    """SPEC.md:17 [D3] Booleans are not integers: `decode: true` and `layers: [true]` are refused."""
    raw = doc()
    iv(raw)["decode"] = True
    r = refused(raw)
    assert (r.path, r.message) == (f"{IV}.decode", "expected an integer, got a boolean")
    raw = doc()
    raw["sites"]["target"]["layers"] = [True]
    assert refused(raw).path == "sites.target.layers.0"


def test_boolean_position_is_refused():
    """SPEC.md:193 [P3] The sugar is a bare integer; a boolean `pos` is not one (F§9.1)."""
    r = refused_where(True, f"{IV}.reads.v_cf.pos")
    assert r.path == f"{IV}.reads.v_cf.pos"
    assert r.message == "a position is an integer or an object, got a boolean"


def test_model_dtype_must_be_fp32_or_bf16():
    """SPEC.md:23 [D5] `dtype` is fp32|bf16; anything else is refused at model.dtype."""
    raw = doc()
    raw["model"]["dtype"] = "fp16"
    # the message ends in D22's tail
    assert said(raw) == ("model.dtype", "'fp16' is not one of ['fp32', 'bf16']; did you mean 'bf16'?")


def test_attn_implementation_is_eager_sdpa_or_null():
    """SPEC.md:23 [D5] `attn_implementation` is optional, eager|sdpa|null; other values are refused."""
    for value in ("eager", "sdpa", None):
        raw = doc()
        raw["model"]["attn_implementation"] = value
        assert validate.document(raw).model.attn_implementation == value
    raw = doc()
    raw["model"]["attn_implementation"] = "flash_attention_2"
    assert refused(raw).path == "model.attn_implementation"


# (where in the intervention, the key, the undeclared name, the refused path under it, the message after
# `interventions.patching: `): each the F§20 text of its rule.
UNDECLARED = {
    "site": (("reads", "v_cf"), "site", "targit", "reads.v_cf.site", "read 'v_cf': undeclared site 'targit'"),
    "role": (("reads", "v_cf"), "input", "source", "reads.v_cf.input", "read 'v_cf': undeclared role 'source'"),
    "model": (("reads", "logits"), "model", "steered", "reads.logits.model",
              "read 'logits': model 'steered' is neither 'original' nor declared"),
    "write": (("models", "patched"), "writes", ["patch", "ablate"], "models.patched.writes.1",
              "model 'patched': undeclared write 'ablate'"),
    "operand": (("writes", "patch"), "operand", "mean", "writes.patch.operand",
                "write 'patch': operand 'mean' is not a read of this intervention; a value from an earlier step "
                "is {\"ref\": …}"),
}


@pytest.mark.parametrize("what", list(UNDECLARED))
def test_an_undeclared_name_is_refused_at_its_path_with_its_text(what):
    """SPEC.md:37 [D10] a read names a declared site, role and model; SPEC.md:41 [D11] a write's operand is a
    read of the same intervention; SPEC.md:45 [D13] a model's writes are declared writes."""
    (block, name), key, value, path, message = UNDECLARED[what]
    raw = doc()
    iv(raw)[block][name][key] = value
    r = refused(raw)
    assert (r.path, r.message) == (f"{IV}.{path}", f"{IV}: {message}")


def test_read_of_an_intervened_model_takes_its_input():
    """SPEC.md:37 [D10] Reading: a read of model M on a role M does not run on is refused."""
    path, message = said(patched("reads.logits.input", "counterfactual"))
    assert path == f"{IV}.reads.logits.input" and "model 'patched' runs on 'base'" in message


def test_original_is_a_reserved_model_name():
    """SPEC.md:45 [D13] `original` is reserved and has no writes."""
    path, message = said(patched("models.original", {"input": "base", "writes": ["patch"]}))
    assert path == f"{IV}.models.original" and "reserved" in message


def test_numeric_operand_is_accepted():
    """SPEC.md:41 [D11] A number is an operand (zero ablation); it needs no read."""
    raw = doc()
    iv(raw)["writes"]["patch"]["operand"] = 0.0
    write = dict(validate.document(raw).interventions[0][1].writes)["patch"]
    assert write.operand == 0.0


def test_write_without_operand_is_refused():
    """SPEC.md:41 [D11] `swap` needs an operand (F§8.3 `mechanism '<m>' needs an operand`)."""
    raw = doc()
    del iv(raw)["writes"]["patch"]["operand"]
    r = refused(raw)
    assert (r.path, r.message) == (f"{IV}.writes.patch.operand", "mechanism 'swap' needs an operand")


def test_metric_of_must_name_a_read():
    """SPEC.md:47 [D14] A metric's `of` is a read of the same intervention (F§20 text)."""
    assert said(patched("metrics.iia.of", "v_cf_logits")) == (f"{IV}.metrics.iia.of", "interventions.patching: metric 'iia': `of` must be a read name, got 'v_cf_logits'")


def test_metric_takes_only_its_kinds_columns():
    """SPEC.md:47 [D14] match takes `expected`; a logit_diff column on it is an unknown key."""
    path, message = said(patched("metrics.iia.a", "cf_answer"))
    assert path == f"{IV}.metrics.iia.a" and message.startswith("unknown key 'a'")


def test_saves_of_a_thing_not_produced():
    """SPEC.md:52 [D16] A save names a metric this step produces (F§20 text)."""
    raw = doc()
    raw["steps"]["score"]["saves"][0]["value"] = "iia2"
    path, message = said(raw)
    assert path == "steps.score.saves.0.value" and message == ("step 'score': saves 'iia2', which it does not produce (it produces ['iia', 'logit_diff']); "
                         "did you mean 'iia'?")  # D22's tail


def test_metric_save_must_be_a_json_path():
    """SPEC.md:52 [D16] A metric is saved to a `.json` path."""
    raw = doc()
    raw["steps"]["score"]["saves"][1]["file_path"] = "logit_diff.safetensors"
    assert refused(raw).path == "steps.score.saves.1.file_path"


def test_step_needs_rows_for_every_role():
    """SPEC.md:52 [D16] `rows` has one entry per declared role (F§10.1 text)."""
    raw = doc()
    del raw["steps"]["score"]["rows"]["counterfactual"]
    r = refused(raw)
    assert (r.path, r.message) == ("steps.score.rows", "step 'score': no rows for role 'counterfactual'")


def test_step_intervention_may_be_singular_or_omitted():
    """SPEC.md:52 [D16] `interventions`, singular `intervention`, or omitted when exactly one is declared."""
    raw = doc()
    del raw["steps"]["score"]["interventions"]
    assert validate.document(raw).steps[0][1].interventions == ("patching",)
    raw["steps"]["score"]["intervention"] = "patching"
    assert validate.document(raw).steps[0][1].interventions == ("patching",)


def test_undeclared_intervention_in_a_step_is_refused():
    """SPEC.md:52 [D16] A step runs declared interventions (F§20 `undeclared intervention … declared: [...]`)."""
    raw = doc()
    raw["steps"]["score"]["interventions"] = "pathcing"
    assert said(raw) == ("steps.score.interventions", "step 'score': undeclared intervention 'pathcing'; declared: ['patching']")


def _two_interventions(saves):
    raw = doc()
    other = copy.deepcopy(raw["interventions"]["patching"])
    other["models"]["patched"]["writes"] = []
    raw["interventions"]["plain"] = other
    raw["steps"]["score"]["interventions"] = ["patching", "plain"]
    raw["steps"]["score"]["saves"] = saves
    return raw


def test_a_step_of_two_interventions_saves_qualified_names(llama, tmp_path):
    """SPEC.md:52 [D16] with two interventions each metric is saved as <intervention>/<metric>, into its own
    file, and the two tables differ (the patched one and the plain one)."""
    raw = _two_interventions([{"value": "patching/logit_diff", "file_path": "patched.json"},
                              {"value": "plain/logit_diff", "file_path": "plain.json"}])
    plan = compiler.compile_document(raw, llama, REPO / "documents" / "data")
    assert [s.name for s in plan.steps] == ["score/patching", "score/plain"]
    run.execute(plan, llama, tmp_path / "out")
    patched = [r["value"] for r in json.loads((tmp_path / "out" / "patched.json").read_text())]
    plain = [r["value"] for r in json.loads((tmp_path / "out" / "plain.json").read_text())]
    assert all(abs(a - b) > 1e-6 for a, b in zip(patched, plain))


def test_an_ambiguous_bare_metric_name_is_refused():
    """SPEC.md:52 [D16] a bare name two interventions share is not something the step produces."""
    raw = _two_interventions([{"value": "iia", "file_path": "iia.json"}])
    with pytest.raises(Refusal) as refusal:
        validate.document(raw)
    assert refusal.value.path == "steps.score.saves.0.value"
    assert "saves 'iia', which it does not produce" in refusal.value.message


def test_two_steps_may_not_save_to_one_file():
    """SPEC.md:52 [D16] a second save to the same file_path in another step is refused."""
    raw = doc()
    raw["steps"]["again"] = copy.deepcopy(raw["steps"]["score"])
    with pytest.raises(Refusal) as refusal:
        validate.document(raw)
    assert refusal.value.path == "steps.again.saves.0.file_path"
    assert refusal.value.message == "'iia.json' is already written by step 'score'; name another file"


# ================================================================ later work, refused by name


def test_unknown_mechanism_is_refused():
    """SPEC.md:43 [D12] A mechanism the format does not have is refused listing the format's names."""
    path, message = said(patched("writes.patch.mechanism", "replace"))
    assert path == f"{IV}.writes.patch.mechanism" and message.startswith("'replace' is not one of ['swap', 'add_scaled'")


# ================================================================ positions


def test_bare_integer_is_index():
    """SPEC.md:193 [P3] The one sugar: a bare integer i is {"index": i}; seed 000:56."""
    assert places.where(-1, "p") == Where(index=-1) == places.where({"index": -1}, "p")
    assert places.where(3, "p") == Where(index=3)
    read = dict(validate.document(doc()).interventions[0][1].reads)["v_cf"]
    assert read.pos == Where(index=-1) and read.pos.cut == "index" and read.pos.frame == "prompt"


def test_two_cuts_refused_with_seed_text():
    """SPEC.md:194 [P4] Two cuts are refused with A11's text; seed 000:3."""
    r = refused_where({"index": -1, "last": 2}, f"{IV}.reads.v_cf.pos")
    assert r.path == f"{IV}.reads.v_cf.pos"
    assert r.message == "a position names exactly one of index/span/last/all, got ['index', 'last']"


def test_no_cut_is_refused_with_seed_text():
    """SPEC.md:194 [P4] No cut is refused with A11's text (the list is empty); seed 000:3."""
    r = refused_where({"scope": {"variable": "entity"}}, "p")
    assert (r.path, r.message) == ("p", "a position names exactly one of index/span/last/all, got []")


def test_two_cuts_in_a_document_are_refused_at_the_pos_path():
    """SPEC.md:194 [P4] The refusal carries the document path of the `pos`; seed 000:3."""
    assert said(patched("writes.patch.pos", {"span": [0, 2], "all": True})) == (f"{IV}.writes.patch.pos", "a position names exactly one of index/span/last/all, got ['span', 'all']")


def test_last_zero_is_refused():
    """SPEC.md:201 [P6] `{"last": 0}` is refused: `last 0 is not a positive number of tokens` (A11)."""
    r = refused_where({"last": 0}, "p")
    assert (r.path, r.message) == ("p.last", "last 0 is not a positive number of tokens")
    assert refused_where({"last": -2}, "p").message == "last -2 is not a positive number of tokens"


def test_backwards_span_is_refused():
    """SPEC.md:203 [P7] Same-signed ends with b <= a are refused: `span [a, b] is not a forward window` (A11)."""
    for a, b in ((3, 1), (2, 2), (-1, -3)):
        r = refused_where({"span": [a, b]}, "p")
        assert (r.path, r.message) == ("p.span", f"span [{a}, {b}] is not a forward window")


def test_mixed_sign_span_is_accepted_with_no_width():
    """SPEC.md:203 [P7] A span may mix signs; its width waits for a row (A10); seed 000:58."""
    pos = places.where({"span": [2, -1]}, "p")
    assert pos.span == (2, -1)
    assert pos.per_row is None and pos.ragged


def test_width_of_each_cut():
    """SPEC.md:359 [P46] width: 1 for index, n for last n, b-a for a same-signed span, none for all (A10)."""
    assert places.where(-1, "p").per_row == 1
    assert places.where({"last": 3}, "p").per_row == 3
    assert places.where({"span": [1, 4]}, "p").per_row == 3
    assert places.where({"span": [-3, -1]}, "p").per_row == 2
    assert places.where({"all": True}, "p").per_row is None


def test_scope_makes_a_width_one_cut_ragged():
    """SPEC.md:361 [P47] Ragged when the width is none or there is a scope; seed 000:328."""
    pos = places.where({"index": -1, "scope": {"variable": "entity"}}, "p")
    assert pos.per_row == 1 and pos.ragged
    assert not places.where(-1, "p").ragged


def test_eos_in_the_prompt_frame_is_refused():
    """SPEC.md:221 [P14] `eos` in the prompt frame is refused with A11's text; seed 000:94."""
    r = refused_where({"index": -1, "scope": {"segment": "eos"}}, "p")
    assert (r.path, r.message) == ("p.scope.segment",
                                   "segment 'eos' is a run of the generated frame, not the prompt")


def test_chat_segment_in_the_generated_frame_is_refused():
    """SPEC.md:221 [P14] Each frame refuses the other's segments: `user` in the generated frame; seed 000:94."""
    r = refused_where({"frame": "generated", "index": -1, "scope": {"segment": "user"}}, "p")
    assert r.path == "p.scope.segment"
    assert r.message.startswith("segment 'user' is a run of the prompt frame")
    ok = places.where({"frame": "generated", "index": -1, "scope": {"segment": "eos"}}, "p")
    assert ok.scope.segment == "eos" and ok.frame == "generated"


def test_anchor_with_neither_is_refused():
    """SPEC.md:224 [P15] An anchor naming neither a variable nor a segment is refused with A11's text."""
    for scope in ({}, {"variable": None, "segment": None}):
        r = refused_where({"index": -1, "scope": scope}, "p")
        assert (r.path, r.message) == ("p.scope", "an anchor names a variable, a segment, or both")


def test_segment_and_variable_compose():
    """SPEC.md:220 [P13] `{"segment": …, "variable": …}` is one anchor; seed 000:94."""
    pos = places.where({"index": -1, "scope": {"segment": "user[1]", "variable": "entity"}}, "p")
    assert (pos.scope.segment, pos.scope.variable) == ("user[1]", "entity")
    assert pos.spelling() == "{index:-1 scope:{segment:user[1] variable:entity}}"


def test_frame_must_be_prompt_or_generated():
    """SPEC.md:186 [P1] `frame` is prompt (default) or generated; anything else is refused at p.frame."""
    assert places.where({"index": 0}, "p").frame == "prompt"
    assert refused_where({"index": 0, "frame": "continuation"}, "p").path == "p.frame"


# ================================================================ width: metrics and writes


@pytest.mark.parametrize("pos, window", [({"last": 3}, "a window of 3 positions"),
                                         ({"all": True}, "a window of varying positions")], ids=["last3", "all"])
def test_metric_over_a_window_wider_than_one_is_refused(pos, window):
    """SPEC.md:368 [P49] A metric reads width 1: `last: 3`, and `{"all": true}` (`a window of varying
    positions`), are refused with A11's text; seed 000:330."""
    assert said(patched("reads.logits.pos", pos)) == (f"{IV}.metrics.iia.of", (
        f"interventions.patching: metric 'iia' reads 'logits', {window}; a metric scores one position per row"))


def test_metric_over_a_ragged_width_one_read_is_accepted():
    """SPEC.md:368 [P49] Ragged is fine under a metric when the width is 1; seed 000:330."""
    raw = doc()
    iv(raw)["reads"]["logits"]["pos"] = {"index": -1, "scope": {"variable": "entity"}}
    patching = _patching(validate.document(raw))
    logits = dict(patching.reads)["logits"]
    assert logits.pos == Where(index=-1, scope=Anchor(variable="entity"))
    assert logits.pos.ragged and logits.pos.per_row == 1
    assert [(m, metric.of) for m, metric in patching.metrics] == [("iia", "logits"), ("logit_diff", "logits")]


def test_write_operand_width_mismatch_is_refused():
    """SPEC.md:370 [P50] A write and its operand with different fixed widths are refused with A11's text."""
    assert said(patched("writes.patch.pos", {"last": 2})) == (f"{IV}.writes.patch.pos", (
        "interventions.patching: write 'patch' covers 2 position(s) but its operand 'v_cf' "
        "was read over 1; the windows must match"))


def test_ragged_write_width_is_left_to_the_run():
    """SPEC.md:372 [P51] With no fixed width on one side, validation cannot compare; the run does."""
    raw = doc()
    iv(raw)["writes"]["patch"]["pos"] = {"all": True, "scope": {"variable": "entity"}}
    iv(raw)["reads"]["v_cf"]["pos"] = {"all": True, "scope": {"variable": "entity"}}
    patching = _patching(validate.document(raw))
    patch, v_cf = dict(patching.writes)["patch"], dict(patching.reads)["v_cf"]
    assert patch.operand == "v_cf"
    assert patch.pos == v_cf.pos == Where(all=True, scope=Anchor(variable="entity"))
    assert patch.pos.per_row is None and v_cf.pos.per_row is None


# ================================================================ the generated frame (A9)


def _generated(decode: int, write_pos=None, read_pos=None) -> dict:
    raw = doc()
    iv(raw)["decode"] = decode
    if write_pos is not None:
        iv(raw)["writes"]["patch"]["pos"] = write_pos
    if read_pos is not None:
        iv(raw)["reads"]["v_cf"]["pos"] = read_pos
    return raw


# (decode, read or write, the generated step, the refused path under the intervention, the message after
# `interventions.patching: `): a step the decode never reaches, for a read and for a write (A9).
UNREACHED = {
    "read-no-decode": (0, "read", 0, "reads.v_cf.pos", "read 'v_cf': a generated position needs `decode` > 0"),
    "write-no-decode": (0, "write", 0, "writes.patch.pos",
                        "write 'patch': a generated position needs `decode` > 0"),
    "write-past": (3, "write", 3, "writes.patch.pos", "write 'patch': step 3 of a 3-token decode"),
    "read-past": (2, "read", 5, "reads.v_cf.pos", "read 'v_cf': step 5 of a 2-token decode"),
}


@pytest.mark.parametrize("case", list(UNREACHED))
def test_a_generated_step_the_decode_does_not_reach_is_refused(case):
    """SPEC.md:335 [P42] A generated position with `decode: 0`, and a step past the decode bound, are refused,
    for a read and a write (A9); seed 000:275."""
    decode, side, step, path, message = UNREACHED[case]
    pos = {"frame": "generated", "index": step}
    raw = _generated(decode, **({"read_pos": pos} if side == "read" else {"write_pos": pos}))
    assert said(raw) == (f"{IV}.{path}", f"{IV}: {message}")


def test_generated_write_at_index_minus_one_is_refused():
    """SPEC.md:335 [P42] A write names a reached step; `{generated index:-1}` is a cut to read (A9); seed 000:275."""
    assert said(_generated(3, write_pos={"frame": "generated", "index": -1})) == (f"{IV}.writes.patch.pos", (
        "interventions.patching: write 'patch': a write in the continuation frame is at a step the decode has "
        "reached — {'index': k} with k >= 0, or {'all': true}. {generated index:-1} names a cut of the finished "
        "continuation, which is something to read and not something to write into"))


def test_generated_write_of_last_n_is_refused():
    """SPEC.md:335 [P42] `{"last": n}` in the continuation is also a cut to read, not a write (A9)."""
    r = refused(_generated(3, write_pos={"frame": "generated", "last": 1}))
    assert r.path == f"{IV}.writes.patch.pos"
    assert "{generated last:1} names a cut of the finished continuation" in r.message


def test_generated_write_with_scope_is_refused():
    """SPEC.md:335 [P42] A write in the continuation frame takes no scope (A9); seed 000:275."""
    scoped = {"frame": "generated", "index": 0, "scope": {"segment": "eos"}}
    assert said(_generated(3, write_pos=scoped)) == (f"{IV}.writes.patch.pos", (
        "interventions.patching: write 'patch': a write in the continuation frame takes no scope; "
        "{generated index:0 scope:{segment:eos}} is only known once the decode has finished"))


def test_generated_write_at_a_step_or_all_is_accepted():
    """SPEC.md:335 [P42] `{"index": k}` with 0 <= k < decode, or `{"all": true}`, are what a write there may say."""
    at_step = _patching(validate.document(_generated(3, write_pos={"frame": "generated", "index": 2})))
    assert at_step.decode == 3
    assert dict(at_step.writes)["patch"].pos == Where(index=2, frame="generated")
    every = _patching(validate.document(_generated(3, write_pos={"frame": "generated", "all": True})))
    assert dict(every.writes)["patch"].pos == Where(all=True, frame="generated")
    read = _patching(validate.document(_generated(3, read_pos={"frame": "generated", "index": -1,
                                                               "scope": {"variable": "said"}})))
    assert dict(read.reads)["v_cf"].pos == Where(index=-1, scope=Anchor(variable="said"), frame="generated")


def test_negative_decode_is_refused():
    """SPEC.md:315 [P36] `decode: n` is a number of tokens to generate; a negative one is refused."""
    raw = doc()
    iv(raw)["decode"] = -1
    assert refused(raw).path == f"{IV}.decode"


# ================================================================ sites (locations)


def test_layers_with_two_entries_is_refused():
    """SPEC.md:382 [L2] A multi-layer band is refused with B11's text; seed 004:33."""
    raw = doc()
    raw["sites"]["target"]["layers"] = [0, 1]
    assert said(raw) == ("sites.target.layers", (
        "layers must be a one-element band; a band spanning several layers is one address "
        "and is not implemented"))


def test_per_layer_component_without_layers_is_refused():
    """SPEC.md:386 [L4] A per-layer component with no layer is refused (reference's reading of B4); seed 004:90."""
    raw = doc()
    del raw["sites"]["target"]["layers"]
    assert said(raw) == ("sites.target", "'block_output' is addressed at one layer: say which with \"layers\": [i]")


def test_whole_model_component_with_layers_is_refused():
    """SPEC.md:386 [L4] A whole-model component with a layer is refused; seed 004:90."""
    raw = doc()
    raw["sites"]["head"]["layers"] = [0]
    assert said(raw) == ("sites.head.layers", "'lm_head' is one per model and takes no layers")


def test_unknown_component_is_left_to_compile():
    """SPEC.md:431 [L17] A component the table does not know is refused at compile, not at validation."""
    raw = doc()
    raw["sites"]["target"]["component"] = "block_ouput"
    assert dict(validate.document(raw).sites)["target"].component == "block_ouput"


def test_heads_and_units_together_are_refused():
    """SPEC.md:424 [L14] `heads` and `units` together are refused with B11's text; seed 004:159."""
    raw = doc()
    raw["sites"]["target"] = {"component": "attention_z", "layers": [0], "heads": [0], "units": [1]}
    assert said(raw) == ("sites.target", "a site names heads or units, not both: they slice the same axis")


def test_heads_at_block_output_is_refused():
    """SPEC.md:424 [L14] `heads` only at a per-head tensor, B11's text with the sorted per-head names."""
    raw = doc()
    raw["sites"]["target"]["heads"] = [0]
    assert said(raw) == ("sites.target.heads", (
        "'block_output' is not a per-head tensor; `heads` applies at ['attention_key', "
        "'attention_premix', 'attention_probs', 'attention_query', 'attention_scores', "
        "'attention_z']"))


def test_heads_at_a_per_head_tensor_is_accepted():
    """SPEC.md:380 [L1] A site is component, one layer, and optionally heads; seed 004:3."""
    raw = doc()
    raw["sites"]["target"] = {"component": "attention_premix", "layers": [0], "heads": [1, 3]}
    assert dict(validate.document(raw).sites)["target"].heads == (1, 3)


def test_empty_repeated_or_negative_heads_are_refused():
    """SPEC.md:424 [L14] An empty, repeated or negative `heads` list is refused with B11's text."""
    for heads, path in (([], "sites.target.heads"), ([1, 1], "sites.target.heads"),
                        ([0, -1], "sites.target.heads.1")):
        raw = doc()
        raw["sites"]["target"] = {"component": "attention_z", "layers": [0], "heads": heads}
        r = refused(raw)
        assert (r.path, r.message) == (path, "heads is a non-empty list of distinct head indices")


def test_empty_or_repeated_units_are_refused():
    """SPEC.md:424 [L14] An empty or repeated `units` list is refused with B11's units text."""
    for units in ([], [2, 2]):
        raw = doc()
        raw["sites"]["target"]["units"] = units
        r = refused(raw)
        assert (r.path, r.message) == ("sites.target.units", "units is a non-empty list of distinct feature indices")


def test_write_at_input_ids_is_refused():
    """SPEC.md:401 [L8] `input_ids` is read-only; B11's full validate text; seed 004:92."""
    raw = doc()
    raw["sites"]["target"] = {"component": "input_ids"}
    path, message = said(raw)
    assert path == f"{IV}.writes.patch.site" and str(message) == ("interventions.patching: write 'patch': 'input_ids' is read-only — the model's "
                              "input, not an activation")


def test_read_at_input_ids_is_accepted():
    """SPEC.md:401 [L8] Only a write at `input_ids` is refused; reading the model's input is fine."""
    raw = doc()
    raw["sites"]["ids"] = {"component": "input_ids"}
    iv(raw)["reads"]["ids"] = {"site": "ids", "pos": -1, "input": "base"}
    parsed = validate.document(raw)
    assert dict(parsed.sites)["ids"] == Site(component="input_ids")
    assert dict(_patching(parsed).reads)["ids"] == Read(site="ids", pos=Where(index=-1), input="base")


def test_view_logits_off_the_residual_stream_is_refused():
    """SPEC.md:406 [L10] `view: logits` only on the residual stream; F§20/B11 full text; seed 004:41."""
    assert said(patched("reads.logits.view", "logits")) == (f"{IV}.reads.logits.view", (
        "interventions.patching: read 'logits': view 'logits' projects the residual stream "
        "through the head, and 'lm_head' is not the residual stream (one of ['block_input', "
        "'block_output', 'embeddings', 'ln_final'])"))


def test_view_logits_on_the_residual_stream_is_accepted():
    """SPEC.md:406 [L10] `view: logits` on block_output validates; seed 004:41."""
    raw = doc()
    iv(raw)["reads"]["logits"]["site"] = "target"
    iv(raw)["reads"]["logits"]["view"] = "logits"
    parsed = validate.document(raw)
    logits = dict(_patching(parsed).reads)["logits"]
    assert (logits.site, logits.view, logits.featurizer) == ("target", "logits", "identity")
    assert dict(parsed.sites)["target"].component == "block_output"


def test_logits_view_is_not_an_operand():
    """SPEC.md:406 [L10] A logits view is vocabulary-wide and cannot be written back (F§8.2 text)."""
    assert said(patched("reads.v_cf.view", "logits")) == (f"{IV}.writes.patch.operand", (
        "interventions.patching: write 'patch': operand 'v_cf' is a logits view, which is "
        "vocabulary-wide and cannot be written back at a site"))


# ================================================================ sweeps


def _labels(raw) -> list[str]:
    return [label for label, _ in sweeps.points(raw)]


def test_heads_sweep_points_are_labelled_by_element():
    """SPEC.md:61 [D18] `heads: {"sweep": [[0],[1]]}` -> heads=0, heads=1; each point is a document; seed 004:13."""
    raw = doc()
    raw["sites"]["target"] = {"component": "attention_premix", "layers": [0], "heads": {"sweep": [[0], [1]]}}
    pts = sweeps.points(raw)
    assert [label for label, _ in pts] == ["heads=0", "heads=1"]
    assert [p["sites"]["target"]["heads"] for _, p in pts] == [[0], [1]]
    assert [dict(validate.document(p).sites)["target"].heads for _, p in pts] == [(0,), (1,)]
    assert raw["sites"]["target"]["heads"] == {"sweep": [[0], [1]]}  # the input is not mutated


def test_multi_element_value_is_labelled_as_compact_json():
    """SPEC.md:61 [D18] A value that is not a one-element list prints as compact JSON (`units=[0,1,2,3]`)."""
    raw = doc()
    raw["sites"]["target"]["units"] = {"sweep": [[0, 1, 2, 3], [4]]}
    assert _labels(raw) == ["units=[0,1,2,3]", "units=4"]


def test_range_sweep_is_python_range():
    """SPEC.md:58 [D17] `{"sweep": {"range": [a, b(, s)]}}` is Python's range; name = last key on the path."""
    raw = doc()
    raw["sites"]["target"]["layers"] = [{"sweep": {"range": [0, 2]}}]
    pts = sweeps.points(raw)
    assert [label for label, _ in pts] == ["layers=0", "layers=1"]
    assert [p["sites"]["target"]["layers"] for _, p in pts] == [[0], [1]]
    raw["sites"]["target"]["layers"] = [{"sweep": {"range": [0, 6, 2]}}]
    assert _labels(raw) == ["layers=0", "layers=2", "layers=4"]


def test_malformed_range_and_empty_sweep_are_refused():
    """SPEC.md:58 [D17] A range of non-integers or step 0, and an empty sweep, are refused at the wrapper."""
    raw = doc()
    raw["sites"]["target"]["layers"] = [{"sweep": {"range": [0, 4, 0]}}]
    assert refused(raw, sweeps.points).path == "sites.target.layers.0.sweep.range"
    raw["sites"]["target"]["layers"] = [{"sweep": []}]
    assert refused(raw, sweeps.points).path == "sites.target.layers.0.sweep"


def test_independent_sweeps_form_a_cross_product():
    """SPEC.md:58 [D17] Independent wrappers are a cross product, labels joined by `,` in reading order."""
    raw = doc()
    raw["sites"]["target"]["layers"] = {"sweep": [[0], [1]]}
    iv(raw)["reads"]["logits"]["pos"] = {"sweep": [-1, -2]}
    assert _labels(raw) == ["layers=0,pos=-1", "layers=0,pos=-2", "layers=1,pos=-1", "layers=1,pos=-2"]


def test_same_axis_as_moves_together():
    """SPEC.md:58 [D17] Wrappers with one `as` move together: one label per step of the axis."""
    raw = doc()
    iv(raw)["reads"]["v_cf"]["pos"] = {"sweep": [-1, -2], "as": "pos"}
    iv(raw)["writes"]["patch"]["pos"] = {"sweep": [-1, -2], "as": "pos"}
    pts = sweeps.points(raw)
    assert [label for label, _ in pts] == ["pos=-1", "pos=-2"]
    for (_, p), index in zip(pts, (-1, -2)):
        assert iv(p)["reads"]["v_cf"]["pos"] == iv(p)["writes"]["patch"]["pos"]
        patching = _patching(validate.document(p))
        assert dict(patching.reads)["v_cf"].pos == dict(patching.writes)["patch"].pos == Where(index=index)


def test_same_axis_of_unequal_lengths_is_refused():
    """SPEC.md:58 [D17] Same-axis wrappers must have equal lengths (F§11)."""
    raw = doc()
    iv(raw)["reads"]["v_cf"]["pos"] = {"sweep": [-1, -2], "as": "pos"}
    iv(raw)["writes"]["patch"]["pos"] = {"sweep": [-1, -2, -3], "as": "pos"}
    r = refused(raw, sweeps.points)
    assert r.path == f"{IV}.writes.patch.pos"
    assert "the axis 'pos' moves 2 values here and 3 there" in r.message


def test_sweeping_model_is_refused_with_the_format_text():
    """SPEC.md:58 [D17] `model` may not be swept; F§11/§20 text."""
    raw = doc()
    raw["model"]["dtype"] = {"sweep": ["fp32", "bf16"]}
    r = refused(raw, sweeps.points)
    assert r.path == "model.dtype"
    assert r.message == ("model.dtype is swept; a sweep may not change the model or the header — those are the "
                         "identity of the run, not a coordinate in it")


def test_sweeping_header_is_refused():
    """SPEC.md:58 [D17] `header` may not be swept either."""
    raw = doc()
    raw["header"]["description"] = {"sweep": ["a", "b"]}
    r = refused(raw, sweeps.points)
    assert r.path == "header.description"
    assert r.message.startswith("header.description is swept; a sweep may not change the model or the header")


def test_document_that_is_itself_a_sweep_is_refused():
    """SPEC.md:58 [D17] Only fields are swept; a document that is one wrapper is refused, not a crash."""
    r = refused({"sweep": [doc(), doc()]}, sweeps.points)
    assert r.path == ""
    assert "sweep" in r.message


def test_unlowered_wrapper_is_refused_by_document():
    """SPEC.md:58 [D17] Wrappers are lowered first; `document` refuses one that was not."""
    path, message = said(patched("reads.logits.pos", {"sweep": [-1, -2]}))
    assert path == f"{IV}.reads.logits.pos" and "lowered" in message


# ================================================================ digest


def test_digest_is_independent_of_header():
    """SPEC.md:63 [D19] produced_by ignores the header: changed or removed, the digest is the same."""
    raw = doc()
    before = reader.digest(raw)
    raw["header"]["description"] = "something else entirely"
    assert reader.digest(raw) == before
    del raw["header"]
    assert reader.digest(raw) == before


def test_digest_equal_for_bare_and_object_index():
    """SPEC.md:63 [D19] `"pos": -1` and `"pos": {"index": -1}` are one experiment."""
    raw = doc()
    spelled = doc()
    for r in spelled["interventions"]["patching"]["reads"].values():
        r["pos"] = {"index": -1}
    spelled["interventions"]["patching"]["writes"]["patch"]["pos"] = {"index": -1}
    assert reader.digest(raw) == reader.digest(spelled)


@pytest.mark.parametrize("spelling", [{"index": -1, "frame": "prompt"}, {"index": -1, "all": False, "span": None},
                                      {"index": -1, "scope": None, "last": None, "frame": "prompt"}])
def test_digest_equal_for_a_position_with_its_defaults_written_out(spelling):
    """SPEC.md:63 [D19] `-1`, `{"index": -1}` and the same position with any default written out (the frame,
    a null cut or scope, `all: false`) are one experiment; a different position is another."""
    raw = doc()
    spelled = doc()
    iv(spelled)["reads"]["logits"]["pos"] = spelling
    assert validate.document(spelled) and reader.digest(raw) == reader.digest(spelled)
    iv(spelled)["reads"]["logits"]["pos"] = {"index": -1, "frame": "prompt", "scope": {"variable": "entity"}}
    assert reader.digest(spelled) != reader.digest(raw)
    scoped = doc()
    iv(scoped)["reads"]["logits"]["pos"] = {"index": -1, "scope": {"variable": "entity", "segment": None}}
    assert reader.digest(spelled) == reader.digest(scoped)


def test_digest_is_sha256_of_sorted_compact_json():
    """SPEC.md:63 [D19] sha256 of the header-less document, keys sorted, separators (",", ":"), pos expanded."""
    raw = doc()
    body = {k: v for k, v in raw.items() if k != "header"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    text = text.replace('"pos":-1', '"pos":{"index":-1}')
    assert reader.digest(raw) == hashlib.sha256(text.encode()).hexdigest()


def test_digest_differs_per_point():
    """SPEC.md:63 [D19] Each sweep point is its own experiment with its own digest."""
    raw = doc()
    iv(raw)["reads"]["logits"]["pos"] = {"sweep": [-1, -2]}
    digests = {reader.digest(p) for _, p in sweeps.points(raw)}
    assert len(digests) == 2
