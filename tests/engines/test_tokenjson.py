"""tokenjson.py: compile's tokenizer from the cached tokenizer.json, call for call against transformers' AutoTokenizer.

On every fixture, the adapter `weightless.load` serves and the AutoTokenizer loaded as nnsight loads it (the
run engines' tokenizer, E9) must give the same ids, pieces, decodes, left-padded batches, masks and character
maps for the seeds' texts, every string of the shipped documents and data tables, and odd text; a damaged
cached file is rebuilt, never read.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from causalab_ref.engines import tokenjson, weightless
from causalab_ref.fixtures import builder
from causalab_ref.positions import resolve
from causalab_ref.runs import data
from causalab_ref import interrupts
from causalab_ref.shapes import Model, read_json

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ("tiny-llama", "tiny-gpt2", "tiny-gemma2", "tiny-gptoss", "tiny-olmo2", "tiny-qwen3next", "weekday-llama",
            "distributed-gpt2")
ODD = ["", " ", "  ", "\t", "\n", "a  b   c\t\td\n\ne", "   leading", "trailing   ", "naïve café", "日本語のテキスト",
       "emoji 🙂🧪 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "e\u0301 combining", "\u200b zero width", "\ufffd replacement", "Ωμέγα ∑ ∫",
       "<s>", "</s>", "<unk>", "<pad>", "<|endoftext|>", "a<s>b</s>c", " <|endoftext|> x", "<0x41> looks like a byte",
       "don't , you ' re . ? !", "x" * 600, "\u2581 the metaspace", "12345 67.89", "\r\n windows"]


def _strings(value, out: list) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, out)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)


def _all_texts() -> list[str]:
    """The seeds' lines, every string of the shipped documents and data tables, and ODD, once each."""
    found: list[str] = []
    for seed in sorted((ROOT.parent / "shared" / "seeds").glob("*.txt")):
        found += seed.read_text(encoding="utf-8").splitlines()
    for path in sorted([*(ROOT / "documents").rglob("*.json")]):
        _strings(read_json(path), found)
    return list(dict.fromkeys([*ODD, *found]))


TEXTS = _all_texts()
#: one fixture of each tokenizer family sees every text; the others, which share a family's files, the odd
#: texts and every fourth other (the suite's budget)
FULL = ("tiny-llama", "tiny-gpt2", "weekday-llama", "distributed-gpt2")


@pytest.fixture(scope="session", params=FIXTURES)
def pair(request):
    """(the adapter compile is served, the AutoTokenizer as nnsight loads it), each with the contract's pad."""
    key = f"fixture:{request.param}"
    path = builder.checkpoint_dir(key)
    raw = read_json(path / "config.json")
    adapter = weightless.fixture_tokenizer(key, str(path), raw)
    assert isinstance(adapter, tokenjson.JsonTokenizer)
    texts = TEXTS if request.param in FULL else [*ODD, *TEXTS[len(ODD)::4]]
    return resolve.with_pad(adapter), resolve.with_pad(weightless.tokenizer(str(path), raw)), texts


def test_the_texts_cover_the_seeds_tables_and_odd_text():
    """SPEC.md:1981 [E14] — the compared texts hold the seeds' prose, the shipped tables' strings and ODD."""
    assert len(TEXTS) > 500 and set(ODD) <= set(TEXTS) and "" in TEXTS


def test_the_adapter_has_the_tokenizers_special_tokens_and_side(pair):
    """SPEC.md:1981 [E14] — special tokens and their ids, the padding side, the length limit, the vocabulary
    and its size and the chat template are the AutoTokenizer's."""
    ours, theirs, texts = pair
    for name in ("bos_token", "eos_token", "pad_token", "unk_token", "bos_token_id", "eos_token_id", "pad_token_id",
                 "unk_token_id", "padding_side", "model_max_length", "chat_template"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.get_vocab() == theirs.get_vocab() and len(ours) == len(theirs)


def test_the_adapter_encodes_and_decodes_every_text_as_the_autotokenizer(pair):
    """SPEC.md:1981 [E14] — each text's ids with and without special tokens, its pieces and its decode (every
    fifth text's with and without special tokens and clean-up too) are the AutoTokenizer's (transformers' own
    batch calls, which take each text as its single call does)."""
    ours, theirs, texts = pair
    rows = {special: theirs(texts, add_special_tokens=special)["input_ids"] for special in (True, False)}
    assert [ours.encode(t, add_special_tokens=True) for t in texts] == rows[True]
    assert [ours.encode(t, add_special_tokens=False) for t in texts] == rows[False]
    assert [ours(t)["input_ids"] for t in ODD] == [theirs(t)["input_ids"] for t in ODD]
    assert [ours.convert_ids_to_tokens(r) for r in rows[True]] == [theirs.convert_ids_to_tokens(r) for r in rows[True]]
    assert [ours.decode(r) for r in rows[True]] == theirs.batch_decode(rows[True])  # compile's check decode
    few = rows[True][::5]
    for skip, clean in ((False, False), (True, True)):
        assert [ours.decode(r, skip_special_tokens=skip, clean_up_tokenization_spaces=clean) for r in few] == (
            theirs.batch_decode(few, skip_special_tokens=skip, clean_up_tokenization_spaces=clean))


def test_the_adapter_pads_batches_and_maps_characters_as_the_autotokenizer(pair):
    """SPEC.md:1981 [E14] — left-padded batches of the texts (ids and attention masks) and their frames (content
    ranges, decoded texts, character maps, for the odd texts and every 20th other; P22's definition as well
    for the odd texts) are the AutoTokenizer's."""
    ours, theirs, texts = pair
    for lo in range(0, len(texts), 64):
        batch = texts[lo: lo + 64]
        assert resolve.batch_of_texts(ours, batch) == resolve.batch_of_texts(theirs, batch), batch
    framed = [*ODD, *texts[len(ODD)::20]]  # the maps are resolve's code on the decodes compared above: a sample
    for lo in range(0, len(framed), 24):
        batch = framed[lo: lo + 24]
        assert resolve.frame_of_texts(ours, batch) == resolve.frame_of_texts(theirs, batch), batch
    for text in ODD:
        ids = theirs.encode(text, add_special_tokens=True)
        assert resolve.char_map(ours, ids) == resolve.char_map(theirs, ids), text
    assert resolve.linear_map_serves(ours) == resolve.linear_map_serves(theirs)
    assert resolve.decodes_by_pieces(ours) == resolve.decodes_by_pieces(theirs)
    assert data.characters_per_token(ours) == data.characters_per_token(theirs)


def test_a_chat_template_is_rendered_by_the_autotokenizer():
    """SPEC.md:2000 [E16] — a conversation renders through the checkpoint's template to the AutoTokenizer's text."""
    key = "fixture:tiny-llama"
    path = builder.checkpoint_dir(key)
    raw = read_json(path / "config.json")
    ours = weightless.fixture_tokenizer(key, str(path), raw)
    theirs = weightless.tokenizer(str(path), raw)
    chat = [{"role": "user", "content": "Which day follows Monday?"}, {"role": "assistant", "content": "Tuesday"},
            {"role": "user", "content": "And then?"}]
    assert data.render_chat(ours, chat) == data.render_chat(theirs, chat) and data.render_chat(ours, chat)


def _copy_fixture_cache(tmp_path: Path, monkeypatch) -> Path:
    """The tiny-gpt2 fixture folder copied into a fresh cache root; the cache points there."""
    source = builder.checkpoint_dir("fixture:tiny-gpt2")
    root = tmp_path / "cache"
    (root / source.name).mkdir(parents=True)
    for entry in source.iterdir():
        (root / source.name / entry.name).write_bytes(entry.read_bytes())
    monkeypatch.setenv(builder.CACHE_ENV, str(root))
    return root / source.name


@pytest.mark.parametrize("damage", ["truncated", "changed", "linked", "record", "foreign recipe", "missing"])
def test_a_damaged_cached_tokenizer_is_rebuilt_never_trusted(tmp_path, monkeypatch, damage):
    """SPEC.md:1166 [S71] — a cached tokenizer.json or adapter.json whose bytes are not its record's, a link, a
    damaged record or one of another recipe is not read: the files are derived again from the AutoTokenizer
    and the adapter answers as it does."""
    folder = _copy_fixture_cache(tmp_path, monkeypatch)
    spec = Model(key="fixture:tiny-gpt2", revision="seeded", dtype="fp32")
    first = weightless.load(spec)
    cached = tokenjson.folder_of(folder)
    good = (cached / "tokenizer.json").read_bytes()
    target = cached / "tokenizer.json"
    decoy = tmp_path / "decoy.json"
    decoy.write_text(json.dumps({**json.loads(good), "added_tokens": []}), encoding="utf-8")
    if damage == "truncated":
        target.write_bytes(good[: len(good) // 2])
    elif damage == "changed":
        target.write_bytes(decoy.read_bytes())
    elif damage == "linked":
        target.unlink()
        os.symlink(decoy, target)
    elif damage == "record":
        (cached / tokenjson.RECORD).write_text("{not json", encoding="utf-8")
    elif damage == "foreign recipe":
        record = json.loads((cached / tokenjson.RECORD).read_text(encoding="utf-8"))
        (cached / tokenjson.RECORD).write_text(json.dumps({**record, "digest": "0" * 64}), encoding="utf-8")
    else:
        (cached / "adapter.json").unlink()
    assert tokenjson.read_cached(cached, builder.recipe_digest(spec.key)) is None
    again = weightless.load(spec)
    assert (cached / "tokenizer.json").read_bytes() == good and not (cached / "tokenizer.json").is_symlink()
    assert again.tokenizer.encode("<|endoftext|> Monday") == first.tokenizer.encode("<|endoftext|> Monday")
    assert tokenjson.read_cached(cached, builder.recipe_digest(spec.key)) is not None


@pytest.mark.parametrize("block", ["file", "link"])
def test_a_cache_that_cannot_be_written_still_serves_the_adapter(tmp_path, monkeypatch, block):
    """SPEC.md:1186 [S72] — where the tokenizers folder is a file, or a link (nothing is written through it), the
    adapter is served from memory."""
    folder = _copy_fixture_cache(tmp_path, monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if block == "file":
        (folder.parent / "tokenizers").write_text("a file where the folder would be", encoding="utf-8")
    else:
        (folder.parent / "tokenizers").symlink_to(elsewhere)
    tok = weightless.fixture_tokenizer("fixture:tiny-gpt2", str(folder), read_json(folder / "config.json"))
    assert isinstance(tok, tokenjson.JsonTokenizer) and tok.encode(" Monday") == weightless.tokenizer(
        str(folder), read_json(folder / "config.json")).encode(" Monday")
    assert list(elsewhere.iterdir()) == []


def test_a_tokenizer_class_that_overrides_a_served_call_is_not_adapted(pair):
    """SPEC.md:1997 [E15] — a tokenizer whose class overrides one of the calls the adapter answers is not
    derived (the caller keeps the AutoTokenizer)."""
    _ours, theirs, _texts = pair
    assert tokenjson.servable(theirs)
    odd = type("Odd", (type(theirs),), {"encode": lambda self, text, **kw: [0]})
    theirs.__class__ = odd
    try:
        assert not tokenjson.servable(theirs) and tokenjson.derive(theirs) is None
    finally:
        theirs.__class__ = odd.__mro__[1]


class Mirror(tokenjson.JsonTokenizer):
    """The adapter, each call compile makes also made on the AutoTokenizer; what differs is kept in `differ`."""

    def __init__(self, ours: tokenjson.JsonTokenizer, theirs):
        self.__dict__.update(ours.__dict__)
        self.theirs, self.calls, self.differ = theirs, 0, []

    def _both(self, name: str, args, kwargs, view=lambda x: x):
        mine = getattr(tokenjson.JsonTokenizer, name)(self, *args, **kwargs)
        yours = getattr(self.theirs, name)(*args, **kwargs)
        self.calls += 1
        if view(mine) != view(yours):
            self.differ.append((name, args, kwargs))
        return mine

    def __call__(self, *args, **kwargs):
        return self._both("__call__", args, kwargs, lambda e: (e["input_ids"], e["attention_mask"]))

    def encode(self, *args, **kwargs):
        return self._both("encode", args, kwargs)

    def decode(self, *args, **kwargs):
        return self._both("decode", args, kwargs)

    def convert_ids_to_tokens(self, *args, **kwargs):
        return self._both("convert_ids_to_tokens", args, kwargs)


def test_compile_and_the_run_engines_tokenizer_agree_on_every_shipped_document(monkeypatch):
    """SPEC.md:1981 [E14] — validating every shipped document (documents/, steps_first/ too), each tokenizer call
    compile makes gives on the adapter what it gives on the AutoTokenizer the run engines load (ids, masks,
    decodes, pieces): the batches, and so the positions compiled with one, are the other's."""
    from inprocess import cli

    real, mirrors = weightless.fixture_tokenizer, {}

    def mirrored(key, path, raw, digest=None):
        if path not in mirrors:
            mirrors[path] = Mirror(real(key, path, raw, digest), resolve.with_pad(weightless.tokenizer(path, raw)))
        return mirrors[path]

    monkeypatch.setattr(weightless, "fixture_tokenizer", mirrored)
    documents = sorted((ROOT / "documents").glob("*.json")) + sorted((ROOT / "documents" / "steps_first").glob("*.json"))
    for document in documents:
        done = cli("validate", str(document.relative_to(ROOT)))
        assert done.returncode == 0, (document, done.stderr)
    assert len(mirrors) >= 3 and all(m.calls > 0 for m in mirrors.values())
    assert [m.differ for m in mirrors.values()] == [[] for _ in mirrors]


def test_what_a_killed_writer_left_is_removed_by_the_next_write(tmp_path, monkeypatch):
    """SPEC.md:1166 [S71] — a staging folder a dead process left beside the derived tokenizer's folder is removed
    when the files are next written, and the files are whole."""
    folder = _copy_fixture_cache(tmp_path, monkeypatch)
    cached = tokenjson.folder_of(folder)
    cached.parent.mkdir(parents=True)
    left = cached.parent / f"{interrupts.staged_prefix(cached.name, pid=2 ** 22 + 1)}abcdefgh"
    left.mkdir()
    (left / "tokenizer.json").write_text("half", encoding="utf-8")
    weightless.fixture_tokenizer("fixture:tiny-gpt2", str(folder), read_json(folder / "config.json"))
    assert not left.exists() and sorted(p.name for p in cached.parent.iterdir()) == [cached.name]
    assert tokenjson.read_cached(cached, builder.recipe_digest("fixture:tiny-gpt2")) is not None


def _copy_with_derived(tmp_path: Path, monkeypatch, key: str) -> tuple[Path, Path]:
    """A fixture folder and its derived tokenizer's folder copied into a fresh cache root (the cache points there)."""
    source = builder.checkpoint_dir(key)
    weightless.fixture_tokenizer(key, str(source), read_json(source / "config.json"))  # derived and bound there
    root = tmp_path / "cache"
    for folder, dest in ((source, root / source.name), (tokenjson.folder_of(source), root / "tokenizers" / source.name)):
        dest.mkdir(parents=True)
        for entry in folder.iterdir():
            (dest / entry.name).write_bytes(entry.read_bytes())
    monkeypatch.setenv(builder.CACHE_ENV, str(root))
    return root / source.name, root / "tokenizers" / source.name


def _forged(cached: Path, edit) -> None:
    """tokenizer.json edited by `edit` and the record's sha256 line rewritten to match it (the record vouching
    for what it holds, as a forger would write it)."""
    import hashlib

    derived = json.loads((cached / "tokenizer.json").read_bytes())
    edit(derived)
    raw = json.dumps(derived).encode("utf-8")
    (cached / "tokenizer.json").write_bytes(raw)
    record = json.loads((cached / tokenjson.RECORD).read_text(encoding="utf-8"))
    record["files"]["tokenizer.json"] = hashlib.sha256(raw).hexdigest()
    (cached / tokenjson.RECORD).write_text(json.dumps(record), encoding="utf-8")


def _exchange(a: str, b: str):
    def edit(derived: dict) -> None:
        vocab = derived["model"]["vocab"]
        vocab[a], vocab[b] = vocab[b], vocab[a]
    return edit


def _added(content: str, id_: int):
    def edit(derived: dict) -> None:
        derived["added_tokens"].append({"id": id_, "content": content, "single_word": False, "lstrip": False,
                                        "rstrip": False, "normalized": False, "special": True})
    return edit


def _merges_reversed(derived: dict) -> None:
    derived["model"]["merges"] = derived["model"]["merges"][::-1]


@pytest.mark.parametrize("key, forgery", [
    ("fixture:tiny-gpt2", _exchange("\u0120Monday", "\u0120Tuesday")),
    ("fixture:tiny-gpt2", _merges_reversed),
    ("fixture:tiny-gpt2", _added(" Monday", 7)),
    ("fixture:weekday-llama", _exchange("\u0120Monday", "\u0120Tuesday")),
    ("fixture:tiny-llama", _exchange("\u2581Mon", "\u2581Month")),
], ids=["gpt2-ids-exchanged", "gpt2-merges-reversed", "gpt2-added-token", "weekday-ids-exchanged",
        "llama-sentencepiece-ids-exchanged"])
def test_a_derived_tokenizer_whose_record_was_rewritten_to_match_is_not_trusted(tmp_path, monkeypatch, key,
                                                                                 forgery):
    """SPEC.md:1173 [S78] — a cached tokenizer.json whose vocabulary (two ids exchanged), merges or added tokens
    differ from the fixture's source files, its record's sha256 line rewritten to match, is not served: the
    tokenizer is derived again and encodes as the AutoTokenizer does (before, the forged ids were served)."""
    folder, cached = _copy_with_derived(tmp_path, monkeypatch, key)
    raw = read_json(folder / "config.json")
    truth = weightless.tokenizer(str(folder), raw)
    texts = [" Monday", " Tuesday", "Monday is a day", " Monday Tuesday"]
    want = [truth.encode(t) for t in texts]
    _forged(cached, forgery)
    spec = Model(key=key, revision="main", dtype="fp32")
    assert tokenjson.read_cached(cached, builder.recipe_digest(key)) is not None  # the record alone vouches
    served = weightless.load(spec).tokenizer
    assert isinstance(served, tokenjson.JsonTokenizer) and [served.encode(t) for t in texts] == want
    record = json.loads((cached / tokenjson.RECORD).read_text(encoding="utf-8"))
    assert record["sources"] == builder.tokenizer_sources(key)  # derived again, bound to the recipe's sources


def test_a_record_of_other_sources_is_derived_again(tmp_path, monkeypatch):
    """SPEC.md:1173 [S78] — a record whose `sources` are not the recipe's source digests (a tokenizer derived from
    other files) is not served as it is: the files are derived again and the record names the recipe's."""
    key = "fixture:tiny-gpt2"
    _folder, cached = _copy_with_derived(tmp_path, monkeypatch, key)
    record = json.loads((cached / tokenjson.RECORD).read_text(encoding="utf-8"))
    record["sources"] = {fn: "0" * 64 for fn in record["sources"]}
    (cached / tokenjson.RECORD).write_text(json.dumps(record), encoding="utf-8")
    weightless.load(Model(key=key, revision="main", dtype="fp32"))
    assert json.loads((cached / tokenjson.RECORD).read_text(encoding="utf-8"))["sources"] == \
        builder.tokenizer_sources(key)


def test_the_sources_are_the_recipes_not_the_caches():
    """SPEC.md:1173 [S78] — the digests a derived tokenizer is bound to are hashed from the package's own files:
    for a BPE fixture, the committed vocab.json and merges.txt (recomputed here from the files themselves)."""
    import hashlib

    from causalab_ref.fixtures import recipes

    want = {fn: hashlib.sha256((recipes.BPE_DIR / fn).read_bytes()).hexdigest() for fn in ("merges.txt", "vocab.json")}
    assert builder.tokenizer_sources("fixture:tiny-gpt2") == want
