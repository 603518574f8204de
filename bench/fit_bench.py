"""Benchmark (not a test): a DAS fit of 64 pairs x 5 epochs on the Llama fixture (issue 13).

    python bench/fit_bench.py

Builds a 64-row table of weekday pairs in a temporary data root, fits an 8-dimensional subspace
of block_output[0] with pairs=16 (4 updates per epoch, 20 updates) and prints the wall time of the
fit step alone (compile excluded). The issue asks for well under a minute on this machine.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from causalab_ref.runs import compile as compiler
from causalab_ref.engines import loading
from causalab_ref.featurizers import kinds
from causalab_ref.runs import run
from causalab_ref.shapes import Model

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    raw = json.loads((ROOT / "documents" / "das.json").read_text())
    pairs = json.loads((ROOT / "documents" / "data" / "weekdays" / "pairs.json").read_text())
    rows = [dict(row, example_id=f"{row['example_id']}-{k}", split="train") for k in range(8) for row in pairs[:8]]
    tmp = Path(tempfile.mkdtemp())
    (tmp / "weekdays").mkdir()
    (tmp / "weekdays" / "pairs.json").write_text(json.dumps(rows + [dict(r, split="test") for r in pairs[8:]]))
    raw["steps"]["fit"].update(epochs=5, pairs=16)
    raw["steps"]["fit"]["early_stop"]["patience"] = 10
    llama = loading.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"))
    plan = compiler.compile_document(raw, llama, tmp)
    featurizers = kinds.build(plan.featurizers)
    step = plan.steps[0]
    started = time.perf_counter()
    result = run.fit_step(llama, step, featurizers)
    seconds = time.perf_counter() - started
    loss = result.curves["train/loss"]
    print(f"fit: 64 pairs x 5 epochs ({loss.shape[0]} updates of 16 pairs) in {seconds:.2f} s; "
          f"loss {float(loss[0]):.4f} -> {float(loss[-1]):.4f}")


if __name__ == "__main__":
    main()
