"""docs/tour.md cannot drift from the code: each ```sh command is run in this process and every ```text line
under it must be in what it printed (SPEC.md §14's plot verb draws the tour's figure)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch

from inprocess import REPO, cli

TOUR = REPO / "docs" / "tour.md"
#: the figures the tour draws, drawn by the test into its own folder instead
FIGURES = ("tracing.png", "distributed_controls.png")


def _steps() -> list[tuple[str, list[str]]]:
    """(command, the output lines stated under it), in the tour's order."""
    blocks = re.findall(r"```(sh|text)\n(.*?)```", TOUR.read_text(encoding="utf-8"), re.S)
    steps: list[tuple[str, list[str]]] = []
    for kind, body in blocks:
        if kind == "sh":
            steps.append((body.strip(), []))
        else:
            steps[-1][1].extend(line for line in body.splitlines() if line)
    return steps


def _run(command: str, out: Path) -> str:
    figures = [(f"docs/{name}", str(out / name)) for name in FIGURES]
    for shipped, scratch in figures:
        command = command.replace(shipped, scratch)
    argv = shlex.split(command.replace("/tmp/tour", str(out)))
    assert argv[:3] == ["python", "-m", "causalab_ref"], command
    done = cli(*argv[3:])
    assert done.returncode == 0, done.stderr[-2000:]
    printed = done.stdout
    for shipped, scratch in figures:
        printed = printed.replace(scratch, shipped)
    return printed.replace(str(out), "/tmp/tour")


@pytest.fixture
def one_thread():
    """One intra-op thread, as tests/fixtures/test_weekday_findings.py runs the 64-wide model: the DAS step's fit
    takes about 3.5 s of one core, ten times that with a second thread contending on a loaded machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_tour_states_what_its_commands_print(tmp_path, one_thread):
    """Every stated line of every step (the DAS fits' too, SPEC.md X26, X31-X33) is in its command's output."""
    steps = _steps()
    assert len(steps) == 12
    for command, lines in steps:
        printed = _run(command, tmp_path)
        missing = [line for line in lines if line not in printed]
        assert not missing, (command, missing, printed[-2000:])
