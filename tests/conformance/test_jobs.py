"""conform --jobs: cases of an --impl run side by side, reported as one at a time would (SPEC.md C33).

The implementation is a python script in tmp_path that reads the case's document for what to do (sleep, exit
status, wait for another case's call to start); the cases are synthetic validate cases on the GPT-2 fixture,
as in test_runner.py.
"""
from __future__ import annotations

import json
import re
import shlex
import sys
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
    """SPEC.md:941 [C33] four cases that finish in the reverse of their order (the first sleeps longest), one of
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
    """SPEC.md:941 [C33] with --jobs 2 the first case's call waits until the second case's call has started,
    and both pass: they ran side by side (one at a time, the first would wait until --timeout stops it)."""
    started = tmp_path / "b_started"
    documents = {"a_waits": {"wait_for": str(started)}, "b_starts": {"touch": str(started)}}
    status, out, _err = _conform(tmp_path, _corpus(tmp_path / "corpus", documents, {}), "--jobs", "2",
                                 capsys=capsys)
    assert status == 0 and "conform: 2 passed, 0 failed, 0 not applicable" in out


def test_fail_fast_with_jobs_stops_at_the_same_case_as_one_at_a_time(tmp_path, capsys):
    """SPEC.md:941 [C33] --fail-fast under --jobs 3 reports the cases up to the first failure in order and no
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
    """SPEC.md:941 [C33] --jobs 0, -1, text, 1e9, a fraction, past 256: one line on stderr naming --jobs, exit
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
    """SPEC.md:941 [C33] the same bounds hold for conform() called from Python."""
    for bad in (0, -3, 10 ** 9, 2.0, True):
        with pytest.raises(conform.UsageError, match="--jobs"):
            conform.conform("true", conform.Options(jobs=bad))


@pytest.mark.fast
def test_the_default_jobs_is_the_number_of_cores_this_process_may_use():
    """SPEC.md:941 [C33] Options() and a conform without --jobs run as many cases at once as there are cores."""
    assert conform.Options().jobs == conform.cores() >= 1
    args = cli.build_parser().parse_args(["conform"])
    assert args.jobs is None  # so cmd_conform leaves Options' default
