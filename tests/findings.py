"""What the findings modules of the trained fixtures share (tests/fixtures/test_*_findings.py): a shipped
document read, run through causalab_ref on the shipped tables, its table's mean; one torch thread for a module;
the fixture loaded once per engine.

    engine = findings.engines(MODEL)            # a module fixture: the model on nnterp, then on hooks
    out = findings.run_document(findings.shipped("weekday_das"), engine, tmp_path / "out")
    findings.mean(out / "iia.json")
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from causalab_ref.engines import loading
from causalab_ref.runs import compile as compiler
from causalab_ref.runs import run

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "documents" / "data"


def shipped(name: str) -> dict:
    """documents/<name>.json, parsed."""
    loaded: dict = json.loads((ROOT / "documents" / f"{name}.json").read_text(encoding="utf-8"))
    return loaded


def run_document(doc: dict, engine, out: Path) -> Path:
    """The document compiled against `engine` on the shipped tables and run into `out`."""
    run.execute(compiler.compile_document(doc, engine, DATA), engine, out, progress=False)
    return out


def mean(path: Path) -> float:
    """The mean value of a metric table."""
    rows = json.loads(path.read_text(encoding="utf-8"))
    return sum(r["value"] for r in rows) / len(rows)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The trained fixtures are 32 and 64 wide: torch's second intra-op thread only contends with the other jobs
    of a loaded 2-core machine (weekday_das.json's fit measured 35.6 s of CPU with two threads, 3.3 s with one;
    IIA equal)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def engines(model):
    """A module fixture: `model` loaded on each engine, nnterp then hooks."""
    @pytest.fixture(scope="module", params=["nnterp", "hooks"])
    def engine(request):
        return loading.load(model, kind=request.param)
    return engine
