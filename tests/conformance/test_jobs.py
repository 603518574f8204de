"""conform --jobs: cases of an --impl run side by side, reported as one at a time would (SPEC.md C33).

The implementation is a python script in tmp_path that reads the case's document for what to do (sleep, exit
status, wait for another case's call to start); the cases are synthetic validate cases on the GPT-2 fixture,
as in test_runner.py.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from causalab_ref import cli
from causalab_ref.conformance import conform
from causalab_ref.fixtures import builder

KEY = "fixture:tiny-gpt2"
# the document says what the call does: sleep S seconds, touch a file, wait for a file, exit with a status
FAKE = '''import json, pathlib, sys, time
doc = json.loads(pathlib.Path(sys.argv[sys.argv.index("validate") + 1]).read_text())
if doc.get("touch"):
    pathlib.Path(doc["touch"]).write_text("started")
if doc.get("wait_for"):
    while not pathlib.Path(doc["wait_for"]).exists():
        time.sleep(0.02)
time.sleep(doc.get("sleep", 0))
if doc.get("status") == 2:
    print("validation: steps.0: a refusal", file=sys.stderr)
sys.exit(doc.get("status", 0))
'''


def _corpus(folder: Path, documents: dict[str, dict], expect: dict[str, dict]) -> Path:
    folder.mkdir()
    for name, document in documents.items():
        case = {"name": name, "rules": ["C33"], "fixture": {"key": KEY, "recipe": builder.recipe_digest(KEY)},
                "verb": "validate", "document": document, "confirmed": "C33",
                "expect": expect.get(name, {"status": 0})}
        (folder / f"{name}.json").write_text(json.dumps(case), encoding="utf-8")
    return folder


def _conform(tmp_path: Path, corpus: Path, *flags: str, capsys) -> tuple[int, str, str]:
    script = tmp_path / "fake.py"
    script.write_text(FAKE, encoding="utf-8")
    argv = ["conform", "--impl", shlex.join([sys.executable, str(script)]), "--cases", str(corpus),
            "--fixtures", str(tmp_path / "fx"), "--timeout", "30", *flags]
    try:
        status = cli.main(argv)
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _without_seconds(report: str) -> str:
    """The report with each case's and the run's own seconds taken out (the only part that may differ)."""
    return re.sub(r"\(\d+s\)$", "(_s)", re.sub(r"  \d+\.\d+s$", "  _s", report, flags=re.M), flags=re.M)


def test_the_report_of_jobs_4_is_the_report_of_jobs_1_whatever_order_the_cases_finish_in(tmp_path, capsys):
    """SPEC.md:970 [C33] four cases that finish in the reverse of their order (the first sleeps longest), one of
    them failing and one not applicable: --jobs 4 prints the same lines, verdicts and diffs in the corpus's order
    as --jobs 1, and exits with the same status."""
    documents = {"a_slow": {"sleep": 0.3}, "b_fails": {"sleep": 0.2, "status": 2},
                 "c_not_applicable": {"sleep": 0.1, "status": 3}, "d_fast": {}}
    corpus = _corpus(tmp_path / "corpus", documents, {})
    one = _conform(tmp_path, corpus, "--jobs", "1", capsys=capsys)
    four = _conform(tmp_path, corpus, "--jobs", "4", capsys=capsys)
    assert one[0] == four[0] == 1
    assert _without_seconds(one[1]) == _without_seconds(four[1])
    names = [line.split()[1] for line in one[1].splitlines() if line.startswith(("PASS", "FAIL", "N/A"))]
    assert names == ["a_slow", "b_fails", "c_not_applicable", "d_fast"]
    assert "conform: 2 passed, 1 failed, 1 not applicable" in four[1]


def test_with_jobs_2_two_cases_run_at_once(tmp_path, capsys):
    """SPEC.md:970 [C33] with --jobs 2 the first case's call waits until the second case's call has started,
    and both pass: they ran side by side (one at a time, the first would wait until --timeout stops it)."""
    started = tmp_path / "b_started"
    documents = {"a_waits": {"wait_for": str(started)}, "b_starts": {"touch": str(started)}}
    status, out, _err = _conform(tmp_path, _corpus(tmp_path / "corpus", documents, {}), "--jobs", "2",
                                 capsys=capsys)
    assert status == 0 and "conform: 2 passed, 0 failed, 0 not applicable" in out


def test_fail_fast_with_jobs_stops_at_the_same_case_as_one_at_a_time(tmp_path, capsys):
    """SPEC.md:970 [C33] --fail-fast under --jobs 3 reports the cases up to the first failure in order and no
    case after it, as --jobs 1 does."""
    documents = {"a": {"sleep": 0.2}, "b_fails": {"status": 1}, "c": {}, "d": {}, "e": {}}
    corpus = _corpus(tmp_path / "corpus", documents, {})
    one = _conform(tmp_path, corpus, "--jobs", "1", "--fail-fast", capsys=capsys)
    three = _conform(tmp_path, corpus, "--jobs", "3", "--fail-fast", capsys=capsys)
    assert one[0] == three[0] == 1
    assert _without_seconds(one[1]) == _without_seconds(three[1])
    assert "FAIL b_fails" in three[1] and "PASS c" not in three[1] and "conform: 1 passed, 1 failed" in three[1]


@pytest.mark.fast
@pytest.mark.parametrize("bad", ["0", "-1", "x", "1e9", "1.5", "", "257", "9" * 5000, "\u0661"],
                         ids=["0", "-1", "x", "1e9", "1.5", "empty", "257", "5000_digits", "arabic_one"])
def test_a_jobs_that_is_not_a_whole_number_from_1_to_256_is_a_usage_error(bad, capsys):
    """SPEC.md:970 [C33] --jobs 0, -1, text, 1e9, a fraction, past 256: one line on stderr naming --jobs, exit
    2, nothing run."""
    try:
        status = cli.main(["conform", f"--jobs={bad}", "--only", "refuse_unknown_key"])
    except SystemExit as exit_:
        status = exit_.code
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and "--jobs" in captured.err and "from 1 to 256" in captured.err


@pytest.mark.fast
def test_options_with_a_bad_jobs_are_refused_as_a_usage_error():
    """SPEC.md:970 [C33] the same bounds hold for conform() called from Python."""
    for bad in (0, -3, 10 ** 9, 2.0, True):
        with pytest.raises(conform.UsageError, match="--jobs"):
            conform.conform("true", conform.Options(jobs=bad))


@pytest.mark.fast
def test_the_default_jobs_is_the_number_of_cores_this_process_may_use():
    """SPEC.md:970 [C33] Options() and a conform without --jobs run as many cases at once as there are cores."""
    assert conform.Options().jobs == conform.cores() >= 1
    args = cli.build_parser().parse_args(["conform"])
    assert args.jobs is None  # so cmd_conform leaves Options' default


# an implementation that never answers: it writes its pid and its child's (which sleeps in its group) and waits
HANGING = '''import os, pathlib, subprocess, sys, time
child = subprocess.Popen(["sleep", "1000"])
doc = sys.argv[sys.argv.index("validate") + 1]
name = pathlib.Path(doc).parent.name
pathlib.Path(os.environ["HANG_PIDS"], name).write_text(f"{os.getpid()} {child.pid}")
while True:
    time.sleep(1)
'''


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("jobs, signum", [("1", signal.SIGINT), ("2", signal.SIGINT), ("2", signal.SIGTERM)],
                         ids=["jobs1-SIGINT", "jobs2-SIGINT", "jobs2-SIGTERM"])
def test_an_interrupt_stops_every_implementation_conform_started_at_once(tmp_path, jobs, signum):
    """SPEC.md:981 [C39] conform runs a hanging --impl (which starts a child in its group) with --timeout 600;
    an interrupt once each job's implementation has started ends conform within seconds with 130 and the
    interrupted line, and no implementation or child of one is left alive (before: --jobs 2 waited for
    --timeout with both alive; --jobs 1 exited leaving its implementation running)."""
    script, pids = tmp_path / "hang.py", tmp_path / "pids"
    script.write_text(HANGING, encoding="utf-8")
    pids.mkdir()
    corpus = _corpus(tmp_path / "corpus", {"a": {}, "b": {}, "c": {}}, {})
    argv = [sys.executable, "-m", "causalab_ref", "conform", "--impl", shlex.join([sys.executable, str(script)]),
            "--cases", str(corpus), "--fixtures", str(tmp_path / "fx"), "--timeout", "600", "--jobs", jobs]
    env = {**os.environ, "HANG_PIDS": str(pids), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = time.monotonic()
    try:
        while len(list(pids.iterdir())) < int(jobs) and time.monotonic() - started < 240:
            time.sleep(0.05)
        time.sleep(0.3)  # the files are written: every job's implementation is running
        seen = [int(p) for f in pids.iterdir() for p in f.read_text().split()]
        assert len(seen) == 2 * int(jobs), seen
        proc.send_signal(signum)
        try:
            _out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            err = "conform was still running 30 s after the interrupt"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    deadline = time.monotonic() + 5  # a grandchild is reaped by init, which may take a moment
    while any(map(_alive, seen)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in seen if _alive(pid)]
    for pid in left:  # what a failing conform left is not left to the machine
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted; nothing was written", err
    assert left == []
    assert len(list(pids.iterdir())) == int(jobs)  # no case started after the interrupt


@pytest.mark.fast
@pytest.mark.parametrize("only", [None, "refuse_unknown", "weekday,unknown_key", "no_such_case"])
def test_list_prints_the_cases_only_and_cases_select_and_runs_nothing(only, capsys, tmp_path):
    """SPEC.md:990 [C40] `conform --list` prints the selected cases' names and verbs in the corpus's order and
    their count, exits 0, and starts no --impl (the one given would write a file if it ran); the selection is
    recomputed here from the corpus folder's file names."""
    marker = tmp_path / "ran"
    impl = shlex.join([sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    argv = ["conform", "--list", "--impl", impl] + (["--only", only] if only else [])
    status = cli.main(argv)
    out = capsys.readouterr().out.splitlines()
    files = sorted(f for f in conform.CASES.glob("*.json") if not f.name.endswith(".schema.json"))
    wanted = [f for f in files if not only or any(w in f.stem for w in only.split(","))]
    assert status == 0 and not marker.exists()
    assert [line.split()[0] for line in out[:-1]] == [f.stem for f in wanted]
    assert [line.split()[1] for line in out[:-1]] == [json.loads(f.read_text())["verb"] for f in wanted]
    assert out[-1] == f"conform: {len(wanted)} case(s) selected"


@pytest.mark.fast
@pytest.mark.parametrize("verb", [["--list"], ["--grounds"], ["--impl", sys.executable]])
@pytest.mark.parametrize("name", ["a" * 300, "loop"])
def test_a_cases_name_the_system_cannot_look_up_is_refused_in_one_line(tmp_path, capsys, verb, name):
    """SPEC.md:931 [C20] a --cases past the file system's name length (300 bytes) or a link to itself names no
    folder: one line, exit 2, for --list, --grounds and a run (bench/fuzz_surfaces.py's flags surface, cases 7120
    and 7667 at e5ab112: `internal error (OSError): [Errno 36] File name too long`)."""
    folder = tmp_path / name
    if name == "loop":
        folder.symlink_to(folder)
    try:
        status = cli.main(["conform", *verb, "--cases", str(folder)])
    except SystemExit as exit_:
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "is not a folder" in err, err
    assert "internal error" not in err


@pytest.mark.fast
def test_list_of_a_cases_that_is_not_a_folder_is_a_usage_error(tmp_path, capsys):
    """SPEC.md:990 [C40] --list with a --cases that is not a folder: one usage line, exit 2."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["conform", "--list", "--cases", str(tmp_path / "none")])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and captured.out == "" and captured.err.startswith("usage: conform: --cases")
