"""Interrupts: the command line's SIGINT and SIGTERM handler, and the names of what an interrupted or killed
run, build or export leaves (SPEC.md §7: S6, S7, S26, S77).

The handler (`Interrupts`) stops a verb where it is, so that it removes what it staged, and lets a signal that
arrives once the verb is done stop nothing. What a process writes it stages first beside its destination under a
name that carries its pid (`staged_prefix`: a run's results folder, a fixture's build, an export); what a killed
one left is found by that exact name (`writer_of`) and removed by the next run, build or export only when its
writer is not `alive`. Standard library only:

    interrupts = Interrupts()
    previous = interrupts.install()      # the main thread only; {signal: the handler it replaced}
    ... the verb; then interrupts.late = True, and the answer printed ...
    interrupts.restore(previous)          # in-process callers get theirs back

    staging = tempfile.mkdtemp(prefix=staged_prefix("out"), dir=parent)   # .out.partial-pid<P>-<8>
    pid = writer_of(entry.name, "out")    # P for a name staged so, else None
    if pid is not None and not alive(pid): ...    # a dead writer's folder: this tool's to remove
"""
from __future__ import annotations

import os
import re
import signal
import sys
import threading
from typing import Optional

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
    """SIGTERM is handled as SIGINT is: the run stops where it is and removes what it staged (S6), except that a
    module being imported is imported whole first (`deferred`), the verb stopping in the code that imported it.
    Once the verb has returned or raised (`late`), a signal is only counted: the answer is printed whole and the
    handlers are put back with nothing left to raise (S77). `raised` says an interrupt was raised in the verb, so
    a failure after it (a library that swallowed it) is reported as the interrupt.

    A trace's own threads (nnsight's mediators) fail when the main thread stops under them; that is the
    interrupt, not a second error, so from here on a thread's failure prints nothing."""

    def __init__(self) -> None:
        self.late, self.raised, self.deferred = False, False, False
        self.hook = sys.unraisablehook
        self.noted: list[int] = []

    def __call__(self, signum, frame):
        if self.late:
            self.noted.append(signum)
            return
        importer = _importer(frame)
        if importer is not None:  # a module is being imported: it ends first, then the code that imported it stops
            if not self.deferred:
                self._take_after(importer)
            return
        self._stop()

    def _stop(self):
        threading.excepthook = _quiet_thread
        self.raised = True
        raise KeyboardInterrupt

    def _take_after(self, importer) -> None:
        """The interrupt raised in `importer` (the frame whose import is under way) at its next line or at its
        end, however the import ended, so that no initialiser (a native library's among them) is stopped half-way
        (S77). A frame's own trace is called only while some trace function is set, hence the placeholder one."""
        outer = sys.gettrace()

        def take(frame, event, arg):
            sys.settrace(outer)
            importer.f_trace, self.deferred = None, False
            self._stop()
        importer.f_trace, self.deferred = take, True
        sys.settrace(outer or _untraced)

    def install(self) -> dict:
        """This handler for SIGINT and SIGTERM (in the main thread; elsewhere none): {signal: the one replaced}.
        While it is installed, an interrupt it raised that a callback swallowed (CPython reports it as an
        "Exception ignored" traceback) is not reported (S77)."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        self.hook = sys.unraisablehook
        sys.unraisablehook = self.unraisable
        return {signum: signal.signal(signum, self) for signum in HANDLED}

    def unraisable(self, unraisable) -> None:
        """CPython's report of an exception a callback could not raise: this handler's own KeyboardInterrupt,
        swallowed where the verb never saw it (an import's module-lock callback), is dropped; any other goes
        to the hook that was there before."""
        if not (self.raised and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            self.hook(unraisable)

    def restore(self, previous: dict) -> None:
        """Put the caller's handlers back with the signals held, so one that arrives meanwhile is noted by this
        handler (the mask's change runs it first) or taken while held, never raised by the caller's (S77); a
        signal noted once the verb was done is handed on only to a caller that is this tool too (`main` called
        in-process by a verb, as conform calls it), whose own verb it then stops."""
        hold = getattr(signal, "pthread_sigmask", None)
        mask = hold(signal.SIG_BLOCK, list(previous)) if hold and previous else None
        try:
            for signum, handler in previous.items():
                if handler is not None:  # None: a handler installed outside Python, which cannot be put back
                    signal.signal(signum, handler)
            take = getattr(signal, "sigtimedwait", None)
            while mask is not None and take:
                held = take([s for s in previous if s not in mask], 0)
                if held is None:
                    break
                self.noted.append(held.si_signo)  # held while the handlers changed: noted, as one after the verb is
        finally:
            if mask is not None and hold:
                hold(signal.SIG_SETMASK, mask)
        if previous and sys.unraisablehook == self.unraisable:
            sys.unraisablehook = self.hook
        for signum in dict.fromkeys(self.noted):
            if isinstance(previous.get(signum), Interrupts):
                previous[signum](signum, None)


def _importer(frame):
    """The frame that started the import under way at `frame` (the caller of its outermost importlib frame), or
    None when no import is under way."""
    importer = None
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            importer = frame.f_back
        frame = frame.f_back
    return importer


def _untraced(frame, event, arg):
    """A trace function that traces nothing: while it is set, the importer's own trace is called."""
    return None


def _quiet_thread(args) -> None:
    """A thread failing after an interrupt: already reported as the one `interrupted` line."""


# ---------------------------------------------------------------- what a killed process left (S7, S26)


def staged_prefix(name: str, kind: str = "partial", pid: Optional[int] = None) -> str:
    """`.<name>.<kind>-pid<P>-`: the start of the name of a folder this tool stages beside `name` (kind
    `partial` for what is being written, `old` for a result moved aside); tempfile adds 8 of [a-z0-9_]."""
    return f".{name}.{kind}-pid{os.getpid() if pid is None else pid}-"


def writer_of(entry: str, name: str, kind: str = "partial") -> Optional[int]:
    """The pid P when `entry` is exactly `.<name>.<kind>-pid<P>-<8>` (`name` taken literally), else None: only
    a folder named so is this tool's own to clean up (SPEC.md S7, S26)."""
    head = f".{name}.{kind}-pid"  # a folder of many entries is not matched entry by entry
    match = entry.startswith(head) and re.fullmatch(re.escape(head) + r"(\d+)-[a-z0-9_]{8}", entry)
    return int(match.group(1)) if match else None


def alive(pid: int) -> bool:
    """Whether a process with this id may exist: the writer of a staging folder a killed run, build or export
    left (SPEC.md S7, S26). A number no process can have (past what the system call takes) counts as alive, so
    its folder is not this tool's to touch."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True
    return True
