"""Locate: the position resolver — a `Where` and a row's own ids in, integer windows out.

It owns the frame (each row's content span inside the padded batch, its decoded
text and character map), the chat-turn segments of a rendered prompt, the
continuation frame of a decode, and resolution itself: find the run (the whole
content, a segment, a variable's text, or a variable inside a segment), cut it,
and check the cut is inside it. Rows that cannot be placed get an empty window
and a reason ('alignment_missing', 'alignment_ambiguous', 'out_of_range'); whether
that is a refusal is the caller's decision, never this module's.

It imports nothing but the standard library, torch and shapes.py, so it runs
wherever the model's tokenizer is and needs no model library of its own.
Text is always decoded with special tokens kept (a chat prompt's `</s><s>` is part
of its content, and a stop token needs a character span) and without clean-up of
tokenization spaces (so every decoded prefix is a prefix of the whole).
SPEC.md §2 Positions.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from causalab_ref import shapes

# ---------------------------------------------------------------- decoding


def _decode(tok, ids: Sequence[int]) -> str:
    return tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _rows(x) -> list[list[int]]:
    """A 2-D tensor or a sequence of sequences, as lists of ints."""
    if isinstance(x, torch.Tensor):
        x = x.tolist()
    return [[int(v) for v in row] for row in x]


def special_prefix(tok) -> tuple[int, ...]:
    """What the tokenizer puts before every prompt: the ids it makes of the empty string."""
    return tuple(int(i) for i in tok("", add_special_tokens=True)["input_ids"])


_special_prefix = special_prefix  # the seed's spelling


def char_map(tok, ids: Sequence[int]) -> tuple[int, ...]:
    """offsets[k] = the character where token k starts, from decoding growing prefixes.

    Kept non-decreasing; a prefix that does not decode to a prefix of the whole text
    (a byte-fallback piece in the middle of a character) reuses the previous offset.
    The final entry is len(text), so token k spans offsets[k]:offsets[k + 1].
    """
    ids = list(ids)
    text = _decode(tok, ids)
    offsets = [0]
    for k in range(1, len(ids)):
        prefix = _decode(tok, ids[:k])
        at = len(prefix) if text.startswith(prefix) else offsets[-1]
        offsets.append(max(at, offsets[-1]))
    return tuple(offsets[: len(ids)]) + (len(text),)


_char_map = char_map  # frame_of_ids has a parameter of the same name


# ---------------------------------------------------------------- frames


def _content_span(row: list[int], mask: list[int], prefix: tuple[int, ...], r: int) -> tuple[int, int]:
    real = [j for j, m in enumerate(mask) if m]
    if not real:
        return 0, 0
    first, end = real[0], real[-1] + 1
    if len(real) != end - first:
        raise ValueError(f"row {r}: padding is not contiguous (mask {mask})")
    if prefix and tuple(row[first : first + len(prefix)]) == prefix:
        first += len(prefix)
    return first, end


def frame_of_ids(tok, ids, mask, segments=None, char_map=True) -> shapes.Frame:
    """The prompt frame of a padded batch (left or right padding).

    `segments`, when given, is per row a dict name -> (lo, hi) character span in that
    row's decoded content. `char_map=False` builds no texts or offsets: a pass whose
    positions are all bare integers needs only the content spans.
    """
    rows, masks = _rows(ids), _rows(mask)
    prefix = special_prefix(tok)
    spans = [_content_span(row, m, prefix, r) for r, (row, m) in enumerate(zip(rows, masks))]
    starts = tuple(lo for lo, _ in spans)
    ends = tuple(hi for _, hi in spans)
    segs = tuple(dict(s or {}) for s in segments) if segments is not None else tuple({} for _ in rows)
    if not char_map:
        return shapes.Frame(starts=starts, ends=ends, segments=segs)
    contents = [row[lo:hi] for row, (lo, hi) in zip(rows, spans)]
    return shapes.Frame(
        starts=starts,
        ends=ends,
        texts=tuple(_decode(tok, c) for c in contents),
        offsets=tuple(_char_map(tok, c) for c in contents),
        segments=segs,
    )


def with_pad(tok):
    """The tokenizer, with a missing pad token set to its EOS token (SPEC.md R2); the one place this is done."""
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def frame_of_texts(tok, texts: Sequence[str], char_map: bool = True):
    """Tokenize a batch as the run does — padding=True on the tokenizer's own side,
    special tokens added, a missing pad token set to eos — and frame it (with no
    character map when `char_map` is False: only the ids and content spans are wanted).

    Returns (ids, mask, frame) with ids and mask as tuples of tuples of ints.
    """
    enc = with_pad(tok)(list(texts), padding=True, add_special_tokens=True)
    ids = tuple(tuple(int(i) for i in row) for row in enc["input_ids"])
    mask = tuple(tuple(int(m) for m in row) for row in enc["attention_mask"])
    return ids, mask, frame_of_ids(tok, ids, mask, char_map=char_map)


def segments_of(text: str, messages: Sequence[dict]) -> dict:
    """The character span of each message's content in a rendered chat prompt.

    Each content is found as itself, searched forward from the end of the previous
    one (SPEC.md P11): a template that rewrites a content (trims it, say) leaves that
    turn unfound, recorded with no span (None), and asking for it is alignment_missing.
    Turns are named `role[k]` for the k-th message of that role; the bare `role` is
    added only for a role that spoke once, so asking for the bare name of a role that
    spoke twice is alignment_ambiguous whether or not its turns were found (P12).
    """
    spans: dict = {}
    seen: dict = {}
    at = 0
    for message in messages:
        role, content = message["role"], message["content"]
        k = seen.get(role, 0)
        seen[role] = k + 1
        lo = text.find(content, at)
        spans[f"{role}[{k}]"] = None if lo < 0 else (lo, lo + len(content))
        at = at if lo < 0 else lo + len(content)
    for role, count in seen.items():
        if count == 1:
            spans[role] = spans[f"{role}[0]"]
    return spans


def frame_of_continuation(tok, generated, stop_ids) -> shapes.Frame:
    """The generated frame: each row's generated ids cut at its first stop token (kept).

    `stop_ids` is an int, a sequence of ints, or None. A row that stopped gets an
    'eos' segment, the stop token's character span; a row that never stopped keeps
    the whole bound and has no 'eos'. The map is built from these ids, never from
    re-encoding the text.
    """
    if stop_ids is None:
        stops = set()
    elif isinstance(stop_ids, int):
        stops = {stop_ids}
    else:
        stops = {int(s) for s in stop_ids}
    texts, offsets, ends, segments = [], [], [], []
    for row in _rows(generated):
        stop = next((j for j, i in enumerate(row) if i in stops), None)
        cut = row if stop is None else row[: stop + 1]
        offs = char_map(tok, cut)
        texts.append(_decode(tok, cut))
        offsets.append(offs)
        ends.append(len(cut))
        segments.append({} if stop is None else {"eos": (offs[stop], offs[stop + 1])})
    return shapes.Frame(
        starts=tuple(0 for _ in ends),
        ends=tuple(ends),
        texts=tuple(texts),
        offsets=tuple(offsets),
        segments=tuple(segments),
        kind="generated",
    )


# ---------------------------------------------------------------- resolution


def _find_all(haystack: str, needle: str) -> list[int]:
    hits, at = [], haystack.find(needle)
    while at >= 0:
        hits.append(at)
        at = haystack.find(needle, at + 1)
    return hits


def _search(text: str, lo: int, hi: int, value: str):
    """The one character span of `value` in text[lo:hi], or a reason."""
    window = text[lo:hi]
    for spelling in (value, " " + value, value.strip()):
        if not spelling:
            continue
        hits = _find_all(window, spelling)
        if len(hits) == 1:
            return (lo + hits[0], lo + hits[0] + len(spelling)), ""
        if hits:
            return None, "alignment_ambiguous"
    return None, "alignment_missing"


def _tokens_over(offsets: tuple[int, ...], lo: int, hi: int) -> tuple[int, int]:
    """The content tokens overlapping characters [lo, hi), as a half-open token range.

    Token k covers offsets[k]:offsets[k + 1] and overlaps [lo, hi) exactly when
    offsets[k] < hi and offsets[k + 1] > lo (SPEC.md P23). A token that covers no
    character (a byte-fallback piece that leaves its character incomplete, Llama's
    '▁' before a digit) overlaps nothing, so it is in no run.
    """
    inside = [k for k in range(len(offsets) - 1) if offsets[k] < hi and offsets[k + 1] > lo]
    return (inside[0], inside[-1] + 1) if inside else (0, 0)


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
        span, reason = _search(text, lo, hi, value)
        if reason:
            return (0, 0), reason
        lo, hi = span
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


def locate(frame: shapes.Frame, where: shapes.Where, anchors=None):
    """Resolve `where` on every row: (windows, reasons), one tuple entry per row.

    A window holds absolute indices — into the padded sequence for the prompt frame,
    decode steps for the generated frame. `anchors[r]` is row r's text for
    `where.scope.variable` (None when the row has none). An empty window comes with
    its reason; this never raises for a row that cannot be placed.
    """
    if where.frame != frame.kind:
        raise ValueError(f"{where.spelling()} is a {where.frame}-frame position, not a {frame.kind} one")
    windows, reasons = [], []
    for row in range(len(frame.starts)):
        (a, b), reason = _run(frame, where.scope, row, anchors)
        cut = ()
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
