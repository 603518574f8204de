"""Benchmarks (not a test): ratios measured side by side in one process.

    python bench/run_bench.py [--rows 64] [--repeats 7] [--only a,b,c,d]

(a) `run` of the interchange document (documents/patching.json: block_output[0] at -1 read on the
    counterfactual, swapped into the base run, the head read at -1) on 64 rows, versus a hand-written
    nnsight trace doing the same reads and writes, versus the bare forward passes; on the Llama
    fixture and on a larger seeded Llama (8 layers, hidden 512) built the same way. Target: run at
    most 1.25x the hand-written trace.
(b) the character map: a linear-time construction (the tokenizer's streaming detokenizer,
    tokenizers' DecodeStream) versus the decode-prefix map (locate.char_map), on 256 rows of 512
    tokens; every row checked equal. Target: 10x faster, identical output.
(c) explain on every shipped document, without weights: seconds per document after imports.
(d) peak memory (max RSS) of `run documents/patching.json` on the Llama fixture, versus a process
    that only loads the same model with weights.
Timings are medians of interleaved repeats. CPU threads are pinned to 1 for stable numbers.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import pathlib
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from causalab_ref import compile as compiler  # noqa: E402
from causalab_ref import engine, fixtures, locate, run  # noqa: E402
from causalab_ref.shapes import Model  # noqa: E402

DOC = json.loads((ROOT / "documents" / "patching.json").read_text(encoding="utf-8"))
DATA = ROOT / "documents" / "data"
BIG = "bench-llama-8x512"


def register_big() -> str:
    """A larger seeded Llama built exactly as the fixtures are (recipe, seeded init, same tokenizer)."""
    config = dict(fixtures.LLAMA_CONFIG, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=8)
    fixtures._RECIPES[BIG] = {"config": config, "seed": 2001, "tokenizer": "llama2",
                              "stands_in_for": "(bench only) a larger Llama, 8 layers, hidden 512"}
    return fixtures.FIXTURE_PREFIX + BIG


def timed(fn, repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def side_by_side(fns: dict, repeats: int) -> dict:
    """Interleaved medians: each repeat runs every candidate once, in turn."""
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


# ---------------------------------------------------------------- (a)


def bench_a(key: str, rows: int, repeats: int, tmp: pathlib.Path) -> None:
    eng = engine.load(Model(key=key, revision="seeded", dtype="fp32"), weights=True)
    doc = copy.deepcopy(DOC)
    doc["model"]["key"] = key
    root = tmp / "data"
    if not root.exists():
        shutil.copytree(DATA, root)
        base = json.loads((DATA / "weekdays" / "train.json").read_text(encoding="utf-8"))
        (root / "weekdays" / "train.json").write_text(json.dumps((base * rows)[:rows]), encoding="utf-8")
    t = time.perf_counter()
    plan = compiler.compile_document(doc, eng, root)
    compile_s = time.perf_counter() - t
    step = plan.leaves()[0].steps[0]
    by_input = {f.input: f for f in step.forwards}
    cf, bs = by_input["counterfactual"], by_input["base"]
    cf_in = {"input_ids": torch.tensor(cf.ids), "attention_mask": torch.tensor(cf.mask)}
    bs_in = {"input_ids": torch.tensor(bs.ids), "attention_mask": torch.tensor(bs.mask)}
    model = eng.model
    metric = {m.name: m for m in step.metrics}
    expected = torch.tensor(dict(metric["iia"].answers)["expected"])
    a_ids = torch.tensor(dict(metric["logit_diff"].answers)["a"])
    b_ids = torch.tensor(dict(metric["logit_diff"].answers)["b"])
    out = tmp / "out"

    def hand():
        with torch.no_grad():
            with model.trace(cf_in):
                v_cf = model.layers_output[0][:, -1, :].save()
            with model.trace(bs_in):
                model.layers_output[0][:, -1, :] = v_cf
                logits = model.lm_head.output[:, -1, :].save()
        logits = getattr(logits, "value", logits)
        iia = (logits.argmax(-1) == expected).float()
        diff = logits.gather(1, a_ids[:, None])[:, 0] - logits.gather(1, b_ids[:, None])[:, 0]
        return logits, iia, diff

    def bare():
        with torch.no_grad():
            model._module(**cf_in)
            model._module(**bs_in)

    def execute():
        run.execute(plan, eng, out, replace=True, progress=False)

    def run_step():
        return run.run_step(eng, step)

    # The hand-written trace does the same reads and writes: same logits as the run.
    mine, _iia, _diff = hand()
    theirs = run_step()["values"]["logits"][:, 0, :]
    assert torch.allclose(mine, theirs, atol=1e-5), float((mine - theirs).abs().max())
    t = side_by_side({"run": execute, "run_step": run_step, "hand": hand, "bare": bare}, repeats)
    print(f"(a) {key} ({eng.num_layers} layers, hidden {model.config.hidden_size}), {rows} rows x "
          f"{len(bs.ids[0])} tokens, 2 forwards; compile {compile_s * 1e3:.1f} ms (once)")
    print(f"    run (execute, files written) {t['run'] * 1e3:8.2f} ms   = {t['run'] / t['hand']:.2f}x hand-written "
          f"nnsight, {t['run'] / t['bare']:.2f}x bare forwards   [target <= 1.25x hand: "
          f"{'met' if t['run'] / t['hand'] <= 1.25 else 'NOT met'}]")
    print(f"    run_step (no files)          {t['run_step'] * 1e3:8.2f} ms   = {t['run_step'] / t['hand']:.2f}x hand, "
          f"{t['run_step'] / t['bare']:.2f}x bare")
    print(f"    hand-written nnsight trace   {t['hand'] * 1e3:8.2f} ms   = {t['hand'] / t['bare']:.2f}x bare")
    print(f"    bare forward passes          {t['bare'] * 1e3:8.2f} ms")


# ---------------------------------------------------------------- (b)


def stream_char_map(tok, ids) -> tuple[int, ...]:
    """Linear time, the same offsets as locate.char_map (the decode-prefix map).

    The ids go one at a time through the tokenizer's streaming detokenizer (tokenizers'
    DecodeStream); while no character is pending, the text emitted so far is the decoded prefix,
    so offsets[k] is its length. A token that leaves a character's bytes incomplete emits nothing:
    its prefix decodes to the emitted text plus U+FFFD, which is not a prefix of the whole text
    when the character completes as something else, so the decode-prefix map reuses the previous
    offset too. Only when what follows the pending bytes is itself U+FFFD (bytes that never
    complete, as at a row cut mid-character) are those few positions decoded as prefixes, by the
    reference rule, so the output is identical by construction.
    """
    from tokenizers.decoders import DecodeStream

    ids = [int(i) for i in ids]
    text = locate._decode(tok, ids)
    byte = [p.startswith("<0x") and p.endswith(">") for p in tok.convert_ids_to_tokens(ids)]
    backend = tok.backend_tokenizer
    stream = DecodeStream(skip_special_tokens=False)
    offsets: list[int] = []
    length, pending, group = 0, False, 0

    def by_prefix(lo: int, hi: int) -> None:  # the reference rule at positions lo..hi-1
        for k in range(lo, hi):
            prefix = locate._decode(tok, ids[:k])
            at = len(prefix) if text.startswith(prefix) else offsets[k - 1]
            offsets[k] = max(at, offsets[k - 1]) if k else 0

    for k, i in enumerate(ids):
        offsets.append(length)
        if not byte[k]:
            group = k  # a byte group (consecutive byte-fallback pieces) starts after this
        elif k == 0 or not byte[k - 1]:
            group = k
        piece = stream.step(backend, i)
        if piece is None:
            pending = True
            continue
        if "\ufffd" in piece:  # bytes that did not make a character: decoded as prefixes, then re-synced
            by_prefix(group + 1, k + 1)
            length = len(locate._decode(tok, ids[: k + 1]))
        else:
            length += len(piece)
        pending = False
    if pending:  # bytes still incomplete at the end of the row: their whole group, as prefixes
        by_prefix(group + 1, len(ids))
    return tuple(offsets) + (len(text),)


def bench_b(rows: int, length: int, repeats: int) -> None:
    tok = fixtures.tokenizer("fixture:tiny-llama")
    rng = random.Random(0)
    words = ["If", "today", "is", "Thursday,", "tomorrow", "Saturday", "été", "naïve", "日本語", "😀", "🚀",
             "Ωmega", "x", "—", "e\u0301", "\u3042", "(", "'s", "  ", "\n", "Monday.", "🤖🤖", "1234", "Zürich"]
    texts = [" ".join(rng.choice(words) for _ in range(length)) for _ in range(rows)]
    batch = [tok.encode(t, add_special_tokens=False)[:length] for t in texts]
    assert all(len(r) == length for r in batch)
    fallback = sum(1 for r in batch for i in r if tok.convert_ids_to_tokens(i).startswith("<0x"))
    prefix = [locate.char_map(tok, r) for r in batch]
    linear = [stream_char_map(tok, r) for r in batch]
    same = sum(a == b for a, b in zip(prefix, linear))
    t = side_by_side({"prefix": lambda: [locate.char_map(tok, r) for r in batch],
                      "linear": lambda: [stream_char_map(tok, r) for r in batch]}, repeats)
    ratio = t["prefix"] / t["linear"]
    print(f"(b) character map, {rows} rows x {length} tokens ({fallback} byte-fallback pieces): identical on "
          f"{same}/{rows} rows; decode-prefix {t['prefix']:.3f} s, linear {t['linear']:.3f} s = {ratio:.1f}x faster "
          f"[target 10x, identical: {'met' if ratio >= 10 and same == rows else 'NOT met'}]")


# ---------------------------------------------------------------- (c)


def bench_c(repeats: int) -> None:
    from causalab_ref import cli

    docs = sorted((ROOT / "documents").glob("*.json"))
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        def explain(doc):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
                status = cli.main(["explain", str(doc)])
            assert status == 0, err.getvalue()
        times = {d.name: timed(lambda d=d: explain(d), repeats) for d in docs}
    finally:
        os.chdir(cwd)
    print(f"(c) explain, no weights, after imports (model shell loaded per call): "
          f"median {statistics.median(times.values()) * 1e3:.0f} ms per document")
    for name, s in times.items():
        print(f"    {name:36s} {s * 1e3:7.0f} ms")


# ---------------------------------------------------------------- (d)


def _peak(code: str) -> float:
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(proc.stdout.strip().splitlines()[-1]) / 1024  # KiB -> MiB


def bench_d(tmp: pathlib.Path) -> None:
    out = tmp / "mem-out"
    run_code = ("import resource, sys; from causalab_ref import cli; "
                f"s = cli.main(['run', 'documents/patching.json', '--out', {str(out)!r}, '--replace', '--quiet']); "
                "assert s == 0; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    load_code = ("import resource; from causalab_ref import engine; from causalab_ref.shapes import Model; "
                 "engine.load(Model(key='fixture:tiny-llama', revision='seeded', dtype='fp32'), weights=True); "
                 "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    run_mib, load_mib = _peak(run_code), _peak(load_code)
    print(f"(d) peak memory (max RSS), run documents/patching.json on fixture:tiny-llama: {run_mib:.0f} MiB; "
          f"loading the model alone: {load_mib:.0f} MiB ({run_mib / load_mib:.2f}x, +{run_mib - load_mib:.0f} MiB)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", default="a,b,c,d")
    args = parser.parse_args()
    torch.set_num_threads(1)
    only = set(args.only.split(","))
    engine._quiet_transformers()
    print(f"causalab_ref bench: torch {torch.__version__}, {torch.get_num_threads()} thread, python "
          f"{sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        if "a" in only:
            bench_a("fixture:tiny-llama", args.rows, args.repeats, tmp / "small")
            bench_a(register_big(), args.rows, args.repeats, tmp / "big")
        if "b" in only:
            bench_b(256, 512, max(1, args.repeats // 3))
        if "c" in only:
            bench_c(max(1, args.repeats // 3))
        if "d" in only:
            bench_d(tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
