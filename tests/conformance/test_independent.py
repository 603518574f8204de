"""The corpus's run cases against a second implementation that shares no code with causalab_ref (SPEC C30)."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from causalab_ref import cli

SCRIPT = Path(__file__).resolve().parent / "independent.py"
ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parents[2] / "causalab_ref" / "conformance" / "corpus"


def _run_cases() -> list[Path]:
    return [p for p in sorted(CORPUS.glob("*.json"))
            if not p.name.endswith(".schema.json") and json.loads(p.read_text(encoding="utf-8")).get("verb") == "run"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    dest = tmp_path_factory.mktemp("independent-fixtures")
    assert cli.main(["fixtures", "export", str(dest)]) == 0
    return dest


def test_the_independent_implementation_imports_nothing_of_causalab_ref():
    """SPEC.md:965 [C30] the second implementation is independent: no import of causalab_ref at any depth."""
    imported = set()
    for node in ast.walk(ast.parse(SCRIPT.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0] if not node.level else "<relative>")
    assert "causalab_ref" not in imported and "<relative>" not in imported
    assert imported <= set(sys.stdlib_module_names) | {"torch", "transformers", "safetensors"}


def test_every_run_case_is_reproduced_by_the_independent_implementation(folders):
    """SPEC.md:965 [C30] every `run` case passes under the independent script, none skipped."""
    cases = _run_cases()
    assert len(cases) >= 30
    proc = subprocess.run([sys.executable, str(SCRIPT), "--fixtures", str(folders), *map(str, cases)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == f"{len(cases)} pass, 0 fail, 0 skip"


def test_every_case_names_its_grounds_and_every_run_case_is_independent(capsys):
    """SPEC.md:950 [C32] each case's `grounds` is one of the five kinds with a reason, every `run` case's is
    `independent` (so none is merely recorded), and `conform --grounds` prints the counts the files hold."""
    cases = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(CORPUS.glob("*.json"))
             if not p.name.endswith(".schema.json")]
    kinds = [c["grounds"]["kind"] for c in cases]
    assert set(kinds) <= {"independent", "identity", "seed", "finding", "recorded"}
    assert all(c["grounds"]["by"].strip() for c in cases)
    assert {c["grounds"]["kind"] for c in cases if c["verb"] == "run"} <= {"independent", "finding"}
    assert all("independent.py" in c["grounds"]["by"] for c in cases if c["verb"] == "run")
    assert cli.main(["conform", "--grounds"]) == 0
    line = capsys.readouterr().out.strip()
    assert line == "grounds: " + ", ".join(f"{k} {kinds.count(k)}" for k in
                                           ("independent", "identity", "seed", "finding", "recorded"))
    guide = " ".join((ROOT / "docs" / "conformance.md").read_text(encoding="utf-8").split())
    assert (f"today independent {kinds.count('independent')}, finding {kinds.count('finding')}, seed "
            f"{kinds.count('seed')}, recorded {kinds.count('recorded')}, identity {kinds.count('identity')}"
            ) in guide  # docs/conformance.md's Grounds paragraph
