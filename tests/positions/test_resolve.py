"""The position resolver (causalab_ref/positions/resolve.py) against the seed's worked examples.

Each test is one behaviour; `seed 000:N` is the line of ../shared/seeds/000_*.txt (the Positions seed beside the checkout)
that states it.
"""
from __future__ import annotations

import ast
import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch

from causalab_ref.runs import data
from causalab_ref.fixtures import builder
from causalab_ref.positions import resolve
from causalab_ref.shapes import Anchor, Frame, Where

pytestmark = pytest.mark.fast  # the edit-test loop's subset: `pytest -m fast` (README)

WEEKDAYS = ["If today is Thursday, tomorrow is", "If today is Friday, tomorrow is"]
ARITHMETIC = [
    "Q: What day is one days after Monday?\nA:",
    "Q: What day is three days after Monday?\nA:",
    "Q: What day is two days after Tuesday?\nA:",
    "Q: What day is five days after Tuesday?\nA:",
]
CHAT = [
    {"role": "user", "content": "Name a weekday."},
    {"role": "assistant", "content": "Thursday."},
    {"role": "user", "content": "If today is Thursday, tomorrow is"},
]
# The Llama-2 chat template's rendering of CHAT (apply_chat_template, tokenize=False).
CHAT_RENDERED = (
    "<s>[INST] Name a weekday. [/INST] Thursday. </s><s>[INST] If today is Thursday, tomorrow is [/INST]"
)
CHAT_SAMPLE = (
    "[INST] Name a weekday. [/INST] Thursday. </s><s>[INST] If today is Thursday, tomorrow is [/INST]"
)


@pytest.fixture(scope="session")
def llama():
    """The Llama fixture's tokenizer: the Llama-2 tokenizer.model, legacy false (the seed's ids)."""
    return builder.tokenizer("fixture:tiny-llama")


@pytest.fixture(scope="session")
def gpt2():
    """The GPT-2 fixture's tokenizer: a 1000-id byte-level BPE with no BOS."""
    return builder.tokenizer("fixture:tiny-gpt2")


@pytest.fixture
def weekdays(llama):
    return resolve.frame_of_texts(llama, WEEKDAYS)


@pytest.fixture
def chat(llama):
    _ids, _mask, frame = resolve.frame_of_texts(llama, [CHAT_RENDERED.removeprefix("<s>")])
    return dataclasses.replace(frame, segments=(resolve.segments_of(frame.texts[0], CHAT),))


def _tokens(frame, windows):
    return [resolve.tokens_of(frame, window, row) for row, window in enumerate(windows)]


# ---------------------------------------------------------------- the module


def test_imports_only_stdlib_torch_and_shapes():
    """seed 000:5 — the resolver imports nothing but the standard library, torch and shapes.py.
    SPEC.md:232 [P18]"""
    tree = ast.parse(Path(resolve.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.level or node.module == "causalab_ref"):
            imported |= {f"causalab_ref.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    allowed = {"torch", "causalab_ref.shapes"}
    strays = {m for m in imported if m not in allowed and m.split(".")[0] not in sys.stdlib_module_names}
    assert strays == set()


# ---------------------------------------------------------------- the frame and the character map


def test_content_text_excludes_bos(weekdays):
    """seed 000:140 — the content text is the prompt itself, no BOS. SPEC.md:253 [P24] SPEC.md:650 [X4]"""
    _ids, _mask, frame = weekdays
    assert repr(frame.texts[0]) == "'If today is Thursday, tomorrow is'"


def test_content_pieces_of_the_weekday_prompt(llama, weekdays):
    """seed 000:141 — the content range covers exactly the prompt's pieces. SPEC.md:253 [P24] SPEC.md:650 [X4]"""
    ids, _mask, frame = weekdays
    pieces = [llama.decode([i]) for i in ids[0][frame.starts[0] : frame.ends[0]]]
    assert pieces == ["If", "today", "is", "Th", "urs", "day", ",", "tom", "orrow", "is"]


def test_offsets_from_decoding_growing_prefixes(weekdays):
    """seed 000:116,142 — offsets[k] is where token k starts; the last entry is len(text).
    SPEC.md:242 [P22] SPEC.md:650 [X4]"""
    _ids, _mask, frame = weekdays
    assert frame.offsets[0] == (0, 2, 8, 11, 14, 17, 20, 21, 25, 30, 33)


def test_byte_fallback_pieces_keep_offsets_non_decreasing(llama):
    """seed 000:116 — a prefix that is not a prefix of the text reuses the previous offset, so the
    pieces that leave 🙂 incomplete start where it starts and cover nothing. SPEC.md:242 [P22]"""
    ids, _mask, frame = resolve.frame_of_texts(llama, ["I like 🙂 a lot"])
    offsets = frame.offsets[0]
    assert list(offsets) == sorted(offsets) and offsets[-1] == len(frame.texts[0])
    pieces = llama.convert_ids_to_tokens(list(ids[0][frame.starts[0]:]))
    assert pieces[3:7] == ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]
    assert offsets[3:8] == (7, 7, 7, 7, 8)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_an_emoji_anchor_is_its_completing_pieces_only(family, request):
    """seed 000:147 SPEC.md:245 [P23] — a piece that leaves its character incomplete covers no character and
    overlaps nothing: the run over 🙂 is the piece(s) that complete it, on sentencepiece byte fallback (one
    of four byte pieces) as on byte-level BPE."""
    tok = request.getfixturevalue(family)
    _ids, _mask, frame = resolve.frame_of_texts(tok, ["I like 🙂 a lot"])
    windows, reasons = resolve.resolve(frame, Where(all=True, scope=Anchor(variable="e")), ("🙂",))
    offsets, start = frame.offsets[0], frame.starts[0]
    assert reasons == ("",) and windows[0]
    assert all(offsets[i - start + 1] > offsets[i - start] for i in windows[0])
    assert _tokens(frame, windows) == ["'🙂'"]


def test_a_token_that_covers_no_character_is_in_no_run(llama):
    """SPEC.md:245 [P23] — issue 10 item 1: Llama's '▁' before a digit decodes to nothing, so the run of "12"
    is the pieces '1' and '2' (3, 4), not the empty '▁' in front of them; rows are left-padded."""
    _ids, _mask, frame = resolve.frame_of_texts(llama, ["12 Friday", "blue Friday of is Paris"])
    windows, reasons = resolve.resolve(frame, Where(all=True, scope=Anchor(variable="e")), ("12", "Paris"))
    assert (windows, reasons) == (((3, 4), (5,)), ("", ""))
    assert _tokens(frame, windows) == ["'12'", "' Paris'"]


def test_left_and_right_padding_give_the_same_content(llama, weekdays):
    """seed 000:177 — resolution works from each row's content range, whichever side the padding is.
    SPEC.md:258 [P26]"""
    ids, mask, left = weekdays
    unpadded = [[i for i, m in zip(row, ms) if m] for row, ms in zip(ids, mask)]
    width = max(map(len, unpadded))
    right_ids = torch.tensor([row + [2] * (width - len(row)) for row in unpadded])
    right_mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in unpadded])
    right = resolve.frame_of_ids(llama, right_ids, right_mask)
    assert right.texts == left.texts and right.offsets == left.offsets
    assert right.starts == (1, 1) and right.ends == (11, 9)


def test_non_contiguous_padding_is_refused(llama):
    """seed 000:177 — a row's content is one half-open range, so padding must be contiguous.
    SPEC.md:258 [P26]"""
    with pytest.raises(ValueError, match="contiguous"):
        resolve.frame_of_ids(llama, [[1, 960, 2, 338]], [[1, 1, 0, 1]])


def test_bare_integer_pass_builds_no_character_map(llama, weekdays):
    """seed 000:214 — a pass of bare integers builds no character map and still resolves.
    SPEC.md:302 [P33]"""
    ids, mask, _frame = weekdays
    frame = resolve.frame_of_ids(llama, ids, mask, char_map=False)
    assert frame.texts == () and frame.offsets == ()
    assert resolve.resolve(frame, Where(index=-1)) == (((10,), (10,)), ("", ""))


# ---------------------------------------------------------------- variable anchors


def test_all_of_an_anchor_is_every_overlapping_token(weekdays):
    """seed 000:143,147 — the run is every token overlapping the anchor's characters.
    SPEC.md:245 [P23] SPEC.md:205 [P8]"""
    _ids, _mask, frame = weekdays
    where = Where(all=True, scope=Anchor(variable="e"))
    windows, reasons = resolve.resolve(frame, where, ("Thursday", "Friday"))
    assert (windows, reasons) == (((4, 5, 6), (6,)), ("", ""))
    assert _tokens(frame, windows) == ["' Thursday'", "' Friday'"]


def test_spelling_of_an_anchored_all():
    """seed 000:143 — the compact spelling of {all, scope variable}. SPEC.md:186 [P1]"""
    assert Where(all=True, scope=Anchor(variable="e")).spelling() == "{all scope:{variable:e}}"


def test_index_minus_one_is_the_anchors_last_token(weekdays):
    """seed 000:58,144 — negatives count from the end of the run: Thursday's last piece is 'day'.
    SPEC.md:199 [P5] SPEC.md:650 [X4]"""
    _ids, _mask, frame = weekdays
    where = Where(index=-1, scope=Anchor(variable="e"))
    windows, reasons = resolve.resolve(frame, where, ("Thursday", "Friday"))
    assert (windows, reasons) == (((6,), (6,)), ("", ""))
    assert _tokens(frame, windows) == ["'day'", "' Friday'"]


def test_anchor_found_twice_is_ambiguous(weekdays):
    """seed 000:112,145 — 'day' is in today and in Thursday/Friday. SPEC.md:237 [P20]"""
    _ids, _mask, frame = weekdays
    result = resolve.resolve(frame, Where(index=-1, scope=Anchor(variable="e")), ("day", "day"))
    assert result == (((), ()), ("alignment_ambiguous", "alignment_ambiguous"))


def test_anchor_absent_or_none_is_missing(weekdays):
    """seed 000:199 — a row whose anchor text is not in its prompt gets an empty window and a reason.
    SPEC.md:237 [P20]"""
    _ids, _mask, frame = weekdays
    result = resolve.resolve(frame, Where(index=-1, scope=Anchor(variable="e")), ("Sunday", None))
    assert result == (((), ()), ("alignment_missing", "alignment_missing"))


def test_anchor_index_moves_with_the_tokens_after_it(llama):
    """seed 000:179-193 — ' Tuesday' is three tokens, so the number's index is 8 or 6.
    SPEC.md:199 [P5] SPEC.md:650 [X4]"""
    _ids, _mask, frame = resolve.frame_of_texts(llama, ARITHMETIC)
    windows, reasons = resolve.resolve(
        frame, Where(index=-1, scope=Anchor(variable="number")), ("one", "three", "two", "five")
    )
    assert (windows, reasons) == (((8,), (8,), (6,), (6,)), ("", "", "", ""))
    assert _tokens(frame, windows) == ["' one'", "' three'", "' two'", "' five'"]


# ---------------------------------------------------------------- position 0 and BOS


def test_special_prefix_is_bos_on_llama(llama):
    """seed 000:151,168 — what the tokenizer makes of "" is what it adds to everything.
    SPEC.md:253 [P24]"""
    assert resolve.special_prefix(llama) == (1,)


def test_index_zero_is_the_first_word_on_llama(llama):
    """seed 000:168 — the run starts after BOS, so index 0 is 'If'. SPEC.md:253 [P24] SPEC.md:255 [P25] SPEC.md:650 [X4]"""
    ids, _mask, frame = resolve.frame_of_texts(llama, [WEEKDAYS[0]])
    windows, _reasons = resolve.resolve(frame, Where(index=0))
    assert ids[0][:4] == (1, 960, 9826, 338) and frame.starts == (1,)
    assert windows == ((1,),) and resolve.tokens_of(frame, windows[0], 0) == "'If'"


def test_special_prefix_is_empty_on_gpt2(gpt2):
    """seed 000:151,169 — GPT-2's BPE prepends nothing. SPEC.md:253 [P24]"""
    assert resolve.special_prefix(gpt2) == ()


def test_index_zero_is_the_prompts_own_text_on_gpt2(gpt2):
    """seed 000:169-171 — index 0 is the start of the prompt's text, not a marker.
    SPEC.md:253 [P24] SPEC.md:255 [P25]"""
    _ids, _mask, frame = resolve.frame_of_texts(gpt2, [WEEKDAYS[0]])
    windows, _reasons = resolve.resolve(frame, Where(index=0))
    assert frame.starts == (0,) and windows == ((0,),)
    token = ast.literal_eval(resolve.tokens_of(frame, windows[0], 0))
    assert token and "If".startswith(token)


# ---------------------------------------------------------------- chat turns


def test_chat_sample_text_keeps_the_inner_control_tokens(chat):
    """seed 000:83-84 — content excludes the BOS prefix but decodes the `</s><s>` between turns.
    SPEC.md:211 [P10]"""
    assert chat.texts[0] == CHAT_SAMPLE


def test_segments_of_chat_turns():
    """seed 000:81,86-87 — each content searched forward; role[k] names, bare role if it spoke once.
    SPEC.md:213 [P11]"""
    assert resolve.segments_of(CHAT_SAMPLE, CHAT) == {
        "user[0]": (7, 22),
        "assistant[0]": (31, 40),
        "user[1]": (55, 88),
        "assistant": (31, 40),
    }


def test_last_token_of_the_second_user_turn(chat):
    """seed 000:89,91 — the segment's -1 is the question's last token. SPEC.md:213 [P11] SPEC.md:199 [P5]"""
    windows, reasons = resolve.resolve(chat, Where(index=-1, scope=Anchor(segment="user[1]")))
    assert (windows, reasons) == (((32,),), ("",))
    assert _tokens(chat, windows) == ["' is'"]


def test_last_token_of_a_chat_prompt_is_the_template_close(chat):
    """seed 000:89,92 — unscoped -1 is the template's closing [/INST]. SPEC.md:189 [P2] SPEC.md:193 [P3]"""
    windows, reasons = resolve.resolve(chat, Where(index=-1))
    assert (windows, reasons) == (((36,),), ("",))
    assert _tokens(chat, windows) == ["']'"]


def test_bare_role_that_spoke_twice_is_ambiguous(chat):
    """seed 000:81 — the bare name of a role that spoke twice is alignment_ambiguous.
    SPEC.md:218 [P12]"""
    where = Where(index=-1, scope=Anchor(segment="user"))
    assert resolve.resolve(chat, where) == (((),), ("alignment_ambiguous",))


def test_bare_role_that_spoke_twice_is_ambiguous_when_a_later_turn_was_not_found(llama):
    """seed 000:81 SPEC.md:218 [P12] — the Llama-2 template trims each content, so a second user turn that
    ends in a space is not found as itself; the bare name is still alignment_ambiguous, not missing."""
    chat = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Yes."},
            {"role": "user", "content": "Again?\n"}]
    text = data.render_chat(llama, chat)
    assert text == "[INST] Hi. [/INST] Yes. </s><s>[INST] Again? [/INST]"
    segments = resolve.segments_of(text, chat)
    assert segments["user[0]"] == (7, 10) and segments["user[1]"] is None
    frame = Frame(starts=(0,), ends=(1,), texts=(text,), offsets=((0, len(text)),), segments=(segments,))
    assert resolve.resolve(frame, Where(index=-1, scope=Anchor(segment="user"))) == (((),), ("alignment_ambiguous",))
    assert resolve.resolve(frame, Where(index=-1, scope=Anchor(segment="user[1]"))) == (((),), ("alignment_missing",))


def test_a_turn_is_found_as_itself_not_trimmed(llama):
    """seed 000:87 SPEC.md:213 [P11] — the Llama-2 template trims each content, so 'Thursday.\\n' is rendered
    'Thursday.' and that turn is unfound: no character range, and asking for it is alignment_missing. Read trimmed, the
    turn would have been found at 31..40; the seed finds each content as itself, so it is not."""
    chat = [{"role": "user", "content": "Name a weekday."}, {"role": "assistant", "content": "Thursday.\n"},
            {"role": "user", "content": "And?"}]
    text = data.render_chat(llama, chat)
    assert text == "[INST] Name a weekday. [/INST] Thursday. </s><s>[INST] And? [/INST]"
    segments = resolve.segments_of(text, chat)
    assert segments["assistant[0]"] is None and segments["assistant"] is None
    assert text[31:40] == "Thursday."
    frame = Frame(starts=(0,), ends=(1,), texts=(text,), offsets=((0, len(text)),), segments=(segments,))
    where = Where(all=True, scope=Anchor(segment="assistant"))
    assert resolve.resolve(frame, where) == (((),), ("alignment_missing",))


def test_missing_segment_is_missing(chat):
    """seed 000:322 — a segment the frame did not find (no system turn) is alignment_missing.
    SPEC.md:237 [P20]"""
    where = Where(index=-1, scope=Anchor(segment="system"))
    assert resolve.resolve(chat, where) == (((),), ("alignment_missing",))


def test_variable_inside_a_segment_is_unique(chat):
    """seed 000:94 — segment + variable searches inside the turn, so the assistant's Thursday
    does not count. SPEC.md:220 [P13]"""
    anywhere = resolve.resolve(chat, Where(all=True, scope=Anchor(variable="e")), ("Thursday",))
    assert anywhere == (((),), ("alignment_ambiguous",))
    where = Where(all=True, scope=Anchor(segment="user[1]", variable="e"))
    windows, reasons = resolve.resolve(chat, where, ("Thursday",))
    assert reasons == ("",) and _tokens(chat, windows) == ["' Thursday'"]
    assert all(chat.offsets[0][i - chat.starts[0]] >= 55 for i in windows[0])


# ---------------------------------------------------------------- cuts, width and ragged


def test_positions_per_row_of_each_cut():
    """seed 000:58,326-328 — 1 for index, n for last, b-a for same-sign spans, None otherwise.
    SPEC.md:359 [P46]"""
    assert Where(index=-1).per_row == 1
    assert Where(last=3).per_row == 3
    assert Where(span=(-4, -1)).per_row == 3
    assert Where(span=(1, 4)).per_row == 3
    assert Where(all=True).per_row is None
    assert Where(span=(1, -1)).per_row is None


def test_ragged_iff_width_unknown_or_scoped():
    """seed 000:328 — ragged when only a row knows the width, or when anchored. SPEC.md:361 [P47]"""
    assert not Where(index=-1).ragged
    assert not Where(last=3).ragged
    assert Where(index=-1, scope=Anchor(variable="entity")).ragged
    assert Where(all=True).ragged
    assert Where(span=(1, -1)).ragged


def test_a_continuation_spec_is_not_ragged_at_its_address():
    """seed 000:332 SPEC.md:361 [P47] — a decode step processes one position, so no continuation-frame spec
    is ragged where it taps; which steps a row keeps (the cut over the stack) is still uneven."""
    for where in (Where(frame="generated", all=True), Where(frame="generated", index=-1),
                  Where(frame="generated", index=-1, scope=Anchor(variable="said"))):
        assert not where.ragged
    assert Where(frame="generated", all=True).uneven
    assert Where(frame="generated", index=-1, scope=Anchor(variable="said")).uneven
    assert not Where(frame="generated", index=-1).uneven


@pytest.mark.parametrize("cuts", [{}, {"index": -1, "last": 2}, {"span": (0, 2), "all": True}])
def test_a_where_with_no_cut_or_two_cannot_be_built(cuts):
    """SPEC.md:196 [P57] — a Where names exactly one cut or is not built, with the validator's own text."""
    named = [c for c in ("index", "span", "last", "all") if c in cuts]
    message = f"a position names exactly one of index/span/last/all, got {named}"
    with pytest.raises(ValueError, match=re.escape(message)):
        Where(**cuts)


def test_last_longer_than_the_row_is_out_of_range():
    """seed 000:206 — {"last": 12} on a nine-token row does not fit it. SPEC.md:239 [P21]"""
    frame = Frame(starts=(0,), ends=(9,))
    assert resolve.resolve(frame, Where(last=12)) == (((),), ("out_of_range",))


def test_index_past_the_row_is_out_of_range(weekdays):
    """seed 000:206 — {"index": 40} fits none of these rows. SPEC.md:239 [P21]"""
    _ids, _mask, frame = weekdays
    assert resolve.resolve(frame, Where(index=40)) == (((), ()), ("out_of_range", "out_of_range"))


def test_mixed_sign_span_resolves_per_row(weekdays):
    """seed 000:58 — a mixed-sign span's width is only known once the row is. SPEC.md:203 [P7]"""
    _ids, _mask, frame = weekdays
    windows, reasons = resolve.resolve(frame, Where(span=(1, -1)))
    assert reasons == ("", "")
    assert windows == (tuple(range(2, 10)), tuple(range(4, 10)))


def test_negative_span_counts_from_the_end(weekdays):
    """seed 000:58 — [-4, -1] is the three tokens before the last. SPEC.md:203 [P7] SPEC.md:199 [P5]"""
    _ids, _mask, frame = weekdays
    windows, reasons = resolve.resolve(frame, Where(span=(-4, -1)))
    assert (windows, reasons) == (((7, 8, 9), (7, 8, 9)), ("", ""))


# ---------------------------------------------------------------- the generated frame

GENERATED = [
    [450, 3250, 338, 2, 450, 3250],  # stops at step 3
    [450, 3250, 338, 29889, 450, 3250],  # never stops
]


def test_continuation_ends_at_the_first_stop_token(llama):
    """seed 000:269 — a row ends at its first stop token, which it keeps; one that never
    stopped keeps the bound. SPEC.md:319 [P37]"""
    frame = resolve.frame_of_continuation(llama, GENERATED, llama.eos_token_id)
    assert frame.name == "generated"
    assert frame.starts == (0, 0) and frame.ends == (4, 6)


def test_eos_segment_is_the_stop_token(llama):
    """seed 000:269,322 — eos is the segment the continuation invents: the stop token.
    SPEC.md:319 [P37]"""
    frame = resolve.frame_of_continuation(llama, GENERATED, llama.eos_token_id)
    windows, reasons = resolve.resolve(frame, Where(frame="generated", index=-1, scope=Anchor(segment="eos")))
    assert windows[0] == (3,) and reasons[0] == ""
    assert resolve.tokens_of(frame, windows[0], 0) == "'</s>'"


def test_row_that_never_stopped_has_no_eos(llama):
    """seed 000:269,322 — no stop token, no eos segment: alignment_missing. SPEC.md:319 [P37]"""
    frame = resolve.frame_of_continuation(llama, GENERATED, [llama.eos_token_id])
    windows, reasons = resolve.resolve(frame, Where(frame="generated", index=-1, scope=Anchor(segment="eos")))
    assert windows[1] == () and reasons[1] == "alignment_missing"


def test_generated_negative_index_counts_from_the_rows_own_end(llama):
    """seed 000:269 — how far a row meant to generate is a result: -1 is its own last step.
    SPEC.md:328 [P40]"""
    frame = resolve.frame_of_continuation(llama, torch.tensor(GENERATED), llama.eos_token_id)
    assert resolve.resolve(frame, Where(frame="generated", index=-1)) == (((3,), (5,)), ("", ""))


def test_continuation_map_comes_from_the_ids(llama):
    """seed 000:271 — the continuation's character map is built from its ids by decoding.
    SPEC.md:322 [P38]"""
    frame = resolve.frame_of_continuation(llama, GENERATED, llama.eos_token_id)
    assert frame.offsets[1] == resolve.char_map(llama, GENERATED[1])
    assert frame.texts[1] == llama.decode(GENERATED[1])


# ---------------------------------------------------------------- the resolver's order, spellings, BOS


def test_the_run_is_found_before_it_is_cut(weekdays):
    """seed 000:52 SPEC.md:189 [P2] — find the run, cut it, check the cut: an anchor that is missing is
    alignment_missing whatever the cut; a found anchor with a cut past its end is out_of_range; no scope
    is the row's whole content (index -1 is the prompt's last token)."""
    _ids, _mask, frame = weekdays
    deep = Where(index=40, scope=Anchor(variable="e"))
    assert resolve.resolve(frame, deep, ("Sunday", "Friday")) == (((), ()), ("alignment_missing", "out_of_range"))
    assert resolve.resolve(frame, Where(index=-1)) == (((10,), (10,)), ("", ""))  # left padding
    assert resolve.resolve(frame, Where(index=0)) == (((1,), (3,)), ("", ""))


def test_all_is_every_token_of_the_run(weekdays):
    """seed 000:58 SPEC.md:205 [P8] — unscoped, {"all": true} is the row's whole content, BOS and padding
    excluded; scoped, the anchor's tokens."""
    _ids, _mask, frame = weekdays
    windows, reasons = resolve.resolve(frame, Where(all=True))
    assert reasons == ("", "") and windows == (tuple(range(1, 11)), tuple(range(3, 11)))
    assert _tokens(frame, windows) == [repr(WEEKDAYS[0]), repr(WEEKDAYS[1])]


def test_the_first_spelling_with_a_hit_decides(llama):
    """seed 000:112 SPEC.md:235 [P19] SPEC.md:237 [P20] — the value, then " " + value, then the stripped
    value: "day" hits twice in "I said day and Monday" and is ambiguous although " day" hits once;
    " day" itself resolves; "Thursday " (trailing space) is found only stripped."""
    _ids, _mask, frame = resolve.frame_of_texts(llama, ["I said day and Monday"])
    where = Where(all=True, scope=Anchor(variable="e"))
    assert resolve.resolve(frame, where, ("day",)) == (((),), ("alignment_ambiguous",))
    windows, reasons = resolve.resolve(frame, where, (" day",))
    assert reasons == ("",) and _tokens(frame, windows) == ["' day'"]
    _ids, _mask, weekday = resolve.frame_of_texts(llama, [WEEKDAYS[0]])
    windows, reasons = resolve.resolve(weekday, where, ("Thursday ",))
    assert reasons == ("",) and _tokens(weekday, windows) == ["' Thursday'"]
    assert resolve.resolve(weekday, where, ("Sunday",)) == (((),), ("alignment_missing",))


def test_a_span_selects_the_tokens_it_overlaps(weekdays):
    """seed 000:147 SPEC.md:245 [P23] — "rsda" lies inside no token: it overlaps 'urs' and 'day', and those
    two are the run, though neither is contained in it."""
    _ids, _mask, frame = weekdays
    windows, reasons = resolve.resolve(frame, Where(all=True, scope=Anchor(variable="e")), ("rsda", "rida"))
    assert reasons == ("", "") and windows[0] == (5, 6)
    assert _tokens(frame, windows)[0] == "'ursday'"


def test_the_prefix_is_not_addressable(weekdays, llama):
    """seed 000:173 SPEC.md:255 [P25] — index 0 is the first content token, never BOS; counting back from the
    end stops at the content (-10 is 'If', -11 is out_of_range); there is no segment 'bos'."""
    _ids, _mask, frame = weekdays
    assert resolve.resolve(frame, Where(index=-10)) == (((1,), ()), ("", "out_of_range"))
    assert resolve.resolve(frame, Where(index=-11)) == (((), ()), ("out_of_range", "out_of_range"))
    assert resolve.resolve(frame, Where(span=(0, 2)))[0][0] == (1, 2)
    bos = Where(index=0, scope=Anchor(segment="bos"))
    assert resolve.resolve(frame, bos) == (((), ()), ("alignment_missing", "alignment_missing"))
    assert resolve.resolve(frame, Where(index=0, scope=Anchor(variable="e")), ("<s>", "<s>"))[1] == (
        "alignment_missing", "alignment_missing")


def test_tokens_is_the_character_map_slice_not_the_window_decoded_alone(llama):
    """SPEC.md:304 [P34] seed 000:141 — on 'If today is Thursday, tomorrow is' the window of `Th urs day` is
    ' Thursday', `day` alone is 'day', the last token is ' is', while its id decoded alone is 'is'."""
    _ids, _mask, frame = resolve.frame_of_texts(llama, ["If today is Thursday, tomorrow is"])
    start = frame.starts[0]
    pieces = llama.convert_ids_to_tokens(list(_ids[0][start:frame.ends[0]]))
    assert pieces == ["▁If", "▁today", "▁is", "▁Th", "urs", "day", ",", "▁tom", "orrow", "▁is"]
    th, day, last = start + 3, start + 5, frame.ends[0] - 1
    assert resolve.tokens_of(frame, [th, th + 1, day], 0) == "' Thursday'"
    assert resolve.tokens_of(frame, [day], 0) == "'day'"
    assert resolve.tokens_of(frame, [last], 0) == "' is'" and repr(llama.decode([_ids[0][last]])) == "'is'"
    assert resolve.tokens_of(frame, [], 0) == ""
