"""Tokenjson: a fixture's tokenizer served from its tokenizer.json by the `tokenizers` library alone (SPEC.md E14-E17).

Loading a tokenizer through transformers imports the package and scans its model folders; compile only asks a
tokenizer for a few things (encode, a left-padded batch, decode, a piece, the vocabulary, the special tokens),
and a transformers fast tokenizer whose class overrides none of them answers each from its backend, a
`tokenizers.Tokenizer`. So the first process to compile against a fixture loads the tokenizer as nnsight does,
writes its backend's tokenizer.json and the few attributes compile reads into the cache beside the fixture
(`<cache>/tokenizers/<fixture folder>/`, with a record of both files' sha256 and the fixture's recipe digest),
and every later process answers from those files without importing transformers:

    tok = tokenjson.cached(folder, builder.recipe_digest(key), load)   # load(): the AutoTokenizer, on a miss only
    tok(["The cat", "A dog sat"], padding=True, add_special_tokens=True)["input_ids"]   # left-padded rows

A cached file whose bytes are not the record's (or a record of another recipe) is never read: the files are
rebuilt from the AutoTokenizer (S71). A chat template is rendered by the AutoTokenizer itself, loaded then (E16).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from ..fixtures import builder

#: the transformers methods whose answers the adapter gives; a class overriding one of them is not served (E15)
SERVED = ("__call__", "encode", "decode", "_decode", "_encode_plus", "_batch_encode_plus", "convert_ids_to_tokens",
          "convert_tokens_to_ids", "_convert_token_to_id_with_added_voc", "get_vocab", "pad", "tokenize")
#: the classes that define them for a transformers fast tokenizer (5.x and 4.x spellings)
BASES = ("TokenizersBackend", "PreTrainedTokenizerFast", "PreTrainedTokenizerBase", "SpecialTokensMixin")
#: the attributes compile reads, written beside the tokenizer.json
ATTRIBUTES = ("bos_token", "eos_token", "pad_token", "unk_token", "padding_side", "model_max_length",
              "chat_template")
RECORD, FILES = "record.json", ("tokenizer.json", "adapter.json")


class JsonTokenizer:
    """A transformers fast tokenizer's answers to compile's calls, from its backend alone (SPEC.md E14)."""

    def __init__(self, backend, attributes: dict[str, Any], load: Callable[[], Any]):
        backend.no_padding()
        backend.no_truncation()
        self.backend_tokenizer = backend
        self.clean_up_tokenization_spaces = bool(attributes.get("clean_up_tokenization_spaces"))
        self.cleans_when_asked = bool(attributes.get("cleans_when_asked"))
        self._load, self._full = load, None
        self.bos_token: Optional[str] = attributes.get("bos_token")
        self.eos_token: Optional[str] = attributes.get("eos_token")
        self.pad_token: Optional[str] = attributes.get("pad_token")
        self.unk_token: Optional[str] = attributes.get("unk_token")
        self.padding_side: str = attributes.get("padding_side") or "right"
        self.model_max_length: Any = attributes.get("model_max_length")
        self.chat_template: Optional[str] = attributes.get("chat_template")

    def _id(self, token: Optional[str]) -> Optional[int]:
        """convert_tokens_to_ids of one token: its id, the unknown token's for a token not in the vocabulary."""
        if token is None:
            return None
        found = self.backend_tokenizer.token_to_id(token)
        return found if found is not None or self.unk_token is None else self.backend_tokenizer.token_to_id(
            self.unk_token)

    bos_token_id = property(lambda self: self._id(self.bos_token))
    eos_token_id = property(lambda self: self._id(self.eos_token))
    pad_token_id = property(lambda self: self._id(self.pad_token))
    unk_token_id = property(lambda self: self._id(self.unk_token))

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def __call__(self, texts: Union[str, Sequence[str]], padding: bool = False, add_special_tokens: bool = True):
        """input_ids and attention_mask of one text, or of a batch padded to its longest row on padding_side."""
        if isinstance(texts, str):
            enc = self.backend_tokenizer.encode(texts, add_special_tokens=add_special_tokens)
            return {"input_ids": list(enc.ids), "attention_mask": list(enc.attention_mask)}
        rows = [list(e.ids) for e in self.backend_tokenizer.encode_batch(list(texts),
                                                                          add_special_tokens=add_special_tokens)]
        width = max(map(len, rows), default=0) if padding else 0
        pad, left = self.pad_token_id, self.padding_side == "left"
        ids, mask = [], []
        for row in rows:
            fill = max(width - len(row), 0)
            ids.append([pad] * fill + row if left else row + [pad] * fill)
            mask.append([0] * fill + [1] * len(row) if left else [1] * len(row) + [0] * fill)
        return {"input_ids": ids, "attention_mask": mask}

    def _decode(self, ids: Sequence[int], skip_special_tokens: bool = False,
                clean_up_tokenization_spaces: Optional[bool] = None) -> str:
        """The backend's decode, then transformers' clean-up where the tokenizer's own decode makes it."""
        text = self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        asked = clean_up_tokenization_spaces
        asked = self.clean_up_tokenization_spaces if asked is None else asked
        return clean_up(text) if asked and self.cleans_when_asked else text

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: Optional[bool] = None):
        ids = [ids] if isinstance(ids, int) else list(ids)
        return self._decode(ids, skip_special_tokens, clean_up_tokenization_spaces)

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids]

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def apply_chat_template(self, messages, **kwargs):
        """The chat template rendered by the AutoTokenizer itself, loaded on first use (SPEC.md E16)."""
        if self._full is None:
            self._full = self._load()
        return self._full.apply_chat_template(messages, **kwargs)


def clean_up(text: str) -> str:
    """transformers' clean_up_tokenization: the space before punctuation and English clitics removed."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


# ---------------------------------------------------------------- deriving the files from the AutoTokenizer


def servable(tok) -> bool:
    """Whether the adapter answers every call compile makes exactly as this transformers tokenizer (E15): a fast
    tokenizer whose class takes each SERVED method from transformers' own fast-tokenizer classes."""
    if getattr(tok, "backend_tokenizer", None) is None:
        return False
    methods = [getattr(type(tok), m) for m in SERVED if hasattr(type(tok), m)]  # 5.x has no _batch_encode_plus
    return all(getattr(m, "__qualname__", "?").split(".")[0] in BASES for m in methods)


def derive(tok) -> Optional[dict[str, bytes]]:
    """The cached files of a servable tokenizer (its backend's tokenizer.json, its attributes), else None."""
    if not servable(tok):
        return None
    attributes = {name: getattr(tok, name, None) for name in ATTRIBUTES}
    # transformers 5 cleans a decode's spaces only when asked and the model is not BPE (or is forced to)
    forced = getattr(tok, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
    attributes["clean_up_tokenization_spaces"] = bool(tok.clean_up_tokenization_spaces)
    attributes["cleans_when_asked"] = type(tok.backend_tokenizer.model).__name__ != "BPE" or bool(forced)
    return {"tokenizer.json": tok.backend_tokenizer.to_str().encode("utf-8"),
            "adapter.json": json.dumps(attributes, sort_keys=True).encode("utf-8")}


def from_files(files: dict[str, bytes], load: Callable[[], Any]) -> JsonTokenizer:
    from tokenizers import Tokenizer

    return JsonTokenizer(Tokenizer.from_str(files["tokenizer.json"].decode("utf-8")),
                         json.loads(files["adapter.json"]), load)


# ---------------------------------------------------------------- the cache


def folder_of(checkpoint: Path) -> Path:
    """Where a fixture folder's derived tokenizer is kept: <cache>/tokenizers/<the fixture folder's name>."""
    return checkpoint.parent / "tokenizers" / checkpoint.name


def _regular_bytes(path: Path) -> Optional[bytes]:
    """A regular file's bytes (never through a link), None when it is anything else or unreadable."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        return path.read_bytes()
    except OSError:
        return None


def read_cached(folder: Path, digest: str, sources: Optional[dict[str, bytes]] = None) -> Optional[dict[str, bytes]]:
    """The cached files when each one's bytes hash to the record's sha256, the record is the recipe's and, given
    the `sources` the tokenizer is derived from ({file: bytes}), the record names their digests; else None (a
    missing, damaged, linked or foreign file is never trusted, SPEC.md S71, S78). Whether the files hold the
    sources' vocabulary is `bound`'s to say."""
    raw = _regular_bytes(folder / RECORD)
    try:
        record = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("digest") != digest or not isinstance(record.get("files"), dict):
        return None
    files = {fn: _regular_bytes(folder / fn) for fn in FILES}
    ok = all(b is not None and hashlib.sha256(b).hexdigest() == record["files"].get(fn) for fn, b in files.items())
    if ok and sources is not None:
        ok = record.get("sources") == _digests(sources)
    return {fn: b for fn, b in files.items() if b is not None} if ok else None


def _digests(files: dict[str, bytes]) -> dict[str, str]:
    return {fn: hashlib.sha256(b).hexdigest() for fn, b in sorted(files.items())}


def source_files(checkpoint: Path, listed: dict[str, str]) -> Optional[dict[str, bytes]]:
    """The checkpoint's tokenizer source files, each read once (never through a link), when every one the recipe
    lists (`listed`, {file: sha256} known apart from the cache) is there with those bytes; else None (S78)."""
    found = {fn: _regular_bytes(checkpoint / fn) for fn in listed}
    if not listed or any(b is None or hashlib.sha256(b).hexdigest() != listed[fn] for fn, b in found.items()):
        return None
    return {fn: b for fn, b in found.items() if b is not None}


def _vocab(model: Any) -> Optional[dict]:
    """A tokenizer.json model's vocabulary as {piece: id} (a BPE's mapping, a Unigram's list of [piece, score])."""
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, list):
        return {entry[0]: k for k, entry in enumerate(vocab) if isinstance(entry, list) and entry}
    return vocab if isinstance(vocab, dict) else None


def _merges(merges: Any) -> Optional[list[tuple]]:
    """Merges as pairs, from a tokenizer.json's (`"a b"` or `["a", "b"]`) or merges.txt's lines."""
    if not isinstance(merges, list):
        return None
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]


def _source_model(sources: dict[str, bytes]) -> tuple[Optional[dict], Optional[list[tuple]]]:
    """(vocabulary, merges or None) the sources define: a tokenizer.json's model; vocab.json and merges.txt (its
    `#version` line aside); a SentencePiece model's pieces (its merges are not in the file)."""
    if "tokenizer.json" in sources:
        model = json.loads(sources["tokenizer.json"]).get("model")
        return _vocab(model), _merges(model.get("merges") if isinstance(model, dict) else None)
    if "vocab.json" in sources:
        lines = sources.get("merges.txt", b"").decode("utf-8").split("\n")
        merges = [line for line in lines if line and not line.startswith("#version")]
        return json.loads(sources["vocab.json"]), _merges(merges) if "merges.txt" in sources else None
    if "tokenizer.model" in sources:
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_proto=sources["tokenizer.model"])
        return {sp.id_to_piece(k): k for k in range(sp.get_piece_size())}, None
    return None, None


#: bound's answers in this process, by the digests of the derived tokenizer.json and of the sources it was
#: checked against: the same bytes get the same answer, so each is checked once
_BOUND: dict[tuple, bool] = {}


def bound(backend, tokenizer_json: bytes, sources: dict[str, bytes]) -> bool:
    """Whether a derived tokenizer (`backend`, the `tokenizers.Tokenizer` of `tokenizer_json`) is its sources'
    (S78): the same vocabulary (piece to id), the same merges where the sources list them, and each added token
    a piece of that vocabulary at its own id. Any reading error (the files are not what they say) is False."""
    key = (hashlib.sha256(tokenizer_json).hexdigest(), tuple(_digests(sources).items()))
    if key not in _BOUND:
        try:
            vocab, merges = _source_model(sources)
            added = backend.get_added_tokens_decoder()
            _BOUND[key] = (vocab is not None and backend.get_vocab(with_added_tokens=False) == vocab
                           and all(vocab.get(token.content) == k for k, token in added.items())
                           and (merges is None or _merges(json.loads(tokenizer_json)["model"].get("merges")) == merges))
        except Exception:  # noqa: BLE001 -- whatever the bytes hold, unbound files are derived again, never trusted
            _BOUND[key] = False
    return _BOUND[key]


def write_cached(folder: Path, digest: str, files: dict[str, bytes],
                 sources: Optional[dict[str, bytes]] = None) -> None:
    """Write the files in a staging folder beside `folder` (`.<name>.partial-pid<P>-<8>`, what a killed writer
    left removed first, S26), then move each over its name (the record last): a reader sees old or new. The
    record names the files' digests, the recipe's and the sources' (S71, S78)."""
    if folder.is_symlink() or folder.parent.is_symlink():
        raise NotADirectoryError(f"{folder} is reached through a link; nothing is written there")
    folder.mkdir(parents=True, exist_ok=True)
    builder.clean_stale(folder.parent, folder.name)
    record: dict[str, Any] = {"digest": digest, "files": _digests(files)}
    if sources is not None:
        record["sources"] = _digests(sources)
    tmp = builder.staging(folder.parent, folder.name)
    try:
        for fn, data in [*files.items(), (RECORD, json.dumps(record, sort_keys=True, indent=2).encode())]:
            (tmp / fn).write_bytes(data)
            os.replace(tmp / fn, folder / fn)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached(checkpoint: Path, digest: str, load: Callable[[], Any], listed: Optional[dict[str, str]] = None):
    """The fixture's tokenizer: the adapter from verified cached files, else from files derived from `load()`
    (the AutoTokenizer) and written to the cache; `load()` itself for a tokenizer the adapter cannot serve.
    `listed` ({file: sha256}, the recipe's tokenizer sources) binds the cache to them: cached files are used
    only when they hold the sources' vocabulary, and a checkpoint whose sources are not those is never
    derived from (its AutoTokenizer serves this process alone) (S78)."""
    folder = folder_of(checkpoint)
    sources = source_files(checkpoint, listed) if listed is not None else None
    if listed is not None and sources is None:
        return load()
    files = read_cached(folder, digest, sources)
    if files is not None:
        served = from_files(files, load)
        if sources is None or bound(served.backend_tokenizer, files["tokenizer.json"], sources):
            return served
    full = load()
    files = derive(full)
    if files is None:
        return full
    try:
        write_cached(folder, digest, files, sources)
    except OSError:  # a cache that cannot be written: this process is served from memory, the next derives again
        pass
    return from_files(files, lambda: full)
