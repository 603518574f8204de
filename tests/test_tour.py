"""docs/tour.md and README's first finding cannot drift from the code: each ```sh command is run in this process
and the ```text block under it must be what it printed, line for line, but for the lines an elision marker
(`… N lines elided …`) stands for (SPEC.md §14's plot verb draws the tour's figure)."""
from __future__ import annotations

import json
import re
import shlex
from decimal import Decimal
from pathlib import Path

import pytest
import torch

from inprocess import REPO, cli

TOUR = REPO / "docs" / "tour.md"
README = REPO / "README.md"
#: the figures the tour draws, drawn by the test into its own folder instead
FIGURES = ("tracing.png", "distributed_controls.png")
#: a quoted line standing for N printed lines the page leaves out
ELISION = re.compile(r"^… (\d+) lines? elided\b")
#: a decimal number standing alone as the run prints one: a sign, digits, a point, digits, perhaps an exponent;
#: not a part of a longer token (a version 2.5.1, a name v0.1, a range 0-1.5)
DECIMAL = re.compile(r"(?<![\w.-])(-?)(\d+\.\d+)(e[-+]?\d+)?(?![\w.])")


def _blocks(text: str, language: str = "sh") -> list[tuple[str, list[str]]]:
    """(a ```sh command or ```python program, the output lines stated under it), in the page's order."""
    blocks = re.findall(r"```(sh|python|text)\n(.*?)```", text, re.S)
    steps: list[tuple[str, str, list[str]]] = []
    for kind, body in blocks:
        if kind == "text":
            steps[-1][2].extend(line for line in body.splitlines() if line)
        else:
            steps.append((kind, body.strip(), []))
    return [(body, lines) for kind, body, lines in steps if kind == language]


def _steps(text: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines stated under it), in the page's order."""
    return _blocks(text, "sh")


def _run(command: str, out: Path, scratch: str = "/tmp/tour") -> str:
    figures = [(f"docs/{name}", str(out / name)) for name in FIGURES]
    for shipped, drawn in figures:
        command = command.replace(shipped, drawn)
    here = str(out) + ("/" if scratch.endswith("/") else "")  # "out/" in README stands for the test's folder
    argv = shlex.split(command.replace(scratch, here))
    assert argv[:3] in (["python", "-m", "causalab_ref"], ["python3", "-m", "causalab_ref"]), command
    done = cli(*argv[3:])
    assert done.returncode == 0, done.stderr[-2000:]
    printed = done.stdout
    for shipped, drawn in figures:
        printed = printed.replace(drawn, shipped)
    return printed.replace(here, scratch)


def same_line(quoted: str, printed: str) -> bool:
    """The line as printed, but that a decimal number's digits may differ by one unit in the last place shown.

    A trained fit's float32 results can differ in that place from one CPU to another: on an AVX2 machine
    (2026-12-07) the DAS step's fourth ce row prints 0.111232, where the machine that wrote the page printed
    0.111231 (a value on a rounding boundary). The unit is the finer of the two numbers' last places (%g drops a
    trailing zero: 0.11123 is 0.111230). Words, integers (counts, rows, ids), the count of numbers, each number's
    sign and exponent stay exact."""
    if quoted == printed:
        return True
    if DECIMAL.sub("#", quoted) != DECIMAL.sub("#", printed):
        return False
    for q, p in zip(DECIMAL.findall(quoted), DECIMAL.findall(printed)):
        if q[0] != p[0] or q[2] != p[2]:  # the sign, the exponent
            return False
        unit = min(Decimal(1).scaleb(Decimal(d).as_tuple().exponent) for d in (q[1], p[1]))
        if abs(Decimal(q[1]) - Decimal(p[1])) > unit:
            return False
    return True


def quoted_mismatch(quoted: list[str], printed: list[str]) -> str:
    """'' when `quoted` is `printed` with each elision marker standing for exactly its count of lines, each line
    the same (`same_line`); else the first difference."""
    at = 0
    for line in quoted:
        marker = ELISION.match(line)
        if marker:
            at += int(marker.group(1))
            if at > len(printed):
                return f"{line!r} elides past the end ({len(printed)} lines printed)"
            continue
        if at >= len(printed) or not same_line(line, printed[at]):
            return f"quoted {line!r}, printed {printed[at] if at < len(printed) else 'nothing'!r} (line {at + 1})"
        at += 1
    return "" if at == len(printed) else f"{len(printed) - at} printed line(s) after the last quoted one"


def test_the_elision_check_can_fail():
    """A marker counts exact lines: one too many or too few, a changed line, a dropped tail all differ."""
    printed = ["a", "b", "c", "d"]
    assert quoted_mismatch(["a", "… 2 lines elided", "d"], printed) == ""
    assert quoted_mismatch(["a", "… 1 line elided", "d"], printed)
    assert quoted_mismatch(["a", "… 3 lines elided", "d"], printed)
    assert quoted_mismatch(["a", "b", "c"], printed)
    assert quoted_mismatch(["a", "b", "c", "d; rows [1]"], printed)


def test_a_quoted_decimal_may_differ_by_one_in_its_last_place_and_nothing_else_may():
    """A float32 result's last printed digit follows the CPU (`same_line`); a word, an integer, a second unit in
    the last place (of the finer of the two), a number more or fewer, an exponent or a sign do not, nor does a
    digit of a token that only holds a decimal (a version, a name, a range)."""
    line = "ce mean 0.113313 over 54 of 54 rows (nat); rows [0.118215, 0.111231, 1.5e-05, -0.0]"
    assert same_line(line, line.replace("0.111231", "0.111232"))
    assert same_line(line, line.replace("0.111231", "0.111230"))
    assert same_line(line, line.replace("0.111231", "0.11123"))  # 0.111230 as %g prints it
    assert same_line(line, line.replace("1.5e-05", "1.6e-05"))
    assert same_line(line, line.replace("-0.0", "-0.1"))
    for changed in (("0.111231", "0.111233"), ("0.111231", "0.1112"), ("1.5e-05", "1.5e-04"), ("1.5e-05", "1.5e-5"),
                    ("1.5e-05", "0.000015"), ("54 of 54", "53 of 54"), ("(nat)", "(bit)"), (", 1.5e-05", ""),
                    ("0.113313", "-0.113313"), ("-0.0", "0.0"), ("-0.0", "0.1")):
        assert not same_line(line, line.replace(*changed)), changed
    assert not same_line("ce 0.11123 rows", "ce 0.111239 rows")  # one unit of the finer place, not of the coarser
    for quoted, printed in (("torch 2.5.1", "torch 2.6.1"), ("at 1.2.3.4", "at 1.2.3.5"), ("v0.1 ok", "v0.2 ok"),
                            ("abc1.5x", "abc1.4x"), ("in 0-1.5", "in 0-1.4"), ("id42.7", "id42.8")):
        assert not same_line(quoted, printed), (quoted, printed)


@pytest.fixture
def one_thread():
    """One intra-op thread, as tests/fixtures/test_weekday_findings.py runs the 64-wide model: the DAS step's fit
    takes about 3.5 s of one core, ten times that with a second thread contending on a loaded machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_tour_states_what_its_commands_print(tmp_path, one_thread):
    """Every step's output (the DAS fits' too, SPEC.md X26, X31-X33) is quoted as printed, `; rows [...]` tails
    and all, each left-out run of lines marked with its count."""
    steps = _steps(TOUR.read_text(encoding="utf-8"))
    assert len(steps) == 12
    for command, lines in steps:
        printed = _run(command, tmp_path).splitlines()
        assert lines, command
        assert not quoted_mismatch(lines, printed), (command, quoted_mismatch(lines, printed), printed)


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def test_readmes_first_finding_is_what_the_document_and_the_run_say(tmp_path, one_thread):
    """README's first command prints what README quotes, its document is documents/weekday_patching.json without
    its header, and the table row it shows is the first row of the iia.json that command writes (SPEC.md X21)."""
    section = _section(README.read_text(encoding="utf-8"), "A first finding")
    shown = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", section, re.S)]
    document, row = shown
    raw = json.loads((REPO / "documents" / "weekday_patching.json").read_text(encoding="utf-8"))
    assert document == {k: v for k, v in raw.items() if k != "header"}
    [(command, lines)] = _steps(section)
    printed = _run(command, tmp_path / "out", scratch="out/").splitlines()
    assert not quoted_mismatch(lines, printed), (quoted_mismatch(lines, printed), printed)
    written = json.loads((tmp_path / "out" / "weekday_patching" / "iia.json").read_text(encoding="utf-8"))
    assert row == written[0]


def test_the_tours_python_prints_what_it_states(tmp_path, one_thread, monkeypatch):
    """SPEC.md:2675 [PY2] SPEC.md:2700 [PY8] the tour's Python section, run in this process from the repository root:
    one model loaded for every document, the tidy table's coordinate columns, the figure and the saved folder;
    each stated line is in what it printed, and the lines agree with the CLI steps above (X24's grid)."""
    import contextlib
    import io

    (program, lines), = _blocks(TOUR.read_text(encoding="utf-8"), "python")
    out = io.StringIO()
    monkeypatch.chdir(REPO)
    with contextlib.redirect_stdout(out):
        exec(compile(program.replace("/tmp/tour", str(tmp_path)), "tour.md", "exec"), {"__name__": "tour"})
    printed = out.getvalue().replace(str(tmp_path), "/tmp/tour")
    missing = [line for line in lines if line not in printed]
    assert not missing, (missing, printed)
    assert (tmp_path / "tracing_api.png").stat().st_size > 0
    assert (tmp_path / "tracing_api" / "run.json").is_file()

