"""conform's own inputs and bounds: its exit status, a blank --impl, broken case files, an implementation
that hangs, floods or writes junk under --out (SPEC.md C18-C20).

The implementations here are tiny: an entry point called in-process (`main=lambda argv: status`) or a
python script in tmp_path run as `--impl`. The cases are synthetic validate or run cases on the GPT-2
fixture (its recipe digest, so the runner checks them), written into a corpus folder in tmp_path.
"""
from __future__ import annotations

import contextlib
import io
import json
import shlex
import sys
import time
from pathlib import Path

import pytest

from causalab_ref import cli
from causalab_ref.conformance import conform
from causalab_ref.fixtures import builder

KEY = "fixture:tiny-gpt2"


def _case(name: str, verb: str = "validate", expect=None) -> dict:
    return {"name": name, "rules": ["C20"], "fixture": {"key": KEY, "recipe": builder.recipe_digest(KEY)},
            "verb": verb, "document": {}, "confirmed": "C20", "expect": expect or {"status": 0}}


def _corpus(folder: Path, *cases) -> Path:
    folder.mkdir()
    for case in cases:
        text = case if isinstance(case, tuple) else (f"{case['name']}.json", json.dumps(case))
        (folder / text[0]).write_text(text[1], encoding="utf-8")
    return folder


def _script(folder: Path, name: str, body: str) -> str:
    file = folder / name
    file.write_text("import sys, time, pathlib\n" + body, encoding="utf-8")
    return shlex.join([sys.executable, str(file)])


def _conform_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """`conform ...` through the CLI: (status, stdout, stderr); a failed run exits 1 by SystemExit."""
    try:
        status = cli.main(["conform"] + argv)
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# ---------------------------------------------------------------- exit status (C20)


@pytest.mark.parametrize("impl", ["", "   "], ids=["empty", "blank"])
def test_a_blank_impl_is_a_usage_error_and_runs_nothing(impl, capsys):
    """SPEC.md:931 [C20] an empty or blank --impl (an unset variable) is a usage error in one line, exit 2;
    causalab_ref is not checked in its place and no verb is run as the program."""
    status, out, err = _conform_cli(["--impl", impl, "--only", "refuse_unknown_key"], capsys)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("usage: conform: --impl") and "blank" in err


def test_a_missing_cases_folder_is_a_usage_error(tmp_path, capsys):
    """SPEC.md:931 [C20] --cases of a folder that is not there exits 2 with one line naming it."""
    status, out, err = _conform_cli(["--cases", str(tmp_path / "nowhere")], capsys)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and "nowhere" in err and "is not a folder" in err


def test_only_matching_nothing_exits_1_saying_so(capsys):
    """SPEC.md:931 [C20] --only that matches no case is a run that checked nothing: exit 1 and a line why."""
    status, out, err = _conform_cli(["--only", "no_case_is_named_like_this"], capsys)
    assert status == 1
    assert "conform: 0 passed, 0 failed, 0 not applicable" in out
    assert "no case was checked: --only 'no_case_is_named_like_this' matches no case" in err


def test_an_implementation_answering_3_to_every_case_is_not_a_pass(tmp_path):
    """SPEC.md:931 [C20] every case not applicable is not a pass: ok is false and `why` says so."""
    corpus = _corpus(tmp_path / "corpus", _case("a"), _case("b"))
    result = conform.conform(options=conform.Options(cases_dir=str(corpus)), main=lambda argv: 3)
    assert (result["passed"], result["not_applicable"], result["failed"], result["ok"]) == (0, 2, [], False)
    assert "answered 3 (not applicable) to all 2 case(s)" in result["why"]


def test_an_implementation_answering_3_to_every_case_exits_1(tmp_path, capsys):
    """SPEC.md:931 [C20] the same through the CLI and a real subprocess --impl: exit 1, the line on stderr."""
    corpus = _corpus(tmp_path / "corpus", _case("a"))
    impl = _script(tmp_path, "na.py", "sys.exit(3)\n")
    status, out, err = _conform_cli(["--impl", impl, "--cases", str(corpus), "--fixtures", str(tmp_path / "fx")],
                                    capsys)
    assert status == 1 and "N/A  a" in out and "answered 3 (not applicable) to all 1 case(s)" in err


def test_a_run_that_passed_a_case_and_failed_none_is_ok(tmp_path):
    """SPEC.md:931 [C20] the one green run: some case passed, none failed (a not-applicable one aside)."""
    corpus = _corpus(tmp_path / "corpus", _case("a"), _case("b"))
    answers = iter([0, 3])
    result = conform.conform(options=conform.Options(cases_dir=str(corpus)), main=lambda argv: next(answers))
    assert (result["passed"], result["not_applicable"], result["ok"], result["why"]) == (1, 1, True, None)


# ---------------------------------------------------------------- each call bounded (C18)


def test_a_hung_implementation_fails_its_case_at_the_timeout_and_the_run_goes_on(tmp_path, capsys):
    """SPEC.md:917 [C18] a call past --timeout is stopped and its case fails in one line saying so; the next
    case runs (the script hangs on its first call only, so the cases run one at a time: --jobs 1)."""
    corpus = _corpus(tmp_path / "corpus", _case("a_hangs"), _case("b_answers"))
    marker = tmp_path / "called"
    impl = _script(tmp_path, "hang.py", f"m = pathlib.Path({str(marker)!r})\n"
                                        "if not m.exists():\n    m.write_text('1')\n    time.sleep(3600)\n")
    started = time.monotonic()
    status, out, _err = _conform_cli(["--impl", impl, "--timeout", "2", "--jobs", "1", "--cases", str(corpus),
                                      "--fixtures", str(tmp_path / "fx")], capsys)
    assert time.monotonic() - started < 60
    assert status == 1 and "conform: 1 passed, 1 failed, 0 not applicable" in out
    fail = out[out.index("FAIL a_hangs"):].splitlines()[1]
    assert "did not finish `validate` within --timeout 2 s; it was stopped" in fail
    assert "PASS b_answers" in out


def test_a_flooding_implementation_fails_its_case_at_the_cap(tmp_path):
    """SPEC.md:917 [C18] stdout read back past the cap stops the implementation; the case fails saying which
    stream and how much (here a 1 MiB cap against a script that prints forever)."""
    flood = _script(tmp_path, "flood.py", "while True:\n    sys.stdout.write('x' * 65536)\n")
    impl = conform.Subprocess(shlex.split(flood), timeout=60, cap=2 ** 20)
    started = time.monotonic()
    verdict, diffs, _got = conform.check(dict(_case("floods"), _file=str(tmp_path / "floods.json")), impl)
    assert time.monotonic() - started < 30
    assert verdict == "fail" and len(diffs) == 1
    assert "wrote more than 1 MiB to stdout on `validate`; it was stopped" in diffs[0]


def test_the_timeout_flag_takes_a_positive_number_of_seconds(capsys):
    """SPEC.md:917 [C18] --timeout 0 (or text) is a usage error in one line."""
    for bad in ("0", "soon", "-5"):
        status, out, err = _conform_cli(["--timeout", bad], capsys)
        assert status == 2 and out == "" and err.count("\n") == 1 and "--timeout" in err, bad


# ---------------------------------------------------------------- a case that cannot be read or answered (C19)


def test_a_truncated_or_verbless_case_file_fails_alone(tmp_path):
    """SPEC.md:922 [C19] a case file that is not JSON, or has no `verb`, fails in one line naming the file;
    the other cases run."""
    good = _case("b_good")
    verbless = {k: v for k, v in _case("c_verbless").items() if k != "verb"}
    corpus = _corpus(tmp_path / "corpus", ("a_truncated.json", json.dumps(_case("a_truncated"))[:40]), good,
                     verbless)
    out = io.StringIO()
    result = conform.conform(options=conform.Options(cases_dir=str(corpus)), main=lambda argv: 0, stream=out)
    assert result["passed"] == 1 and result["failed"] == ["a_truncated", "c_verbless"]
    text = out.getvalue()
    assert "a_truncated.json: the case file cannot be read: JSONDecodeError" in text
    assert "c_verbless.json: `verb` must be one of ['run', 'explain', 'validate', 'model']" in text


def _writes(junk):
    """An in-process implementation that exits 0 after `junk(out)` wrote into its --out."""
    def impl(argv, cwd):
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir()
        junk(out)
        return 0, "", ""
    return impl


@pytest.mark.parametrize("junk, says", [
    (lambda out: (out / "t.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{junk}..."),
     "--out holds t.safetensors, which is not a safetensors file"),
    (lambda out: (out / "t.json").mkdir(), "--out holds t.json, which is not a file"),
    (lambda out: (out / "t.json").write_text("[{\"value\": 1", encoding="utf-8"),
     "--out holds t.json, which is not a JSON table (JSONDecodeError"),
    (lambda out: (out / "t.json").symlink_to("/etc/hostname"), "--out holds t.json, which is a link"),
], ids=["junk-safetensors", "folder-named-json", "truncated-json", "link"])
def test_junk_under_out_fails_that_case_in_one_line(junk, says, tmp_path):
    """SPEC.md:922 [C19] what an implementation writes under --out that is not a table or a tensor file fails
    that case naming the file, instead of stopping the run."""
    case = dict(_case("junk", verb="run", expect={"status": 0, "tables": {}}), _file=str(tmp_path / "junk.json"))
    verdict, diffs, _got = conform.check(case, _writes(junk))
    assert verdict == "fail" and len(diffs) == 1 and diffs[0].startswith(says), diffs


def test_a_lone_surrogate_in_a_case_reaches_the_implementation_escaped(tmp_path):
    """SPEC.md:922 [C19] a case whose document holds "\\ud800" is written as the case holds it (escaped, the
    same JSON value) and answered by the implementation; causalab_ref itself refuses it at the read stage."""
    seen = []

    def impl(argv, cwd):
        seen.append(Path(argv[1]).read_text(encoding="utf-8"))
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = cli.main(argv)
        return status, "", err.getvalue()

    refusal = {"stage": "validation", "path": "",
               "message": "<file> holds a string that is not valid Unicode text (<why>)"}
    case = dict(_case("surrogate", expect={"status": 2, "refusal": refusal}), document={"model": "\ud800"},
                _file=str(tmp_path / "surrogate.json"))
    verdict, diffs, got = conform.check(case, impl)
    assert seen and '"\\ud800"' in seen[0] and json.loads(seen[0]) == {"model": "\ud800"}
    assert got["refusal"]["stage"] == "validation" and "not valid Unicode text" in got["refusal"]["message"]
    assert verdict == "pass", diffs


def test_record_copies_no_table_a_path_outside_the_corpus_names(tmp_path):
    """SPEC.md:1103 [S12] `--record` copies into the corpus the shipped tables a document names; a string that
    climbs out with `..` names none, and nothing is written outside the corpus."""
    corpus = _corpus(tmp_path / "corpus", _case("climb"))
    case = dict(_case("climb"), document={"rows": "../../documents/data/weekdays/train#train"},
                _file=str(corpus / "climb.json"))
    done = conform.completed(case)
    assert "data" not in done and sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]
    kept = conform.completed(dict(case, document={"rows": "weekdays/train#train"}))
    assert kept["data"] == {"weekdays/train.json": "data/weekdays/train.json"}
    assert (corpus / "data" / "weekdays" / "train.json").is_file()


def test_record_takes_a_string_too_long_for_a_file_name_for_no_table(tmp_path):
    """SPEC.md:1103 [S12] a document string with a slash in it but longer than a file name (a description
    naming a path) names no shipped table: `--record` copies nothing for it, never an internal error."""
    corpus = _corpus(tmp_path / "corpus", _case("long"))
    text = "a" * 300 + " documents/artifacts/x.safetensors"
    done = conform.completed(dict(_case("long"), document={"header": {"description": text}},
                                  _file=str(corpus / "long.json")))
    assert "data" not in done


def test_record_never_writes_through_a_linked_case_file(tmp_path):
    """SPEC.md:1099 [S11] a case file that is a link is not recorded through: that case fails in one line and the
    file the link names is unchanged."""
    victim = tmp_path / "victim.json"
    victim.write_text(json.dumps(_case("linked")), encoding="utf-8")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "linked.json").symlink_to(victim)
    before = victim.read_bytes()
    out = io.StringIO()
    result = conform.conform(options=conform.Options(cases_dir=str(corpus), record=True), main=cli.main, stream=out)
    assert result["failed"] == ["linked"] and victim.read_bytes() == before
    assert "linked.json cannot be recorded" in out.getvalue()


def test_a_case_whose_informative_holds_a_number_fails_alone(tmp_path):
    """SPEC.md:922 [C19] `informative` is a list of paths: one holding a number (fuzz case 2667 at 6cd13e9, an
    internal AttributeError once) fails that case in one line naming the field; the other cases run."""
    corpus = _corpus(tmp_path / "corpus", dict(_case("a_bad"), informative=[3]), _case("b_good"))
    out = io.StringIO()
    result = conform.conform(options=conform.Options(cases_dir=str(corpus)), main=lambda argv: 0, stream=out)
    assert result["passed"] == 1 and result["failed"] == ["a_bad"]
    assert "a_bad.json: `informative` must be a list of paths (strings)" in out.getvalue()
