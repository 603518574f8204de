"""Invoke: calling the implementation under test, in this process or as a bounded subprocess.

An implementation is a callable `impl(argv, cwd) -> (status, stdout, stderr)`. `InProcess` calls a
command-line entry point here with captured streams (causalab_ref itself, the corpus in seconds).
`Subprocess` runs another implementation's command: each call has a deadline (`--timeout`) and a cap
on what is read back of stdout and of stderr, each read as it arrives; past either, the process and
everything it started are killed and the call raises `CaseError` naming which, so that case fails in
one line and the run goes on (SPEC.md C18, C19). `command(text)` splits `--impl`'s text, refusing a
blank one or a program that cannot be found (a usage error, C20).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from ..fixtures import exported

TIMEOUT = 300.0  # seconds one call of the implementation may take (--timeout)
POLL = 3600.0  # seconds one wait for output may take: a --timeout of 1e308 is waited in such steps
CAP = 16 * 2 ** 20  # bytes read back of its stdout, and of its stderr, per call
READ_SIZE = 2 ** 16  # bytes one read of a pipe takes at most
GRACE = 3.0  # seconds the implementations an interrupt stops are given after SIGTERM, before SIGKILL (C39)


class CaseError(Exception):
    """A case that cannot be set up or answered (a path it names escapes, a file it names is missing, the
    case file is not a case, the implementation hung, flooded, or wrote what is not a table): that case fails
    with this one line, and the run goes on."""


class UsageError(Exception):
    """conform was called wrongly (a blank --impl, a --cases that is not a folder): nothing runs, status 2."""


def command(text: str) -> list[str]:
    """`--impl`'s text as an argument list: a blank text (an unset variable) or one that does not split
    is a usage error, never the verb run as the program; so is a program that is not there."""
    try:
        words = shlex.split(text)
    except ValueError as error:
        raise UsageError(f"--impl {text!r} is not a command line ({error})") from None
    if not words:
        raise UsageError(f"--impl {text!r} is blank; give the implementation's command, e.g. --impl \"mycli\" "
                         "(an unset variable gives an empty --impl)")
    if shutil.which(words[0]) is None:
        raise UsageError(f"--impl {text!r}: no program {words[0]!r} (not an executable file, nor on $PATH)")
    if os.sep in words[0]:  # each case runs in a folder of its own: a relative program is this folder's
        words[0] = os.path.abspath(words[0])
    return words


class InProcess:
    """An entry point called in this process (`main(argv) -> status`) with captured stdout and stderr."""

    name = "causalab_ref (in-process)"

    def __init__(self, main: Callable[[list[str]], int]):
        self.main = main

    def stop(self) -> None:
        """Nothing to stop: an interrupt stops the call where it is, in this process."""

    def __call__(self, argv: list[str], cwd: Path) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.chdir(cwd):
            try:
                status = self.main(argv)
            except SystemExit as exit_:  # argparse usage errors
                status = exit_.code if isinstance(exit_.code, int) else 1
        return status, out.getvalue(), err.getvalue()


class Subprocess:
    """Another implementation: `CMD <argv>` in a subprocess, told where each checkpoint is (SPEC.md C1, C9),
    each call bounded in time and in what it prints (C18)."""

    def __init__(self, words: list[str], checkpoints: Optional[dict[str, str]] = None, timeout: float = TIMEOUT,
                 cap: int = CAP):
        self.command, self.timeout, self.cap = list(words), float(timeout), int(cap)
        self.name = shlex.join(words)
        self.env = dict(os.environ)
        self._lock, self._stopped = threading.Lock(), False
        self._running: set[subprocess.Popen] = set()
        if checkpoints is not None:
            self.env[exported.MAP_ENV] = json.dumps(checkpoints, sort_keys=True)

    def __call__(self, argv: list[str], cwd: Path) -> tuple[int, str, str]:
        with self._lock:  # no call starts once the run is stopped (C39)
            if self._stopped:
                raise CaseError("conform was interrupted before this case started")
            try:
                process = subprocess.Popen(self.command + argv, cwd=cwd, env=self.env, stdin=subprocess.DEVNULL,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            except OSError as error:
                raise CaseError(f"the implementation could not be started: {error}") from None
            self._running.add(process)
        try:
            out, err = self._read_back(process, time.monotonic() + self.timeout, argv)
        except CaseError:
            _kill(process)
            raise
        except BaseException:  # an interrupt met here (--jobs 1): what this call started is stopped first (C39)
            self.stop()
            raise
        finally:
            with self._lock:
                self._running.discard(process)
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        return process.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def stop(self, grace: float = GRACE) -> None:
        """Stop every call running, at once, and start no other: each implementation's process group is sent
        SIGTERM, given `grace` seconds together, and sent SIGKILL if any of it is left; each is reaped (C39)."""
        with self._lock:
            self._stopped = True
            running = list(self._running)
        for process in running:
            _signal(process, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        for process in running:
            _kill(process)  # the group's stragglers too, even when its leader has gone

    def _read_back(self, process: subprocess.Popen, deadline: float, argv: list[str]) -> tuple[bytes, bytes]:
        """Both streams read as they arrive until both close and the process exits, within the deadline and
        the cap; the process is left to the caller to kill when this raises."""
        assert process.stdout is not None and process.stderr is not None
        names = {process.stdout.fileno(): "stdout", process.stderr.fileno(): "stderr"}
        parts: dict[int, list[bytes]] = {fd: [] for fd in names}
        sizes = dict.fromkeys(names, 0)
        verb = " ".join(a for a in argv[:2] if not a.startswith("/"))
        with selectors.DefaultSelector() as selector:
            for fd in names:
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CaseError(self._late(verb))
                for key, _events in selector.select(min(left, POLL)):
                    data = os.read(key.fd, READ_SIZE)
                    if not data:
                        selector.unregister(key.fd)
                        continue
                    sizes[key.fd] += len(data)
                    if sizes[key.fd] > self.cap:
                        raise CaseError(f"the implementation wrote more than {_size(self.cap)} to "
                                        f"{names[key.fd]} on `{verb}`; it was stopped (conform reads back at most "
                                        f"{_size(self.cap)} of each stream)")
                    parts[key.fd].append(data)
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            raise CaseError(self._late(verb)) from None
        out, err = (b"".join(parts[fd]) for fd in names)
        return out, err

    def _late(self, verb: str) -> str:
        return (f"the implementation did not finish `{verb}` within --timeout {self.timeout:g} s; it was stopped "
                "(give a longer --timeout if it is only slow)")


def _signal(process: subprocess.Popen, signum: int) -> None:
    """`signum` to the implementation's process group (its own session: everything it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _kill(process: subprocess.Popen) -> None:
    """The implementation and everything it started (its own session), then reaped."""
    _signal(process, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def _size(n: int) -> str:
    return f"{n / 2 ** 20:g} MiB" if n >= 2 ** 20 else f"{n} bytes"
