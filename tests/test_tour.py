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


def _blocks(language: str = "sh") -> list[tuple[str, list[str]]]:
    """(a ```sh command or ```python program, the output lines stated under it), in the tour's order."""
    blocks = re.findall(r"```(sh|python|text)\n(.*?)```", TOUR.read_text(encoding="utf-8"), re.S)
    steps: list[tuple[str, str, list[str]]] = []
    for kind, body in blocks:
        if kind == "text":
            steps[-1][2].extend(line for line in body.splitlines() if line)
        else:
            steps.append((kind, body.strip(), []))
    return [(body, lines) for kind, body, lines in steps if kind == language]


def _steps() -> list[tuple[str, list[str]]]:
    """(command, the output lines stated under it), in the tour's order."""
    return _blocks("sh")


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


def test_the_tours_python_prints_what_it_states(tmp_path, one_thread, monkeypatch):
    """SPEC.md:2348 [PY2] SPEC.md:2373 [PY8] the tour's Python section, run in this process from the repository root:
    one model loaded for every document, the tidy table's coordinate columns, the figure and the saved folder;
    each stated line is in what it printed, and the lines agree with the CLI steps above (X24's grid)."""
    import contextlib
    import io

    (program, lines), = _blocks("python")
    out = io.StringIO()
    monkeypatch.chdir(REPO)
    with contextlib.redirect_stdout(out):
        exec(compile(program.replace("/tmp/tour", str(tmp_path)), "tour.md", "exec"), {"__name__": "tour"})
    printed = out.getvalue().replace(str(tmp_path), "/tmp/tour")
    missing = [line for line in lines if line not in printed]
    assert not missing, (missing, printed)
    assert (tmp_path / "tracing_api.png").stat().st_size > 0
    assert (tmp_path / "tracing_api" / "run.json").is_file()

