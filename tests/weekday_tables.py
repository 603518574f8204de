"""The weekday-llama fixture's data tables: documents/data/weekday_trained/{train,test,few}.json (SPEC.md §5 X20).

Standalone (the standard library and tests/weekday_trainer.py's prompt grammar): the rows are drawn, with a
fixed seed, from the held-out contexts the trainer wrote to splits.json beside the committed weights, so no
row's (prefix, filler, template) combination was seen in training. train.json and test.json take disjoint
contexts. Each context gives one row per weekday X it allows; the counterfactual is the same context with
another weekday X' (and, in a distractor context, X' is not the distractor day either), so base and
counterfactual tokenize to the same length with only the entity's token different. `python3
tests/weekday_tables.py` rewrites both files in place.
"""
from __future__ import annotations

import json
import pathlib
import random

from weekday_trainer import DAYS, DISTRACTORS, FILLERS, NEXT, PREFIXES, TEMPLATES, render

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPLITS = ROOT / "causalab_ref" / "fixtures" / "fixture_data" / "weekday-llama" / "splits.json"
OUT = ROOT / "documents" / "data" / "weekday_trained"
SEED = 2026
#: (split, plain contexts, distractor contexts) drawn from the held-out contexts, in this order
SIZES = (("train", 30, 12), ("test", 6, 2))


def _text(context: list[int], day: str) -> str:
    p, f, t, d, y = context
    return render(PREFIXES[p], FILLERS[f], TEMPLATES[t], day, DISTRACTORS[d], DAYS[y] if y >= 0 else "")


def _shared(context: list[int]) -> str:
    """A word every row of the context holds once, after the entity, in base and counterfactual alike."""
    return "Tomorrow" if "Tomorrow" in TEMPLATES[context[2]] else "tomorrow"


def _rows(context: list[int], split: str, rng: random.Random) -> list[dict]:
    """One row per allowed weekday; the counterfactual weekday is a seeded other allowed day."""
    y = context[4]
    allowed = [d for i, d in enumerate(DAYS) if i != y]
    rows = []
    for day in allowed:
        cf = rng.choice([d for d in allowed if d != day])
        rows.append({
            "example_id": f"{'-'.join(map(str, context))}-{day.lower()}-{cf.lower()}",
            "input": _text(context, day), "entity": day,
            "counterfactual_inputs": [_text(context, cf)], "counterfactual_inputs_variables": [{"entity": cf}],
            "answer": " " + NEXT[day], "base_answer": " " + NEXT[day], "cf_answer": " " + NEXT[cf],
            "label": " " + NEXT[cf], "shared": _shared(context), "split": split})
    return rows


def dealt(rng: random.Random | None = None) -> dict[str, list[list[int]]]:
    """{split: contexts}, the held-out contexts shuffled once (by `rng`, default seeded afresh) and dealt out
    in SIZES' order."""
    held = json.loads(SPLITS.read_text(encoding="utf-8"))["heldout_contexts"]
    rng = random.Random(SEED) if rng is None else rng
    plain = [c for c in held if c[3] == 0]
    distractor = [c for c in held if c[3] != 0]
    rng.shuffle(plain)
    rng.shuffle(distractor)
    out = {}
    for split, n_plain, n_distractor in SIZES:
        out[split] = plain[:n_plain] + distractor[:n_distractor]
        plain, distractor = plain[n_plain:], distractor[n_distractor:]
    return out


def tables() -> dict[str, list[dict]]:
    """{split: rows}: each dealt context's rows, the counterfactual days drawn by the generator that dealt."""
    rng = random.Random(SEED)
    out = {split: [row for context in contexts for row in _rows(context, split, rng)]
           for split, contexts in dealt(rng).items()}
    out["few"] = out["test"][:7] + out["test"][-6:]  # the conformance cases' table: one plain, one distractor context
    return out


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for split, rows in tables().items():
        (OUT / f"{split}.json").write_text(json.dumps(rows, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
        print(f"{OUT / split}.json: {len(rows)} rows")


if __name__ == "__main__":
    main()
