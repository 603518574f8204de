"""Data: rows on disk, the field path grammar, anchors, and chat rows.

A dataset ref `<dir>/<table>` or `<dir>/<table>#<split>` names a JSON array of
flat row objects under the data root. A role's `field` is a path into a row
(`column`, `column[i]`, `a.b`). A variable anchor looks at the `<column>_variables`
sibling of the role's field first and at a top-level column second. A field holding
a list of {"role", "content"} messages is a conversation, rendered through the
checkpoint's chat template. SPEC.md §1 Documents and §2.4 Anchors.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NoReturn, Optional

from ..documents import reader
from ..shapes import Refusal, nearest

_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_\-]*)((?:\[\d+\])*)$")


def _refuse(message: str, path: str = "", stage: str = "compile") -> NoReturn:
    raise Refusal(message, path=path, stage=stage)


def table_path(ref: str, root: Path, path: str = "") -> tuple[Path, Optional[str]]:
    """The file a dataset ref names, confined to the data root, and its split (or None)."""
    name, _, split = ref.partition("#")
    parts = name.split("/")
    if (not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts)
            or any(not re.fullmatch(r"[A-Za-z0-9_\-.]+", p) for p in parts)):
        _refuse(f"dataset ref '{ref}' is not <dir>/<table> under the data root", path)
    if any(len(p.encode("utf-8")) > 255 for p in parts[:-1] + [parts[-1] + ".json"]):
        _refuse(f"dataset ref '{ref}': a folder or table name over 255 bytes is not a file name", path)
    file = (root / (name + ".json"))
    try:
        canonical, base = file.resolve(), root.resolve()
    except (OSError, RuntimeError) as error:  # Python 3.11 raises RuntimeError for a link loop (SPEC.md S53)
        cause = "a symbolic link loop" if isinstance(error, RuntimeError) else error.strerror or type(error).__name__
        _refuse(f"dataset ref '{ref}': cannot resolve {file} ({cause})", path)
    if base not in canonical.parents:
        _refuse(f"dataset ref '{ref}' leaves the data root {root}", path)
    return file, (split or None)


def rows_of(ref: str, root: Path, path: str = "") -> list[dict]:
    """Read a dataset ref's rows (a split keeps rows whose `split` column equals it)."""
    file, split = table_path(ref, root, path)
    try:
        if not file.is_file():
            _refuse(f"dataset ref '{ref}': no table at {file}; dataset refs are read under the data root {root}, "
                    "which --data-root names (a relative one from the current directory)", path)
        text = file.read_text(encoding="utf-8")
    except OSError as error:  # unreadable, or a name the file system will not take
        _refuse(f"dataset ref '{ref}': cannot read {file} ({error.strerror or type(error).__name__})", path)
    except UnicodeDecodeError as error:
        _refuse(f"dataset ref '{ref}': {file} is not a JSON table ({error})", path)
    rows = _parse_table(text, ref, file, path)
    if split is not None:
        rows = [r for r in rows if r.get("split") == split]
    if not rows:
        _refuse(f"dataset ref '{ref}' selects no rows", path)
    return rows


def _parse_table(text: str, ref: str, file: Path, path: str) -> list:
    """A table's text -> its rows, through the one JSON reader (reader.py): a key named twice or a
    number that is not one is refused naming the file and the place in it (SPEC.md S40-S42)."""
    try:
        rows = reader.parse(text)
    except reader.Malformed as bad:
        if isinstance(bad.cause, json.JSONDecodeError):  # nesting past the parser is nesting too deep (R14)
            _refuse(f"dataset ref '{ref}': {file} is not a JSON table ({bad.cause})", path)
        if bad.at is None:  # a lone surrogate (`"\ud800"`) is JSON but not text any tokenizer takes
            _refuse(f"dataset ref '{ref}': {file} {bad.message}", path)
        _refuse(f"dataset ref '{ref}': {file} at {bad.at or 'the top level'}: {bad.message}", path)
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        _refuse(f"dataset ref '{ref}': {file} is not a JSON array of row objects", path)
    return rows


def disjoint(train: dict, eval_rows: dict, same: bool, path: str) -> None:
    """A fit's rows and its eval rows from different refs (`same`: one ref) share no base row, compared as
    sorted-key JSON; refused at `path`, the eval rows'."""
    if same:
        return
    role = "base" if "base" in train else next(iter(train))
    seen = {json.dumps(r, sort_keys=True) for r in train[role]}
    shared = sum(json.dumps(r, sort_keys=True) in seen for r in eval_rows[role])
    if shared:
        _refuse(f"the eval rows share {shared} row(s) with the fitted rows; the two must be endpoint-disjoint", path)


def example_ids(rows: list[dict]) -> tuple[str, ...]:
    """A row's `example_id` column as a string where the table has one, else its 0-based index."""
    return tuple(str(r["example_id"]) if "example_id" in r else str(k) for k, r in enumerate(rows))


def _parts(field: str, path: str) -> list[tuple[str, list[int]]]:
    """A field path's parts, each a name and the list indexes after it: `a[0].b` -> [('a', [0]), ('b', [])]."""
    parts = []
    for part in field.split("."):
        m = _PART.match(part)
        if not m:
            _refuse(f"field '{field}': `column`, `column[i]` and `a.b` are the forms", path, "validation")
        parts.append((m.group(1), [int(i) for i in re.findall(r"\[(\d+)\]", m.group(2))]))
    return parts


def walk(row: dict, field: str, path: str = "", row_index: int = 0) -> Any:
    """The value a field path names in a row; refused with the row when it is not there."""
    value: Any = row
    for name, indexes in _parts(field, path):
        if not isinstance(value, dict) or name not in value:
            _refuse(f"field '{field}': no such column '{name}' on row {row_index}", path)
        value = value[name]
        for i in indexes:
            if not isinstance(value, list) or i >= len(value):
                _refuse(f"field '{field}': row {row_index} has no item [{i}] under '{name}'", path)
            value = value[i]
    return value


def sibling(field: str, variable: str) -> str:
    """`counterfactual_inputs[0]` + `entity` -> `counterfactual_inputs_variables[0].entity`."""
    first, _, rest = field.partition(".")
    m = _PART.match(first)
    name, brackets = (m.group(1), m.group(2)) if m else (first, "")
    head = f"{name}_variables{brackets}"
    return ".".join(p for p in (head, rest, variable) if p)


def anchor_text(row: dict, field: str, variable: str, path: str = "", row_index: int = 0) -> Optional[str]:
    """The row's own text for a variable anchor: the sibling first, a top-level column second."""
    near = sibling(field, variable)
    try:
        value = walk(row, near, path, row_index)
    except Refusal:
        value = None
        if variable not in row:
            _refuse(f"variable '{variable}': this row has neither '{near}' nor a column '{variable}' "
                    f"(row {row_index}); name a column the rows carry", path)
        value = row[variable]
    if value is None:
        return None
    if not isinstance(value, str):
        _refuse(f"variable '{variable}': row {row_index} holds {type(value).__name__}, not text", path)
    return value


def is_conversation(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and set(m) == {"role", "content"}
                    and isinstance(m["role"], str) and isinstance(m["content"], str) for m in value))


def prompt_of(value: Any, field: str, path: str, row_index: int) -> Any:
    """A role's value on one row: a string, or a conversation (a list of messages)."""
    if isinstance(value, str) or is_conversation(value):
        return value
    _refuse(f"field '{field}': expected a string or a list of {{\"role\", \"content\"}} messages on row "
            f"{row_index}, got {type(value).__name__}", path)


def render_chat(tok, messages: list[dict], path: str = "") -> str:
    """A conversation through the checkpoint's own chat template, less the template's leading BOS text.

    The template writes BOS as text; tokenizing with special tokens adds it again, so
    it is removed here (SPEC.md §2.3 Chat turns).
    """
    if not getattr(tok, "chat_template", None):
        _refuse("this row is a conversation and this checkpoint has no chat template, so there is no text to "
                "run. Give the role a string column", path)
    try:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as error:  # the template's own refusal (jinja2's raise_exception): this row's, not ours
        _refuse(f"the checkpoint's chat template refuses this conversation: {type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}", path)
    bos = getattr(tok, "bos_token", None)
    if bos and text.startswith(bos):
        text = text[len(bos):]
    return text


# Tokenizer parts that never make a text shorter: each character of the text is still there, or more of
# them, when the model splits it into tokens (a byte-level alphabet spells one byte per character).
_KEEPS = {"normalizer": {"Prepend", "Append", "Lowercase", "NFD", "NFKD", "Replace", "Sequence"},
          "pre_tokenizer": {"ByteLevel", "Metaspace", "Split", "Digits", "Punctuation", "UnicodeScripts",
                            "Sequence"}}


def _keeps_characters(part: Optional[dict], kind: str) -> bool:
    """Whether a normalizer or pre-tokenizer (its JSON) keeps every character: a Replace of a string by one
    at least as long, a Split or Punctuation that does not remove the pattern, a Sequence of such parts."""
    if part is None:
        return True
    if part.get("type") not in _KEEPS[kind] or part.get("behavior") == "Removed":
        return False
    if part["type"] == "Replace":
        pattern = part.get("pattern", {})
        return "String" in pattern and len(part.get("content", "")) >= len(pattern["String"])
    inner = part.get("normalizers" if kind == "normalizer" else "pretokenizers") or []
    return all(_keeps_characters(p, kind) for p in inner)


def characters_per_token(tok) -> Optional[int]:
    """The most characters of a text one token can stand for: the tokenizer's longest vocabulary entry
    (a byte-fallback entry `<0x41>` stands for less than one). None when no such bound holds: a slow
    tokenizer, or one whose normalizer or pre-tokenizer may drop characters (NFKC, accent stripping,
    whitespace splitting) or whose model may fuse a run of unknown characters into one token."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    model = spec.get("model", {})
    fused = model.get("type") != "BPE" or (model.get("fuse_unk") and not model.get("byte_fallback"))
    if fused or not all(_keeps_characters(spec.get(kind), kind) for kind in _KEEPS):
        return None
    return max((len(piece) for piece in tok.get_vocab()), default=1)


def refuse_long_texts(tok, texts: list, limit: Optional[int], role: str, path: str) -> None:
    """Refuse, before they are tokenized, the prompts that must be longer than the model's `limit` positions:
    a text of more than limit x L characters, L = characters_per_token, is more than `limit` tokens (SPEC.md
    S48). Only a text longer than `limit` characters asks for L; nothing is refused when L is unknown."""
    long = [(r, len(t)) for r, t in enumerate(texts) if limit and len(t) > limit]
    per = characters_per_token(tok) if long else None
    over = [(r, n) for r, n in long if per is not None and limit and n > limit * per]
    if over:
        shown = ", ".join(f"row {r}: {n} characters" for r, n in over[:10]) + (", ..." if len(over) > 10 else "")
        _refuse(f"role '{role}': {len(over)} prompt(s) longer than the model's {limit} positions ({shown}; a token "
                f"of this tokenizer spells at most {per} characters); shorten them to at most {limit} tokens or "
                "pick rows that fit", path)


#: how many of a table's columns a missing answer column's refusal lists (SPEC.md P31)
COLUMNS_SHOWN = 20


def answer_eligible(rows: list[dict], columns: tuple[str, ...], metric: str, path: str) -> tuple[bool, ...]:
    """The column half of a metric's rows: every named column holds a non-blank string."""
    for column in columns:
        if not any(column in r for r in rows):
            have = list(dict.fromkeys(str(k) for r in rows if isinstance(r, dict) for k in r))
            shown = ", ".join(repr(k) for k in have[:COLUMNS_SHOWN]) + (", ..." if len(have) > COLUMNS_SHOWN else "")
            _refuse(f"metric '{metric}': no row has a column '{column}'; the rows' columns: {shown or 'none'}"
                    f"{nearest(column, have)}", path)
    eligible = tuple(all(isinstance(r.get(c), str) and str(r.get(c)).strip() != "" for c in columns) for r in rows)
    if not any(eligible):
        _refuse(f"metric '{metric}': none of these {len(rows)} row(s) has a value in {list(columns)}; "
                "a metric of nothing has no mean", path)
    return eligible


def answer_id(tok, text: str, path: str, cell: str = "", token_form: str = "space_prefixed") -> int:
    """space_prefixed: strip leading whitespace, prepend one space, encode without specials; one id. bare: the
    same without the space (SPEC.md D15, D29).

    `cell` names the row and column for the refusal (`row 1, column 'cf_answer'`)."""
    surface = (" " if token_form == "space_prefixed" else "") + text.lstrip()
    ids = plain_ids(tok, surface)
    if len(ids) != 1:
        raise Refusal(f"answer '{text}' is {len(ids)} tokens as '{surface}'; a metric column must resolve to "
                      f"exactly one token{f' ({cell})' if cell else ''}", path=path, stage="compile")
    return ids[0]


def plain_ids(tok, text: str) -> list[int]:
    """`text`'s ids with no special tokens: none added, and none parsed from the text, so an answer `</s>` is its
    characters' tokens, never the end-of-sequence token (SPEC.md D29)."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "encode_special_tokens"):
        return list(tok.encode(text, add_special_tokens=False, split_special_tokens=True))
    before = backend.encode_special_tokens
    backend.encode_special_tokens = True  # the text's special-token spellings are text
    try:
        return list(backend.encode(text, add_special_tokens=False).ids)
    finally:
        backend.encode_special_tokens = before


def answer_ids(tok, rows: list, eligible: tuple, column: str, path: str, token_form: str = "space_prefixed") -> tuple:
    """Each eligible row's answer id in `column` (None for the others); a text many rows share is encoded once,
    at its first row, which a refusal names."""
    known: dict[str, int] = {}
    out: list = []
    for r, (row, ok) in enumerate(zip(rows, eligible)):
        text: Any = row[column] if ok else None  # the row's own value: answer_id refuses a non-string
        if ok and (not isinstance(text, str) or text not in known):
            answer = answer_id(tok, text, path, f"row {r}, column '{column}'", token_form)
            if isinstance(text, str):
                known[text] = answer
            out.append(answer)
        else:
            out.append(known[text] if ok else None)
    return tuple(out)
