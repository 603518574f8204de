"""What a metric table's rows say (SPEC.md §4, R7, R22)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

from causalab_ref import cli

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"


def test_a_qualified_saves_table_names_the_metric_by_its_declared_name(tmp_path):
    """SPEC.md:408 [R22] a step of two interventions saving `patching/logit_diff` and `plain/logit_diff` writes
    rows whose `metric` is `logit_diff` in both files: the qualifier picks the table, not the name."""
    raw = json.loads((ROOT / "documents" / "patching.json").read_text(encoding="utf-8"))
    plain = copy.deepcopy(raw["interventions"]["patching"])
    plain["models"]["patched"]["writes"] = []
    raw["interventions"]["plain"] = plain
    raw["steps"]["score"]["interventions"] = ["patching", "plain"]
    raw["steps"]["score"]["saves"] = [{"value": "patching/logit_diff", "file_path": "patched.json"},
                                      {"value": "plain/logit_diff", "file_path": "plain.json"}]
    doc = tmp_path / "two.json"
    doc.write_text(json.dumps(raw), encoding="utf-8")
    assert cli.main(["run", str(doc), "--data-root", str(DATA), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    for name in ("patched.json", "plain.json"):
        rows = json.loads((tmp_path / "out" / name).read_text(encoding="utf-8"))
        assert len(rows) == 4 and {r["metric"] for r in rows} == {"logit_diff"}
