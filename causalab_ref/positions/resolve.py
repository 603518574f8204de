"""Resolve: the position resolver — a `Where` and a row's own ids in, integer windows out.

It owns the frame (each row's content range inside the padded batch, its decoded
text and character map), the chat-turn segments of a rendered prompt, the
continuation frame of a decode, and resolution itself: find the run (the whole
content, a segment, a variable's text, or a variable inside a segment), cut it,
and check the cut is inside it. Rows that cannot be placed get an empty window
and a reason ('alignment_missing', 'alignment_ambiguous', 'out_of_range'); whether
that is a refusal is the caller's decision, never this module's.

    ids, mask, frame = frame_of_texts(tok, ["If today is Monday, tomorrow is"])
    windows, reasons = resolve(frame, Where(index=-1))  # per row: (its last token's index,), ""

A character map is defined by `char_map` (each token starts where the decoded prefix before it
ends, P22); `linear_char_map` and `pieces_char_map` are optimisations of it, equal to it (SPEC.md §11).
It imports nothing but the standard library, torch and shapes.py, so it runs
wherever the model's tokenizer is and needs no model library of its own.
Text is always decoded with special tokens kept (a chat prompt's `</s><s>` is part
of its content, and a stop token needs a character range) and without clean-up of
tokenization spaces (so every decoded prefix is a prefix of the whole).
SPEC.md §2 Positions.
"""
from __future__ import annotations

import json
import re
from bisect import bisect_left, bisect_right
from itertools import accumulate, chain, repeat
from operator import itemgetter
from typing import Optional, Sequence

from typing import TYPE_CHECKING

from .. import shapes

if TYPE_CHECKING:
    import torch
else:
    torch = shapes.Lazy("torch")  # imported when a tensor is first made (Q17)

# ---------------------------------------------------------------- decoding


def _decode(tok, ids: Sequence[int]) -> str:
    return tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _rows(x) -> Sequence[Sequence[int]]:
    """A 2-D tensor or a sequence of sequences, as rows of ints: a plan's tuple of tuples of ints as it is (one
    pass in C asks every entry's type; SPEC.md Q37), anything else converted to lists."""
    if isinstance(x, torch.Tensor):
        return x.long().tolist()
    if type(x) is tuple and _ints(x):
        return x
    return [list(map(int, row)) for row in x]


def _ints(rows: Sequence) -> bool:
    """Whether `rows` is a tuple of tuples of ints (bools not), asked in C: the rows a plan holds."""
    return all(type(row) is tuple for row in rows) and set(map(type, chain.from_iterable(rows))) <= {int}


def special_prefix(tok) -> tuple[int, ...]:
    """What the tokenizer puts before every prompt: the ids it makes of the empty string."""
    return tuple(int(i) for i in tok("", add_special_tokens=True)["input_ids"])


def char_map(tok, ids: Sequence[int]) -> tuple[int, ...]:
    """offsets[k] = the character where token k starts, from decoding growing prefixes (SPEC.md P22).

    The definition and the oracle, O(n) decodes of O(n) ids; frames are built by `linear_char_map`
    where the tokenizer is served (Q1, Q2).

    Kept non-decreasing; a prefix that does not decode to a prefix of the whole text
    (a byte-fallback piece in the middle of a character) reuses the previous offset.
    The final entry is len(text), so token k covers offsets[k]:offsets[k + 1].
    """
    ids = list(ids)
    text = _decode(tok, ids)
    offsets = [0]
    for k in range(1, len(ids)):
        offsets.append(_prefix_offset(tok, ids, k, text, offsets[-1]))
    return tuple(offsets[: len(ids)]) + (len(text),)


def _prefix_offset(tok, ids: list[int], k: int, text: str, before: int) -> int:
    """The definition at token k: the length of ids[:k] decoded when that is a prefix of the text, else `before`."""
    prefix = _decode(tok, ids[:k])
    return max(len(prefix) if text.startswith(prefix) else before, before)


# Decoders under which a prefix's text is the text of a clean prefix plus what a short stretch after it
# adds: each token's own string laid end to end, byte-fallback pieces joined to their neighbours, and at most
# a strip at the very start (SPEC.md Q2). These are the sentencepiece (Llama) and byte-level BPE (GPT-2) families.
LOCAL_DECODERS = ("ByteLevel", "Metaspace", "Replace", "ByteFallback", "Fuse", "Strip")
# transformers' decode of a fast tokenizer, when a model's tokenizer class does not override it: the backend's
# own decode and, with clean-up off, nothing else (4.x and 5.x spellings; engines/tokenjson.py's adapter, E14).
BACKEND_DECODES = ("TokenizersBackend._decode", "PreTrainedTokenizerFast._decode", "JsonTokenizer._decode")
DECODE_STRETCH = 8  # tokens a decoded stretch may cover before its start moves up to a later clean prefix


def _decoder_parts(decoder) -> list[dict]:
    """A tokenizers decoder as the list of its parts (a Sequence flattened), [] when it cannot be read."""
    try:
        state = json.loads(decoder.__getstate__())
    except Exception:  # not a tokenizers decoder: nothing to say about it
        return []
    parts = state.get("decoders", [state]) if state.get("type") == "Sequence" else [state]
    return [part for part in parts if isinstance(part, dict)]


def linear_map_serves(tok) -> bool:
    """Whether `linear_char_map` maps this tokenizer's rows (SPEC.md Q2): a fast tokenizer whose decode is the
    backend's own and whose decoder is local (no strip at the end)."""
    if getattr(getattr(type(tok), "_decode", None), "__qualname__", "") not in BACKEND_DECODES:
        return False
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return False
    parts = _decoder_parts(backend.decoder) if backend.decoder is not None else []
    return bool(parts) and all(part.get("type") in LOCAL_DECODERS and not part.get("stop") for part in parts)


# The sentencepiece decoder (Llama's), part for part: each piece's "▁" a space, each run of byte pieces `<0xHH>`
# the UTF-8 it spells, all joined, one leading space stripped. Its prefixes need no decode at all (SPEC.md Q14).
PIECE_DECODER = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
                 {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]
BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def decodes_by_pieces(tok) -> bool:
    """Whether the tokenizer's decoder is exactly PIECE_DECODER (Q14)."""
    decoder = getattr(getattr(tok, "backend_tokenizer", None), "decoder", None)
    return decoder is not None and _decoder_parts(decoder) == PIECE_DECODER


def _piece(backend, i: int) -> Optional[tuple[str, Optional[int]]]:
    """What PIECE_DECODER makes of id `i`: its piece with each "\u2581" a space, and its byte for a byte piece
    `<0xHH>` (else None); None for an id with no piece, or a piece that only looks like a byte piece (the
    decoder would read a byte there that the pattern does not)."""
    piece = backend.id_to_token(i)
    if piece is None:
        return None
    byte = BYTE_PIECE.fullmatch(piece)
    if byte is None and piece.startswith("<0x") and piece.endswith(">") and len(piece.encode()) == 6:
        return None
    return piece.replace("\u2581", " "), None if byte is None else int(byte.group(1), 16)


def pieces_char_map(tok, ids: Sequence[int], text: str, known: Optional[dict] = None) -> Optional[tuple[int, ...]]:
    """The offsets of `char_map` from the pieces alone, for PIECE_DECODER (SPEC.md Q14); None (the caller maps the
    row otherwise) for an unknown id, a row whose text holds U+FFFD, or pieces that do not spell `text` exactly.
    `known` holds each id's `_piece` once looked up (a frame's rows share it).

    The text of ids[:k] is the pieces before k laid end to end, less a leading space; inside a run of byte
    pieces it is whole only where the next byte starts a character (else it ends in U+FFFD, no prefix of the
    text, and the definition keeps the previous offset). So offsets are running lengths, one pass, no decode.
    """
    known = {} if known is None else known
    ids = list(map(int, ids))
    backend = tok.backend_tokenizer
    known.update((i, _piece(backend, i)) for i in set(ids).difference(known))
    entries = list(map(known.__getitem__, ids))
    if "\ufffd" in text or None in entries:
        return None
    pieces, values = list(map(itemgetter(0), entries)), list(map(itemgetter(1), entries))  # (piece, byte) each
    plain = values.count(None) == len(values)  # no byte pieces: the lengths are the pieces' own, one C pass
    spelled, lengths = ("".join(pieces), None) if plain else _spelled(pieces, values)
    strip = 1 if spelled.startswith(" ") else 0
    if spelled[strip:] != text:
        return None
    if lengths is None:  # ids[:k] spells the first k pieces: running lengths, non-decreasing from 0
        offsets = list(accumulate(map(len, pieces[:len(ids) - 1]), initial=-strip))  # ids[:k] less the strip
        if strip:  # the stripped space's own prefixes are at 0, not -1: a prefix of -1s, as the lengths never fall
            offsets[:bisect_right(offsets, -1)] = repeat(0, bisect_right(offsets, -1))
        return tuple(offsets[: len(ids)]) + (len(text),)
    offsets = [0]
    for k in range(1, len(ids)):
        at = lengths[k] - strip if lengths[k] > 0 else (0 if lengths[k] == 0 else -1)
        offsets.append(max(at, offsets[-1]))
    return tuple(offsets[: len(ids)]) + (len(text),)


def _spelled(pieces: list[str], values: list[Optional[int]]) -> tuple[str, list[int]]:
    """What a row's pieces spell (each run of byte pieces as the UTF-8 it makes), and lengths[k], the length
    ids[:k] spells before the strip, -1 where ids[:k] ends inside a character (pieces_char_map)."""
    parts, byte_run, lengths, length = [], bytearray(), [0], 0
    for k, (piece, byte) in enumerate(zip(pieces, values)):
        if byte is None:
            if byte_run:
                parts.append(byte_run.decode("utf-8", errors="replace"))
                byte_run = bytearray()
            parts.append(piece)
            length += len(piece)
        else:
            byte_run.append(byte)
            length += (byte & 0xC0) != 0x80  # a byte that starts a character adds it
        after = values[k + 1] if k + 1 < len(values) else None
        lengths.append(length if byte is None or after is None or (after & 0xC0) != 0x80 else -1)
    if byte_run:
        parts.append(byte_run.decode("utf-8", errors="replace"))
    return "".join(parts), lengths


def linear_char_map(tok, ids: Sequence[int], text: Optional[str] = None, by_pieces: Optional[bool] = None,
                    known: Optional[dict] = None) -> tuple[int, ...]:
    """The offsets of `char_map` in linear time (SPEC.md Q1), for a tokenizer `linear_map_serves`; `text` is the
    row's decoded text when the caller has it. A sentencepiece decoder's rows are mapped from their pieces (Q14);
    a caller mapping many rows says once whether it is one (`by_pieces`) and shares the pieces looked up (`known`).

    A clean prefix is a prefix of the ids that decodes to a prefix of the text without U+FFFD. Each prefix is
    decoded as a stretch of a few tokens from the end `ctx` of a clean prefix; what it adds to the stretch of
    the last clean prefix (`head`) is what the prefix adds to the text, so the prefix is a prefix of the text
    exactly when that addition is found there. `ctx` moves up to the end of the clean prefix before the last
    one, never to the last, so a stretch's first token is stripped as in its head. A stretch holding U+FFFD
    ends inside a character: no prefix of the text, unless the text holds U+FFFD too, and then that position
    is the definition's (Q3). A row whose pieces do not rebuild its text (Q4; a stretch that does not extend
    its head says so at once) is mapped by the definition.
    """
    ids = list(ids)
    text = _decode(tok, ids) if text is None else text
    from_pieces = pieces_char_map(tok, ids, text, known) if (
        decodes_by_pieces(tok) if by_pieces is None else by_pieces) else None
    if from_pieces is not None:
        return from_pieces
    garbled = "\ufffd" in text
    decode = tok.backend_tokenizer.decode
    offsets, clean, ctx, head, length = [0], [0], 0, "", 0
    for k in range(1, len(ids) + 1):
        stretch = decode(ids[ctx:k], skip_special_tokens=False)
        if "\ufffd" in stretch:
            offsets.append(_prefix_offset(tok, ids, k, text, offsets[-1]) if garbled else offsets[-1])
            continue
        if not stretch.startswith(head):
            return char_map(tok, ids)  # not a local decode after all (Q4)
        tail = stretch[len(head):]
        if text.startswith(tail, length):
            length, head = length + len(tail), stretch
            clean.append(k)  # ids[:k] is a clean prefix
            if k - ctx > DECODE_STRETCH:
                ctx = clean[-2]
                head = decode(ids[ctx:k], skip_special_tokens=False)
        offsets.append(max(length, offsets[-1]))
    if len(ids) and offsets[-1] != len(text):
        return char_map(tok, ids)  # the stretches did not rebuild the text (Q4)
    return tuple(offsets[: len(ids)]) + (len(text),)


def row_map(tok, ids: Sequence[int], linear: bool, text: Optional[str] = None, by_pieces: Optional[bool] = None,
            known: Optional[dict] = None) -> tuple[int, ...]:
    """A row's character map: linear where the tokenizer is served (Q2), else the definition (P22); `text` is
    the row's decoded text when the caller has it; `by_pieces` and `known` as for `linear_char_map`."""
    return linear_char_map(tok, ids, text, by_pieces, known) if linear else char_map(tok, ids)


# ---------------------------------------------------------------- frames


def _content_range(row: Sequence[int], mask: Sequence[int], prefix: tuple[int, ...], r: int) -> tuple[int, int]:
    real = list(map(bool, mask))
    if True not in real:
        return 0, 0
    first, end = real.index(True), len(real) - real[::-1].index(True)
    if not all(real[first:end]):
        raise ValueError(f"row {r}: padding is not contiguous (mask {mask})")
    if prefix and tuple(row[first : first + len(prefix)]) == prefix:
        first += len(prefix)
    return first, end


def frame_of_ids(tok, ids, mask, segments=None, char_map=True) -> shapes.Frame:
    """The prompt frame of a padded batch (left or right padding).

    `segments`, when given, is per row a dict name -> (lo, hi) character range in that
    row's decoded content. `char_map=False` builds no texts or offsets: a pass whose
    positions are all bare integers needs only the content ranges.
    """
    rows, masks = _rows(ids), _rows(mask)
    prefix = special_prefix(tok)
    ranges = [_content_range(row, m, prefix, r) for r, (row, m) in enumerate(zip(rows, masks))]
    starts = tuple(lo for lo, _ in ranges)
    ends = tuple(hi for _, hi in ranges)
    segs = tuple(dict(s or {}) for s in segments) if segments is not None else tuple({} for _ in rows)
    if not char_map:
        return shapes.Frame(starts=starts, ends=ends, segments=segs)
    texts, offsets = texts_and_maps(tok, [list(row[lo:hi]) for row, (lo, hi) in zip(rows, ranges)])
    return shapes.Frame(starts=starts, ends=ends, texts=texts, offsets=offsets, segments=segs)


def texts_and_maps(tok, contents: list[list[int]]) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """Each row's decoded text and character map, the rows of one frame (a prompt's contents, or generated ids).

    A served tokenizer's decode is its backend's (Q2): the same text without transformers' wrapper, every row's
    in one call (the backend's decode_batch is its decode of each, Q34); whether the decoder is the sentencepiece
    one is asked once and each id's piece looked up once, for every row (Q14)."""
    linear = linear_map_serves(tok)
    texts = tuple(tok.backend_tokenizer.decode_batch(contents, skip_special_tokens=False) if linear
                  else (_decode(tok, c) for c in contents))
    by_pieces = linear and decodes_by_pieces(tok)
    known: dict[int, Optional[tuple[str, Optional[int]]]] = {}
    return texts, tuple(row_map(tok, c, linear, t, by_pieces, known) for c, t in zip(contents, texts))


def frame_chunk(frame: shapes.Frame, lo: int, hi: int) -> shapes.Frame:
    """Rows lo..hi of a frame: what `frame_of_ids` builds from those rows alone at the same padded length: each
    row's content range, text, offsets and segments are its own (a --batch-size chunk's frame, SPEC.md Q26)."""
    if (lo, hi) == (0, len(frame.starts)):
        return frame
    return shapes.Frame(starts=frame.starts[lo:hi], ends=frame.ends[lo:hi], texts=frame.texts[lo:hi],
                        offsets=frame.offsets[lo:hi], segments=frame.segments[lo:hi], name=frame.name)


def with_pad(tok):
    """The tokenizer, with a missing pad token set to its EOS token (SPEC.md R2); the one place this is done.
    A tokenizer with neither cannot pad a batch: refused at model.key."""
    if tok.pad_token is None and tok.eos_token is None:
        raise shapes.Refusal("the checkpoint's tokenizer has neither a pad token nor an EOS token, so a batch of "
                             "rows cannot be padded; give its tokenizer_config.json a `pad_token` or an `eos_token`",
                             path="model.key", stage="compile")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def frame_of_texts(tok, texts: Sequence[str], char_map: bool = True):
    """Tokenize a batch as the run does — padding=True on the tokenizer's own side,
    special tokens added, a missing pad token set to eos — and frame it (with no
    character map when `char_map` is False: only the ids and content ranges are wanted).

    Returns (ids, mask, frame) with ids and mask as tuples of tuples of ints.
    """
    ids, mask = batch_of_texts(tok, texts)
    return ids, mask, frame_of_ids(tok, ids, mask, char_map=char_map)


def batch_of_texts(tok, texts: Sequence[str]) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """The (ids, mask) of `frame_of_texts`, tokenized as it tokenizes, without the frame."""
    enc = with_pad(tok)(list(texts), padding=True, add_special_tokens=True)
    return _int_rows(enc["input_ids"]), _int_rows(enc["attention_mask"])


def _int_rows(rows) -> tuple[tuple[int, ...], ...]:
    """Rows as a tuple of tuples of ints: the tokenizer's lists re-tupled when their entries are ints already (one
    pass in C, Q37), else each entry converted."""
    out = tuple(map(tuple, rows))
    return out if _ints(out) else tuple(tuple(map(int, row)) for row in out)


def segments_of(text: str, messages: Sequence[dict]) -> dict:
    """The character range of each message's content in a rendered chat prompt.

    Each content is found as itself, searched forward from the end of the previous
    one (SPEC.md P11): a template that rewrites a content (trims it, say) leaves that
    turn unfound, recorded with no range (None), and asking for it is alignment_missing.
    Turns are named `role[k]` for the k-th message of that role; the bare `role` is
    added only for a role that spoke once, so asking for the bare name of a role that
    spoke twice is alignment_ambiguous whether or not its turns were found (P12).
    """
    ranges: dict = {}
    seen: dict = {}
    at = 0
    for message in messages:
        role, content = message["role"], message["content"]
        k = seen.get(role, 0)
        seen[role] = k + 1
        lo = text.find(content, at)
        ranges[f"{role}[{k}]"] = None if lo < 0 else (lo, lo + len(content))
        at = at if lo < 0 else lo + len(content)
    for role, count in seen.items():
        if count == 1:
            ranges[role] = ranges[f"{role}[0]"]
    return ranges


def frame_of_continuation(tok, generated, stop_ids) -> shapes.Frame:
    """The generated frame: each row's generated ids up to its first stop token, which it keeps.

    `stop_ids` is an int, a sequence of ints, or None. A row that stopped gets an
    'eos' segment, the stop token's character range; a row that never stopped keeps
    the whole bound and has no 'eos'. The map is built from these ids, never from
    re-encoding the text.
    """
    if stop_ids is None:
        stops = set()
    elif isinstance(stop_ids, int):
        stops = {stop_ids}
    else:
        stops = {int(s) for s in stop_ids}
    kept, stopped = [], []
    for row in _rows(generated):
        stop = next((j for j, i in enumerate(row) if i in stops), None)
        kept.append(list(row if stop is None else row[: stop + 1]))
        stopped.append(stop)
    texts, offsets = texts_and_maps(tok, kept)  # each row decoded once (Q34)
    ends = [len(ids) for ids in kept]
    segments = [{} if stop is None else {"eos": (offs[stop], offs[stop + 1])} for offs, stop in zip(offsets, stopped)]
    return shapes.Frame(
        starts=tuple(0 for _ in ends),
        ends=tuple(ends),
        texts=tuple(texts),
        offsets=tuple(offsets),
        segments=tuple(segments),
        name="generated",
    )


# ---------------------------------------------------------------- resolution


def _find_all(haystack: str, needle: str) -> list[int]:
    hits, at = [], haystack.find(needle)
    while at >= 0:
        hits.append(at)
        at = haystack.find(needle, at + 1)
    return hits


def _search(text: str, lo: int, hi: int, value: str):
    """The one character range of `value` in text[lo:hi], or a reason."""
    inside = text[lo:hi]
    for spelling in (value, " " + value, value.strip()):
        if not spelling:
            continue
        hits = _find_all(inside, spelling)
        if len(hits) == 1:
            return (lo + hits[0], lo + hits[0] + len(spelling)), ""
        if hits:
            return None, "alignment_ambiguous"
    return None, "alignment_missing"


def tokens_over_plain(offsets: tuple[int, ...], lo: int, hi: int) -> tuple[int, int]:
    """The definition (SPEC.md P23): the content tokens k with offsets[k] < hi and offsets[k + 1] > lo, as a
    half-open token range from the first to one past the last, by a scan of every token; (0, 0) when none."""
    inside = [k for k in range(len(offsets) - 1) if offsets[k] < hi and offsets[k + 1] > lo]
    return (inside[0], inside[-1] + 1) if inside else (0, 0)


def _tokens_over(offsets: tuple[int, ...], lo: int, hi: int) -> tuple[int, int]:
    """An optimisation of `tokens_over_plain`, equal to it on non-decreasing offsets (SPEC.md Q28).

    The content tokens overlapping characters [lo, hi), as a half-open token range.

    Token k covers offsets[k]:offsets[k + 1] and overlaps [lo, hi) exactly when
    offsets[k] < hi and offsets[k + 1] > lo (SPEC.md P23). A token that covers no
    character (a byte-fallback piece that leaves its character incomplete, Llama's
    '▁' before a digit) overlaps nothing, so it is in no run.
    Offsets never decrease, so the tokens with offsets[k] < hi are a prefix and those with offsets[k + 1] > lo a
    suffix: their overlap is found by bisection, the same range the scan of every token gives (SPEC.md Q28).
    """
    n = len(offsets) - 1  # content tokens
    first = max(bisect_right(offsets, lo, 1, n + 1) - 1, 0)  # the first k with offsets[k + 1] > lo
    end = bisect_left(offsets, hi, 0, n)  # one past the last k with offsets[k] < hi
    return (first, end) if first < end else (0, 0)


def _run(frame: shapes.Frame, scope: Optional[shapes.Anchor], row: int, anchors):
    """Row `row`'s run as a half-open range of content-token indices, and a reason."""
    n = frame.ends[row] - frame.starts[row]
    if scope is None:
        return (0, n), ""
    if not frame.offsets:
        raise ValueError("a scoped position needs a character map; build the frame with char_map=True")
    text, offsets = frame.texts[row], frame.offsets[row]
    lo, hi = 0, len(text)
    if scope.segment is not None:
        segments = frame.segments[row] if frame.segments else {}
        if segments.get(scope.segment) is not None:
            lo, hi = segments[scope.segment]
        elif scope.segment not in segments and f"{scope.segment}[1]" in segments:
            return (0, 0), "alignment_ambiguous"  # a role that spoke twice, found or not (P12)
        else:
            return (0, 0), "alignment_missing"
    if scope.variable is not None:
        value = anchors[row] if anchors is not None else None
        if value is None:
            return (0, 0), "alignment_missing"
        found, reason = _search(text, lo, hi, value)
        if reason:
            return (0, 0), reason
        lo, hi = found
    return _tokens_over(offsets, lo, hi), ""


def _cut(n: int, where: shapes.Where):
    """The cut's indices into a run of n tokens, or out_of_range."""
    if where.index is not None:
        i = where.index
        return ((i + n if i < 0 else i,), "") if -n <= i < n else ((), "out_of_range")
    if where.last is not None:
        m = where.last
        return (tuple(range(n - m, n)), "") if 0 < m <= n else ((), "out_of_range")
    if where.span is not None:
        a, b = (v + n if v < 0 else v for v in where.span)
        return (tuple(range(a, b)), "") if 0 <= a < b <= n else ((), "out_of_range")
    return (tuple(range(n)), "") if n else ((), "out_of_range")


def resolve(frame: shapes.Frame, where: shapes.Where, anchors=None):
    """Resolve `where` on every row: (windows, reasons), one tuple entry per row.

    A window holds absolute indices — into the padded sequence for the prompt frame,
    decode steps for the generated frame. `anchors[r]` is row r's text for
    `where.scope.variable` (None when the row has none). An empty window comes with
    its reason; this never raises for a row that cannot be placed.
    """
    if where.frame != frame.name:
        raise ValueError(f"{where.spelling()} is a {where.frame}-frame position, not a {frame.name} one")
    windows, reasons = [], []
    for row in range(len(frame.starts)):
        (a, b), reason = _run(frame, where.scope, row, anchors)
        cut: tuple[int, ...] = ()
        if not reason:
            cut, reason = _cut(b - a, where)
        windows.append(tuple(frame.starts[row] + a + i for i in cut))
        reasons.append(reason)
    return tuple(windows), tuple(reasons)


def tokens_of(frame: shapes.Frame, window: Sequence[int], row: int) -> str:
    """repr() of the text a row's window covers ("" for an empty window)."""
    if not window:
        return ""
    if not frame.offsets:
        raise ValueError("tokens need a character map; build the frame with char_map=True")
    offsets, start = frame.offsets[row], frame.starts[row]
    first, last = window[0] - start, window[-1] - start
    return repr(frame.texts[row][offsets[first] : offsets[last + 1]])
