"""Fuzz every input surface but documents and tables: bundles, case files, --impl outputs, flags, caches,
results folders, environment variables, exported folders, interrupts of the command line (`--surface` bundle,
case, impl, flags, cache, results, env, exported, interrupt).

    python bench/fuzz_surfaces.py [N=2000] [--seed S] [--shard I/M] [--surface NAME] [--minutes M] [--start K]
                                   [--verbose]

Each case (tests/fuzz_surfaces.py) mutates one surface and runs the verbs that read it in this
process, checking the invariant (tests/invariant.py, bench/fuzz.py's too): no internal error, no
eligible metric row with a non-finite or null value, nothing written outside --out (its staging
and lock names) or the cache, no case past its time bound. Prints the count of cases per surface
and every violation; exits 1 when there is any. `--shard I/M` runs only the cases k with
k % M == I; `--start K` only those with k >= K (a run resumed where it stopped: every case is seeded by
k). Not a test: tests/safety/test_fuzz_surfaces.py runs a few seeded cases of each surface in CI.
"""
from __future__ import annotations

import collections
import os
import pathlib
import random
import tempfile
import time

from fuzz import ROOT, shared_arguments  # bench/fuzz.py: the tests on sys.path, offline, the common arguments

import fuzz_surfaces  # noqa: E402


def main() -> int:
    parser = shared_arguments(2000)
    parser.add_argument("--surface", choices=fuzz_surfaces.SURFACES, default=None)
    parser.add_argument("--minutes", type=float, default=None, help="stop after this many minutes")
    parser.add_argument("--start", type=int, default=0, help="run only the cases k >= K")
    args = parser.parse_args()
    shard, shards = (int(part) for part in args.shard.split("/"))
    os.chdir(ROOT)
    counts: collections.Counter = collections.Counter()
    found: list[tuple] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fuzz-surfaces-") as tmp:
        for k in range(shard + shards * -(-max(0, args.start - shard) // shards), args.n, shards):
            if args.minutes is not None and time.perf_counter() - started > 60 * args.minutes:
                break
            rng = random.Random(args.seed * 1_000_003 + k)
            surface, results = fuzz_surfaces.run_case(rng, pathlib.Path(tmp), args.surface)
            counts[surface] += 1
            for argv, status, broken, stderr in results:
                if broken or args.verbose:  # a lone surrogate (an env value, a case's text) printed escaped
                    line = f"case {k} {surface}: {argv} -> {status}: {broken}\n  {stderr}"
                    print(line.encode("utf-8", "backslashreplace").decode("utf-8"), flush=True)
                if broken:
                    found.append((k, surface, argv, broken))
            if (k // shards + 1) % 100 == 0:
                print(f"{k // shards + 1} cases, {len(found)} violation(s), {time.perf_counter() - started:.0f} s",
                      flush=True)
    n = sum(counts.values())
    print(f"fuzz surfaces: {n} cases{f' (shard {args.shard})' if shards > 1 else ''} {dict(sorted(counts.items()))} "
          f"in {time.perf_counter() - started:.0f} s; {len(found)} violation(s)")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
