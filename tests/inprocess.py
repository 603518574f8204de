"""The command line run in this process: `cli.main(argv)` with stdout and stderr captured.

A subprocess pays several seconds of imports before it loads a model; a test of what a verb
prints or refuses runs it here instead, through the same entry point `python -m causalab_ref`
calls (tests that need a second process — signals, locks, a kill — still start one).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Completed:
    """What `subprocess.run(..., capture_output=True, text=True)` would have given."""

    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, cwd: pathlib.Path = REPO) -> Completed:
    """`python -m causalab_ref *args` run from `cwd`, in this process. A `SystemExit` leaving main gives
    its status; one whose code is not an int (not the contract) gives status -1, its code in stderr."""
    from causalab_ref import cli as entry

    out, err, before = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = entry.main(list(args))
            except SystemExit as leave:
                status = leave.code if isinstance(leave.code, int) else -1
                if not isinstance(leave.code, int):
                    print(f"SystemExit({leave.code!r})", file=sys.stderr)
    finally:
        os.chdir(before)
    return Completed(status, out.getvalue(), err.getvalue())
