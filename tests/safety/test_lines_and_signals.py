"""Refusal lines that cannot act on a terminal, and interrupts that arrive once a verb has finished.

A document's names reach the refusal line through its path and its message: the line escapes control and
bidirectional characters and shortens a long run, saying its length (SPEC.md S76). A SIGINT or SIGTERM that arrives
while the answer is printed or the handlers are put back prints no traceback (S77). Each is run as the command
line, in a subprocess, as a user meets it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from causalab_ref.shapes import Refusal, printable

pytestmark = pytest.mark.fast
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def _validate(tmp_path: Path, doc: dict) -> subprocess.CompletedProcess:
    file = tmp_path / "doc.json"
    file.write_text(json.dumps(doc), encoding="utf-8")
    return subprocess.run([sys.executable, "-m", "causalab_ref", "validate", str(file)], capture_output=True,
                          cwd=ROOT, env=ENV, timeout=300)


def _with_role(name: str) -> dict:
    doc = json.loads((ROOT / "documents" / "patching.json").read_text(encoding="utf-8"))
    doc["roles"][name] = {"field": "prompt"}
    return doc


@pytest.mark.parametrize("raw, shown", [("\x00", "\\x00"), ("\x1b", "\\x1b"), ("\u202e", "\\u202e"),
                                        ("\x7f", "\\x7f"), ("\x9b", "\\x9b"), ("\u2028", "\\u2028"),
                                        ("\u2066", "\\u2066"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t")])
def test_a_refusal_line_escapes_control_and_bidi_characters(tmp_path, raw, shown):
    """SPEC.md:1111 [S76] — a role named with a control or bidi character is refused in one line that holds
    the character's escape, never the character (NUL, ESC and RLO were printed raw)."""
    proc = _validate(tmp_path, _with_role(f"a{raw}b"))
    line = proc.stderr.decode("utf-8")
    assert proc.returncode == 2 and line.count("\n") == 1, line
    assert raw not in line.rstrip("\n") and f"a{shown}b" in line
    assert all(ch == "\n" or ch.isprintable() for ch in line), line


def test_a_long_name_is_cut_with_its_length_said(tmp_path):
    """SPEC.md:1111 [S76] — a 100,000-character role name gives a line of a few hundred characters naming the
    name's length (it gave a 100,000-character line)."""
    proc = _validate(tmp_path, _with_role("x" * 100_000))
    line = proc.stderr.decode("utf-8").rstrip("\n")
    assert proc.returncode == 2 and "\n" not in line and len(line) < 1000, len(line)
    assert line.startswith("validation: roles." + "x" * 64 + "\u2026(100000 chars): "), line[:200]


def test_ordinary_text_is_unchanged():
    """SPEC.md:1111 [S76] — text without control characters, with backslashes, quotes, non-ASCII letters and
    names of 255 bytes in a dotted path, is printed byte for byte as it is."""
    name = "\u00e9" * 127 + "a"  # 255 bytes of UTF-8, the longest name S43 allows
    text = (f"validation: steps.{name}.reads.{name}: name '\\\\' is 'caf\u00e9 \u2026'; "
            "has no '/', '\\', '.' or control character")
    assert printable(text) == text
    assert Refusal("has no '\\'", path="a.b", stage="compile").line() == "compile: a.b: has no '\\'"
    assert Refusal("no path here", stage="run").line() == "run: no path here"


def test_a_shortened_run_of_control_characters_prints_at_most_its_kept_escapes():
    """SPEC.md:1111 [S76] — a run is shortened before it is escaped: 10,000 NULs print 64 escapes and the length."""
    line = printable("x: " + "\x00" * 10_000)
    assert line == "x: " + "\\x00" * 64 + "\u2026(10000 chars)"


# a verb whose answer sends the tool its own signal while it is printed, or while `main` puts its handlers back
LATE = '''import os, signal, sys
from causalab_ref import cli
SIGNUM, MOMENT = int(sys.argv[1]), sys.argv[2]
class Late(str):
    def __str__(self):
        if MOMENT == "print":
            os.kill(os.getpid(), SIGNUM)
        return "the whole answer"
cli.cmd_vocab = lambda args: {"text": Late("x")}
if MOMENT == "restore":
    real = signal.signal
    calls = []
    def restoring(signum, handler):
        calls.append(signum)
        if calls.count(SIGNUM) == 2:
            os.kill(os.getpid(), SIGNUM)  # arrives as main's `finally` puts the caller's handler back
        return real(signum, handler)
    signal.signal = restoring
    status = cli.main(["vocab"])
    signal.signal = real
    print("status", status)
    sys.exit(status)
sys.argv = ["causalab-ref", "vocab"]
sys.exit(cli.main())
'''


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("moment", ["print", "restore"])
def test_an_interrupt_as_the_verb_finishes_prints_no_traceback(tmp_path, signum, moment):
    """SPEC.md:1055 [S77] — a signal that arrives as the answer is printed (the command line, `main()`) or as
    `main` puts the caller's handlers back (`main(argv)`) leaves the answer whole, its status the verb's, and
    nothing on stderr (a KeyboardInterrupt traceback escaped `main`'s `finally`)."""
    script = tmp_path / "late.py"
    script.write_text(LATE, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), str(int(signum)), moment], capture_output=True, text=True,
                          cwd=ROOT, env=ENV, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", (proc.returncode, proc.stderr)
    assert proc.stdout.splitlines()[0] == "the whole answer"
    assert moment == "print" or proc.stdout.splitlines()[1:] == ["status 0"]


# a verb in which a library swallows the interrupt (a bare `except` around an import) and fails after it
SWALLOWED = '''import os, signal, sys, time
from causalab_ref import cli
def verb(args):
    try:
        os.kill(os.getpid(), int(sys.argv[1]))
        time.sleep(5)
    except BaseException:
        pass
    raise AttributeError("module 'sympy' has no attribute 'core'")
cli.cmd_vocab = verb
sys.exit(cli.main(["vocab"]))
'''


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_failure_after_a_swallowed_interrupt_is_the_interrupt(tmp_path, signum):
    """SPEC.md:1055 [S77] — an interrupt that a library caught, followed by that library's failure, ends as the
    interrupt: 130 and S6's one line, never `internal error` (the interrupt fuzz surface met `module 'sympy' has
    no attribute 'core'` when a signal landed in torch's import)."""
    script = tmp_path / "swallowed.py"
    script.write_text(SWALLOWED, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), str(int(signum))], capture_output=True, text=True, cwd=ROOT,
                          env=ENV, timeout=300)
    assert proc.returncode == 130 and proc.stderr == "interrupted; nothing was written\n", proc.stderr


# a verb that imports a module whose own body is interrupted half-way (as a library's initialiser may be)
IMPORTING = '''import os, signal, sys
from pathlib import Path
from causalab_ref import cli
folder, signum, how = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
(folder / "inner.py").write_text(
    "import os, time\\nos.kill(os.getpid(), %d)\\ntime.sleep(0.2)\\n" % signum
    + ("raise ValueError('the import failed')\\n" if how == "failing" else "")
    + "open(%r, 'w').write('whole')\\n" % str(folder / "inner.done"))
(folder / "outer.py").write_text("import inner\\nopen(%r, 'w').write('whole')\\n" % str(folder / "outer.done"))
sys.path.insert(0, str(folder))
def verb(args):
    if how == "last":
        import inner
    else:
        try:
            __import__("outer" if how == "nested" else "inner")
        except ValueError:
            pass
        (folder / "after").write_text("the importer's next line ran")
        return {"text": "not reached"}
cli.cmd_vocab = verb
sys.argv = ["causalab-ref", "vocab"]
sys.exit(cli.main())
'''


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("how", ["plain", "nested", "failing", "last"])
def test_an_interrupt_during_an_import_is_taken_when_the_import_ends(tmp_path, signum, how):
    """SPEC.md:1055 [S77] — a signal that arrives while a module is being imported lets that import (and every
    import inside it) run to its end, then stops the verb in the code that imported it, before its next line (or
    at its end, or as the import's own failure reaches it): S6's line and 130, no traceback. The interrupt was
    raised inside the module's body, which left it half-run (bench/fuzz_surfaces.py's interrupt surface, case
    4006: an abort, exit status -6, with importlib's frames on stderr)."""
    script = tmp_path / "importing.py"
    script.write_text(IMPORTING, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), str(int(signum)), how], capture_output=True,
                          text=True, cwd=ROOT, env={**ENV, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=300)
    assert proc.returncode == 130 and proc.stderr == "interrupted; nothing was written\n", proc.stderr
    assert (tmp_path / "inner.done").exists() == (how != "failing")  # the interrupted body ran to its end
    assert (tmp_path / "outer.done").exists() == (how == "nested")
    assert not (tmp_path / "after").exists()  # the importer stopped before its next line
    assert proc.stdout == ""


# the command line's own end: a verb whose answer is long and which leaves an atexit callback behind
ENDING = '''import atexit, sys
from pathlib import Path
from causalab_ref import cli
def verb(args):
    atexit.register(lambda: Path(sys.argv[1]).write_text("the interpreter's shutdown ran"))
    return {"text": "x" * 200_000}
cli.cmd_vocab = verb
sys.argv = ["causalab-ref"] + sys.argv[2:]
cli.command_line()
'''


@pytest.mark.parametrize("argv, status", [(["vocab"], 0), (["--bogus"], 2), (["--help"], 0)])
def test_the_command_line_ends_with_its_answer_flushed_and_no_shutdown(tmp_path, argv, status):
    """SPEC.md:1055 [S77] — the command line's process ends once its answer is flushed, with the verb's status
    (argparse's 2 and 0 too), and no interpreter shutdown runs (no atexit callback), where CPython would have put
    the signals' default actions back: a SIGTERM there ended a finished `validate` with -15."""
    script = tmp_path / "ending.py"
    script.write_text(ENDING, encoding="utf-8")
    marker = tmp_path / "shutdown"
    proc = subprocess.run([sys.executable, str(script), str(marker), *argv], capture_output=True, text=True,
                          cwd=ROOT, env=ENV, timeout=300)
    assert proc.returncode == status, proc.stderr
    assert not marker.exists()
    assert argv != ["vocab"] or proc.stdout == "x" * 200_000 + "\n"
    assert argv != ["--help"] or proc.stdout.startswith("usage: causalab-ref")


def test_a_usage_line_naming_an_argument_escapes_it(capsys):
    """SPEC.md:1111 [S76] — argparse's `unrecognized arguments` line names the argument as given: an ESC in it
    is printed as its escape, in one line (it was printed raw)."""
    from causalab_ref import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["vocab", "\x1b[31mred\u202e"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err == "usage: unrecognized arguments: \\x1b[31mred\\u202e\n"


# a verb that calls the tool in-process (as conform does) while the inner call's answer meets an interrupt
NESTED = '''import os, signal, sys
from causalab_ref import cli
class Late(str):
    def __str__(self):
        os.kill(os.getpid(), signal.SIGINT)
        return "the inner answer"
inner = lambda args: {"text": Late("x")}
def outer(args):
    cli.cmd_vocab = inner
    status = cli.main(["vocab"])
    return {"text": f"the outer verb went on after the inner one's {status}"}
cli.cmd_schema = outer
sys.exit(cli.main(["schema"]))
'''


def test_an_interrupt_noted_by_a_nested_call_stops_the_calling_verb(tmp_path):
    """SPEC.md:1055 [S77] — `main` called in-process by a verb of the tool (conform's in-process check) notes an
    interrupt that arrives as its answer is printed and hands it to the calling tool's handler: the outer verb
    stops with S6's line and 130, rather than the interrupt being lost."""
    script = tmp_path / "nested.py"
    script.write_text(NESTED, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, env=ENV,
                          timeout=300)
    assert proc.returncode == 130 and proc.stderr == "interrupted; nothing was written\n", proc.stderr
    assert proc.stdout == "the inner answer\n"


def test_an_interrupt_a_callback_swallowed_prints_no_ignored_traceback():
    """SPEC.md:1055 [S77] — the handler's KeyboardInterrupt raised inside a callback CPython cannot raise from (a
    weakref callback, as importlib's module-lock one, where bench/fuzz_surfaces.py's interrupt surface met it at
    2045888, case 161) is not reported (CPython's "Exception ignored" traceback is its hook's report) while the
    handler is installed; any other unraisable exception still reaches the hook that was there before, and that
    hook is put back after."""
    import weakref

    from causalab_ref.interrupts import Interrupts

    class Thing:
        pass

    def raise_from_callback(error):
        def callback(_ref):
            raise error
        thing = Thing()
        kept = weakref.ref(thing, callback)
        del thing  # CPython runs the callback and hands what it raised to sys.unraisablehook
        return kept

    reported: list = []
    outer = sys.unraisablehook
    sys.unraisablehook = before = lambda u: reported.append(type(u.exc_value).__name__)
    try:
        interrupts = Interrupts()
        previous = interrupts.install()
        try:
            interrupts.raised = True  # as the handler sets it when it raises
            raise_from_callback(KeyboardInterrupt())
            raise_from_callback(ValueError("not an interrupt"))
        finally:
            interrupts.restore(previous)
        assert reported == ["ValueError"]
        assert sys.unraisablehook is before
    finally:
        sys.unraisablehook = outer


def test_conforms_report_escapes_a_case_files_lone_surrogate_and_control_characters():
    """SPEC.md:1111 [S76] — a case file's text in conform's report (its name, a difference) is printed escaped, never
    shortened: a lone surrogate as `\\ud800` (before: text no UTF-8 stdout holds, fuzz surface `case` 3232) and ESC as
    `\\x1b`, every line encodable as UTF-8; a long difference keeps its length."""
    import io

    from causalab_ref.conformance import conform

    stream = io.StringIO()
    long = "x" * 400
    conform._report({"name": "bad\x1bname", "verb": "run", "rules": []}, "fail",
                    ['plan[0].io: expected "\ud800", got "output"', long], 0.5, False, stream)
    text = stream.getvalue()
    text.encode("utf-8")  # raises on a lone surrogate
    assert "\\ud800" in text and "bad\\x1bname" in text and "\x1b" not in text
    assert long in text
