"""Fuzz the command line: N mutated documents and data tables through validate, explain, tokens and run.

    python bench/fuzz.py [N=10000] [--seed S] [--shard I/M] [--verbose]

Each case mutates one shipped document and/or one data table (tests/fuzzing.py) and runs
the four verbs (`tokens --document`) in this process; an outcome is foreign when it is not status 0, or status 2
with one `<stage>: ...` line, or when it breaks the invariant bench/fuzz_surfaces.py checks
(tests/invariant.py: no traceback or "internal error", no eligible non-finite row under --out,
nothing changed outside --out in the documents, a sentinel folder or the cwd, the time bound). Prints
the count of cases and of foreign outcomes, grouped by their last stderr line; exits 1 when
there is any. `--shard I/M` runs only the cases k with k % M == I (the same cases, M processes
side by side; their counts add up). Not a test: tests/safety/test_fuzz.py runs a few hundred of the same cases in CI.
"""
from __future__ import annotations

import argparse
import collections
import os
import pathlib
import random
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import fuzzing  # noqa: E402


def shared_arguments(default_n: int) -> argparse.ArgumentParser:
    """The arguments every fuzz script takes: how many cases, the seed, the shard, --verbose."""
    parser = argparse.ArgumentParser()
    parser.add_argument("n", nargs="?", type=int, default=default_n)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard", default="0/1", help="I/M: only the cases k with k %% M == I")
    parser.add_argument("--verbose", action="store_true")
    return parser


def main() -> int:
    args = shared_arguments(10_000).parse_args()
    shard, shards = (int(part) for part in args.shard.split("/"))
    os.chdir(ROOT)
    foreign: dict = collections.defaultdict(list)
    statuses: collections.Counter = collections.Counter()
    started = time.perf_counter()
    with fuzzing.cached_loads(), tempfile.TemporaryDirectory() as tmp:
        for k in range(shard, args.n, shards):
            rng = random.Random(args.seed * 1_000_003 + k)
            case_dir = pathlib.Path(tmp)
            found, outcomes = fuzzing.run_case(rng, case_dir, record=True)
            statuses.update(outcomes)
            for verb, source, status, text in found:
                key = (verb, status, (text.splitlines() or [""])[-1][:160])
                foreign[key].append((k, source))
                if args.verbose:
                    print(f"case {k} ({source}) {verb}: status {status}\n{text}\n", file=sys.stderr)
            if (k // shards + 1) % 500 == 0:
                print(f"{k // shards + 1} cases, {sum(len(v) for v in foreign.values())} foreign, "
                      f"{time.perf_counter() - started:.0f} s", flush=True)
    total = sum(len(v) for v in foreign.values())
    n = len(range(shard, args.n, shards))
    shown = f" (shard {args.shard})" if shards > 1 else ""
    print(f"fuzz: {n} cases{shown} ({sum(statuses.values())} runs of {'/'.join(fuzzing.VERB_ARGS)}) in "
          f"{time.perf_counter() - started:.0f} s; outcomes {dict(sorted(statuses.items()))}; "
          f"{total} foreign exception(s)")
    for (verb, status, line), cases in sorted(foreign.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(cases):5d} x {verb} status {status}: {line}  (e.g. case {cases[0][0]}, {cases[0][1]})")
    return 1 if total else 0


if __name__ == "__main__":
    raise SystemExit(main())
