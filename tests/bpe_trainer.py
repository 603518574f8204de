"""The trainer of the GPT-2 / GptOss fixtures' committed byte-level BPE (SPEC.md §5 X3).

No fixture build runs it: the trained vocab.json / merges.txt are committed under
causalab_ref/fixture_data/bpe/, and tests/test_fixtures.py checks that this trainer reproduces
them from the committed corpus (and tokenizer.json from them).  `python tests/bpe_trainer.py`
regenerates all three in place.
"""
from __future__ import annotations

import json
import pathlib
from typing import Optional

from causalab_ref.fixtures.recipes import BPE_DIR, BPE_TOKENIZER_CONFIG, DATA_DIR, EOT

BPE_CORPUS = DATA_DIR / "bpe_corpus.txt"
BPE_VOCAB_SIZE = 1000


def _bytes_to_unicode_order() -> list[str]:
    """GPT-2's byte -> printable-char map, in GPT-2's vocab order (printable bytes first)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def train_bpe(corpus: Optional[pathlib.Path] = None, out_dir: Optional[pathlib.Path] = None) -> pathlib.Path:
    """Regenerate fixture_data/bpe/{vocab.json,merges.txt} from the committed corpus.

    Id 0 is `<|endoftext|>`, ids 1..256 the bytes in GPT-2's order (so 'I'=41, 'f'=70 as on
    the real tokenizer), then 743 merges in rank order. The merge "I f" is refused (so "If"
    splits in two as on the real one), with every merge that would depend on it. The corpus
    avoids the word "Friday", so " Friday" stays several tokens. Never run by a build.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    corpus = corpus or BPE_CORPUS
    out_dir = out_dir or BPE_DIR
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=4 * BPE_VOCAB_SIZE, min_frequency=1, special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(corpus.read_text(encoding="utf-8").splitlines(keepends=True), trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    vocab = {EOT: 0}
    for ch in _bytes_to_unicode_order():
        vocab[ch] = len(vocab)
    kept = []
    for a, b in merges:
        if len(vocab) == BPE_VOCAB_SIZE:
            break
        if (a, b) == ("I", "f") or a not in vocab or b not in vocab or a + b in vocab:
            continue
        kept.append(f"{a} {b}")
        vocab[a + b] = len(vocab)
    if len(vocab) != BPE_VOCAB_SIZE:
        raise RuntimeError(f"corpus too small: {len(vocab)} ids, want {BPE_VOCAB_SIZE}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False) + "\n", encoding="utf-8")
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(kept) + "\n", encoding="utf-8")
    return out_dir


def tokenizer_json(bpe_dir: Optional[pathlib.Path] = None, out_dir: Optional[pathlib.Path] = None) -> pathlib.Path:
    """Write tokenizer.json: the `tokenizers` serialization of the BPE in `bpe_dir`'s vocab.json and
    merges.txt, loaded as the GPT-2 fixture loads it.  The OLMo-2 fixture ships it, because
    transformers loads an OLMo-2 tokenizer only from a tokenizer.json."""
    import shutil
    import tempfile

    from transformers import AutoTokenizer

    bpe_dir = bpe_dir or BPE_DIR
    out_dir = out_dir or BPE_DIR
    with tempfile.TemporaryDirectory() as tmp:
        for fn in ("vocab.json", "merges.txt"):
            shutil.copyfile(bpe_dir / fn, pathlib.Path(tmp) / fn)
        (pathlib.Path(tmp) / "tokenizer_config.json").write_text(json.dumps(BPE_TOKENIZER_CONFIG), encoding="utf-8")
        text = AutoTokenizer.from_pretrained(tmp).backend_tokenizer.to_str()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.json").write_text(text + "\n", encoding="utf-8")
    return out_dir


if __name__ == "__main__":
    print(train_bpe())
    print(tokenizer_json())
