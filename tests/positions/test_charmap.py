"""The linear character map (SPEC.md §11 Performance, Q1-Q4) against the decode-prefix definition (P22).

`resolve.char_map` is the definition and the oracle; `resolve.linear_char_map` is what the run builds. Identity
is checked on both fixture tokenizers (Llama sentencepiece with byte fallback, the byte-level BPE) over
generated text: byte-fallback pieces, emoji, combining marks, CJK, whitespace runs and special-token text.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from causalab_ref.fixtures import builder
from causalab_ref.positions import resolve

pytestmark = pytest.mark.fast  # the edit-test loop's subset: `pytest -m fast` (README)

PIECES = ["If", " today", " is", "Thursday", ",", " tomorrow", "12", "2024", "é", "e\u0301", "\u0301", "naïve",
          "日本語", "鿰", "𠀀", "\u3042", "😀", "🤖🤖", "👍🏽", "🇫🇷", "Ωmega", "—", "ﬁ", "\u200b", " ", "  ", "   ",
          "\n", "\n\n", "\t", " \n ", "</s>", "<s>", "<|endoftext|>", "'s", "(x)", "Zürich"]
TEXTS = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module", params=["fixture:tiny-llama", "fixture:tiny-gpt2"])
def tok(request):
    return builder.tokenizer(request.param)


def test_both_fixture_tokenizers_are_served(tok):
    """SPEC.md:1672 [Q2] — the sentencepiece and the byte-level BPE fixtures take the linear map."""
    assert resolve.linear_map_serves(tok)


@SETTINGS
@given(text=TEXTS, end=st.integers(min_value=0, max_value=200))
def test_the_linear_map_is_the_definition_on_generated_text(tok, text, end):
    """SPEC.md:1665 [Q1] SPEC.md:1679 [Q3] — identical offsets on a whole row and on the same row truncated anywhere
    (truncated mid-character, it ends in bytes that never make a character)."""
    ids = tok.encode(text, add_special_tokens=False)
    assert resolve.linear_char_map(tok, ids) == resolve.char_map(tok, ids)
    assert resolve.linear_char_map(tok, ids[:end]) == resolve.char_map(tok, ids[:end])


@SETTINGS
@given(ids=st.lists(st.integers(min_value=0, max_value=999), max_size=30))
def test_the_linear_map_is_the_definition_on_any_ids(tok, ids):
    """SPEC.md:1665 [Q1] SPEC.md:1679 [Q3] — ids no encoder produced (stray byte pieces, special tokens anywhere)
    map as the definition maps them, as a continuation's do."""
    assert resolve.linear_char_map(tok, ids) == resolve.char_map(tok, ids)


class _Counting:
    """A tokenizers backend that counts the ids it decodes."""

    def __init__(self, backend):
        self.backend, self.ids = backend, 0

    def decode(self, ids, **kwargs):
        self.ids += len(ids)
        return self.backend.decode(ids, **kwargs)

    def decode_batch(self, rows, **kwargs):
        self.ids += sum(map(len, rows))
        return self.backend.decode_batch(rows, **kwargs)

    def __getattr__(self, name):
        return getattr(self.backend, name)


def test_the_run_maps_a_long_row_in_linear_work(tok, monkeypatch):
    """SPEC.md:1665 [Q1] — a frame of a row of some 400 tokens is built without the definition and decodes a
    bounded number of ids per token (the definition decodes about n * n / 2 of them), with the same offsets."""
    text = " ".join(["If today is Thursday, 日本語 é 😀 tomorrow is"] * 16)
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > 300
    want = resolve.char_map(tok, ids)
    counting = _Counting(tok.backend_tokenizer)
    monkeypatch.setattr(tok, "_tokenizer", counting)
    monkeypatch.setattr(resolve, "char_map", lambda *a: pytest.fail("the definition was used"))
    frame = resolve.frame_of_ids(tok, [ids], [[1] * len(ids)])
    assert frame.offsets[0] == want
    assert counting.ids <= 20 * len(ids) < len(ids) ** 2 // 2


def test_a_byte_piece_that_never_makes_a_character_is_placed_as_the_definition_places_it(tok, monkeypatch):
    """SPEC.md:1679 [Q3] — a lone byte piece decodes to U+FFFD, so its prefix is a prefix of the text and the piece
    covers a character there; the linear map places it where the definition does, not as a miss, and maps
    the rest of the row by decoded stretches (the whole-row definition is not called)."""
    byte = next(i for i in range(1000) if tok.decode([i]) == "\ufffd")
    ids = tok.encode("If today", add_special_tokens=False) + [byte] + tok.encode(" is", add_special_tokens=False)
    text, k = tok.decode(ids), len(tok.encode("If today", add_special_tokens=False))
    want = resolve.char_map(tok, ids)
    assert "\ufffd" in text and want[k + 1] > want[k]
    monkeypatch.setattr(resolve, "char_map", lambda *a: pytest.fail("the whole-row definition was used"))
    assert resolve.linear_char_map(tok, ids) == want


def test_other_tokenizers_get_the_definition():
    """SPEC.md:1672 [Q2] — a WordPiece tokenizer (its decoder joins with spaces and merges '##'), a slow Python
    tokenizer and a tokenizer class that overrides decode are not served; their frames use the definition."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "hel": 1, "##lo": 2, "world": 3, ",": 4}, unk_token="[UNK]"))
    wordpiece.pre_tokenizer, wordpiece.decoder = pre_tokenizers.BertPreTokenizer(), decoders.WordPiece()
    tok = PreTrainedTokenizerFast(tokenizer_object=wordpiece)
    assert not resolve.linear_map_serves(tok)
    ids = tok.encode("hello, world")
    assert resolve.frame_of_ids(tok, [ids], [[1] * len(ids)]).offsets[0] == resolve.char_map(tok, ids)

    class Overriding(PreTrainedTokenizerFast):
        def _decode(self, token_ids, **kwargs):
            return super()._decode(token_ids, **kwargs).upper()

    llama = Tokenizer.from_str(builder.tokenizer("fixture:tiny-llama").backend_tokenizer.to_str())
    assert resolve.linear_map_serves(PreTrainedTokenizerFast(tokenizer_object=llama))
    assert not resolve.linear_map_serves(Overriding(tokenizer_object=llama))
    assert not resolve.linear_map_serves(object())


class _Words:
    """A tokenizer over whole words whose decode is not local: `mark` is what a decode of more than `above`
    ids says before (a quote marker) or after (an end marker) the words."""

    def __init__(self, before: str = "", after: str = "", above: int = 2):
        self.before, self.after, self.above, self.backend_tokenizer = before, after, above, self

    def decode(self, ids, **kwargs):
        text = " ".join(f"w{i}" for i in ids)
        return self.before + text + self.after if len(ids) > self.above else text


def test_stretches_that_do_not_rebuild_the_row_fall_back_to_the_definition():
    """SPEC.md:1684 [Q4] — an end marker only a long decode writes: every short stretch extends its head, but the
    pieces miss the marker and do not rebuild the text, so the row is mapped by the definition (the stretches
    alone would place every long prefix, which the definition does not)."""
    tok, ids = _Words(after=" END", above=11), list(range(20))
    assert resolve.linear_char_map(tok, ids) == resolve.char_map(tok, ids)


def test_a_stretch_that_does_not_extend_its_head_falls_back_to_the_definition():
    """SPEC.md:1684 [Q4] — a quote marker a decode of three ids writes: once the stretch starts past the first
    clean prefix, a stretch of three no longer starts with its head of two, and the row is mapped by the definition."""
    tok, ids = _Words(before="> ", above=2), list(range(20))
    assert resolve.linear_char_map(tok, ids) == resolve.char_map(tok, ids)


def test_a_sentencepiece_row_is_mapped_from_its_pieces_with_one_decode(monkeypatch):
    """SPEC.md:1759 [Q14] — on the Llama fixture (the sentencepiece decoder) a frame of a long row with byte
    pieces decodes that row's ids once, for its text, and nothing else; the offsets are the definition's."""
    tok = builder.tokenizer("fixture:tiny-llama")
    assert resolve.decodes_by_pieces(tok) and not resolve.decodes_by_pieces(builder.tokenizer("fixture:tiny-gpt2"))
    ids = tok.encode(" ".join(["If today is Thursday, 日本語 鿰 é 😀 tomorrow is"] * 12), add_special_tokens=False)
    assert any(tok.convert_ids_to_tokens(i).startswith("<0x") for i in ids)
    want = resolve.char_map(tok, ids)
    counting = _Counting(tok.backend_tokenizer)
    monkeypatch.setattr(tok, "_tokenizer", counting)
    frame = resolve.frame_of_ids(tok, [ids], [[1] * len(ids)])
    assert frame.offsets[0] == want and counting.ids == len(ids)


def test_the_rows_of_one_frame_share_their_pieces_and_each_is_the_definition():
    """SPEC.md:1759 [Q14] — a frame's rows look each id's piece up once for all of them; rows without byte pieces
    (offsets as running lengths), with byte pieces, and with a leading space, each get the definition's offsets."""
    tok = builder.tokenizer("fixture:tiny-llama")
    texts = ["If today is Thursday, tomorrow is", "日本語 鿰 é 😀 Thursday", " leading space, Thursday again", "x"]
    rows = [tok.encode(t, add_special_tokens=False) for t in texts]
    width = max(map(len, rows))
    ids = [[0] * (width - len(r)) + r for r in rows]
    mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
    frame = resolve.frame_of_ids(tok, ids, mask)
    assert [frame.offsets[k] for k in range(len(rows))] == [resolve.char_map(tok, r) for r in rows]
    known: dict = {}
    for r in rows:
        text = tok.backend_tokenizer.decode(r, skip_special_tokens=False)
        assert resolve.pieces_char_map(tok, r, text, known) == resolve.char_map(tok, r)
    assert set(known) == {i for r in rows for i in r}
