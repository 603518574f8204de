"""The corpus's run cases against a second implementation that shares no code with causalab_ref (SPEC C30)."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from causalab_ref import cli

CORPUS = Path(__file__).resolve().parent
SCRIPT = CORPUS / "independent.py"


def _run_cases() -> list[Path]:
    return [p for p in sorted(CORPUS.glob("*.json"))
            if not p.name.endswith(".schema.json") and json.loads(p.read_text(encoding="utf-8")).get("verb") == "run"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    dest = tmp_path_factory.mktemp("independent-fixtures")
    assert cli.main(["fixtures", "export", str(dest)]) == 0
    return dest


def test_the_independent_implementation_imports_nothing_of_causalab_ref():
    """SPEC.md:0 [C30] the second implementation is independent: no import of causalab_ref at any depth."""
    imported = set()
    for node in ast.walk(ast.parse(SCRIPT.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0] if not node.level else "<relative>")
    assert "causalab_ref" not in imported and "<relative>" not in imported
    assert imported <= set(sys.stdlib_module_names) | {"torch", "transformers", "safetensors"}


def test_every_run_case_is_reproduced_by_the_independent_implementation(folders):
    """SPEC.md:0 [C30] every `run` case passes under the independent script, none skipped."""
    cases = _run_cases()
    assert len(cases) >= 30
    proc = subprocess.run([sys.executable, str(SCRIPT), "--fixtures", str(folders), *map(str, cases)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == f"{len(cases)} pass, 0 fail, 0 skip"
