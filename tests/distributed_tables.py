"""The distributed-gpt2 fixture's data tables: documents/data/distributed/{train,test,few}.json (SPEC.md §5 X29).

Standalone (the standard library and tests/distributed_trainer.py's prompt grammar): the contexts are drawn,
with a fixed seed, from the held-out contexts the trainer wrote to splits.json beside the committed weights,
so no row's (prefix, filler, template) combination was seen in training; train.json and test.json take
disjoint contexts. Each context gives one row per name; the counterfactual is the same context with a name
of another team and another nuisance value, so base and counterfactual tokenize to the same length with only
the name's token different, and neither half of the name's state alone carries the counterfactual's whole
row. `python3 tests/distributed_tables.py` rewrites the three files in place.
"""
from __future__ import annotations

import json
import pathlib
import random

from distributed_trainer import FILLERS, NAMES, NUISANCE, PREFIXES, TEAM, TEMPLATES, render

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPLITS = ROOT / "causalab_ref" / "fixtures" / "fixture_data" / "distributed-gpt2" / "splits.json"
OUT = ROOT / "documents" / "data" / "distributed"
SEED = 2034
#: (split, contexts) dealt from the held-out contexts, in this order
SIZES = (("train", 8), ("test", 4))


def _rows(context: list[int], split: str, rng: random.Random) -> list[dict]:
    """One row per name; the counterfactual is a seeded name of another team and another nuisance value."""
    p, f, t = context
    out = []
    for name in NAMES:
        cf = rng.choice([n for n in NAMES if TEAM[n] != TEAM[name] and NUISANCE[n] != NUISANCE[name]])
        out.append({
            "example_id": f"{p}-{f}-{t}-{name.lower()}-{cf.lower()}",
            "input": render(PREFIXES[p], FILLERS[f], TEMPLATES[t], name), "entity": name,
            "counterfactual_inputs": [render(PREFIXES[p], FILLERS[f], TEMPLATES[t], cf)],
            "counterfactual_inputs_variables": [{"entity": cf}],
            "answer": " " + TEAM[name], "base_answer": " " + TEAM[name], "cf_answer": " " + TEAM[cf],
            "label": " " + TEAM[cf], "nuisance": NUISANCE[name], "split": split})
    return out


def tables() -> dict[str, list[dict]]:
    """{split: rows}: the held-out contexts shuffled once and dealt out in SIZES' order, each context's rows
    drawn by the same generator; `few` is the test table's first context (the conformance cases' table)."""
    held = json.loads(SPLITS.read_text(encoding="utf-8"))["heldout_contexts"]
    rng = random.Random(SEED)
    rng.shuffle(held)
    out: dict[str, list[dict]] = {}
    for split, n in SIZES:
        out[split] = [row for context in held[:n] for row in _rows(context, split, rng)]
        held = held[n:]
    out["few"] = out["test"][:len(NAMES)]
    return out


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for split, rows in tables().items():
        (OUT / f"{split}.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
