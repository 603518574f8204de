"""Results: the folder a run writes, and everything about files that a run needs.

This module owns the results folder (`Folder`): the staging folder beside --out, the
refusals of a destination that is not a new folder (or a replaceable one), confinement
of every file a document names (`confined`), the cleanup of staging folders a killed
run left (`clean_stale`), writing JSON (`dump`, `dumps`), the move into place; and what
run.json says about this package (`package_digest`, `versions`) and the progress bar
(`progress`). The run (run.py) hands it plain data and never touches a path. SPEC.md §4 Runs.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import hashlib
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Any, Optional

from ..interrupts import alive, staged_prefix, writer_of
from ..shapes import Refusal, read_json


def dump(path: Path, obj: Any, made: Optional[Path] = None) -> None:
    """One JSON file, indented, newline-terminated; its folders are made unless its folder is `made` (one the
    caller made and holds), and it is written in one call."""
    if path.parent != made:
        path.parent.mkdir(parents=True, exist_ok=True)
    data = (dumps(obj) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        view = memoryview(data)
        while view:  # a regular file takes it whole; a short write goes on where it stopped
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


_SCALARS = frozenset((str, int, float, bool, type(None)))
#: json's C encoder with the separators `indent=1` puts between the items of a table's row
_ROWS = json.JSONEncoder(separators=(",\n  ", ": "))


def dumps(obj: Any) -> str:
    """Exactly `json.dumps(obj, indent=1)`, the bytes SPEC.md R7 and Q16 fix. A table of flat rows (a list
    of non-empty dicts of string keys and plain scalars) is encoded by json's C encoder, which Python uses
    only without `indent`: given the row separators, only the lines between rows and around the table differ,
    and a raw newline, which the encoder writes only between items, marks them. Everything else is
    `json.dumps` itself."""
    if (type(obj) is list and obj and set(map(type, obj)) == {dict} and all(obj)  # asked in C, row by row
            and set(map(type, chain.from_iterable(obj))) == {str}
            and _SCALARS.issuperset(map(type, chain.from_iterable(map(dict.values, obj))))):
        try:
            text = _ROWS.encode(obj)  # '[{' row ',\n  ' ... '},\n  {' next row ... '}]'
        except ValueError:  # what json refuses (an int too long to print) it refuses below, in its own words
            return json.dumps(obj, indent=1)
        return "[\n {\n  " + text[2:-2].replace("},\n  {", "\n },\n {\n  ") + "\n }\n]"
    return json.dumps(obj, indent=1)


@functools.lru_cache(maxsize=None)
def package_digest() -> str:
    """sha256 over this package's own .py files (every subpackage's too) in path order."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for file in sorted(root.rglob("*.py")):
        h.update(file.relative_to(root).as_posix().encode())
        h.update(file.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _versions_cached() -> tuple:
    from importlib import metadata
    out = []
    for name in ("torch", "transformers", "nnsight", "nnterp"):
        try:
            out.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            out.append((name, "not installed"))
    return tuple(out)


def versions() -> dict:
    """The installed versions of the libraries a run depends on (run.json's `versions`)."""
    return dict(_versions_cached())


#: the set this package is tested with, as .ci/constraints.txt pins it (SPEC.md R24)
TESTED = {"torch": "2.13.0", "transformers": "5.24.0", "nnsight": "0.7.0", "nnterp": "1.3.0"}


def untested_note() -> str:
    """One line when the installed stack is not the tested one ('' when it is): numbers may then differ by a
    fact of the stack, not a defect of the document or of causalab_ref (SPEC.md R24)."""
    found = versions()
    off = [f"{name} {found[name]} (tested {want})" for name, want in TESTED.items()
           if found[name].split("+")[0] != want]
    if not off:
        return ""
    return ("note: installed versions are not the tested set: " + ", ".join(off) +
            "; numbers may differ by a stack fact, not a defect (run.json records the versions)")


def confined(base: Path, file_path: str, path: str, root: Path, folder: str = "--out",
             canonical: Optional[Path] = None) -> Path:
    """A save's file (or a sweep point's folder) under `base`, never outside `root` (SPEC.md R12).

    The name itself was judged at validation (names.inside_out: no absolute path, `..`,
    empty or over-long part); what only the disk knows is a link that resolves outside.
    `folder` is what `root` is called in the refusal; `canonical` is `root.resolve()`, when the
    caller has it."""
    target = base / file_path
    try:
        inside = (canonical or root.resolve()) in target.resolve().parents
    except (OSError, RuntimeError, ValueError):
        inside = False
    if not inside:
        raise Refusal(f"'{file_path}' resolves outside {folder} ({target.resolve()}); files stay inside {folder}",
                      path=path, stage="run")
    return target


def _clean(out: Path, entries) -> None:
    """Of `entries` (names beside --out), each folder (not a symlink) `writer_of` names as a staging or old
    folder of --out, of a process not alive, is removed, or put back when old and --out is missing (SPEC.md S7)."""
    for entry in entries:
        for kind in ("partial", "old"):
            pid = writer_of(entry, out.name, kind)
            if pid is None:
                continue
            old = out.parent / entry
            if not old.is_dir() or old.is_symlink() or (pid != os.getpid() and alive(pid)):
                continue
            if kind == "old" and not (out.exists() or out.is_symlink()):
                os.rename(old, out)
            else:
                shutil.rmtree(old, ignore_errors=True)


def clean_stale_plain(out: Path) -> None:
    """The definition (SPEC.md S7): every entry beside --out is looked at. `clean_stale` is its optimisation
    (SPEC.md Q29), and a test checks the two agree."""
    _clean(out, sorted(os.listdir(out.parent)))


def clean_stale(out: Path) -> None:
    """An optimisation of `clean_stale_plain`, equal to it, looking only at the names starting `.<out>.`, as
    every name writer_of matches does, so a folder of many runs is not parsed entry by entry (SPEC.md Q29).

    What a killed run left beside --out is never a result: its staging folder is removed, and an old result it
    had moved aside is put back if --out is missing, else removed. Only this tool's folders, matched by their
    exact names, of a process that is not alive, are touched (SPEC.md S7)."""
    mine = f".{out.name}."
    _clean(out, sorted(e for e in os.listdir(out.parent) if e.startswith(mine)))


def progress(total: int, show, what: str):
    """A tqdm bar on stderr: `show` True when it is a terminal (the run is not --quiet), "always" also off a
    terminal (the API's `progress=True`, a notebook's stderr), False never; nothing for one pass or none."""
    if not show or total <= 1 or (show != "always" and not sys.stderr.isatty()):
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=what, unit="pass", leave=False, file=sys.stderr)


def record_of(folder: Path) -> Optional[dict]:
    """The run.json of a folder a run of this tool wrote (it names this package's digest), else None."""
    record = read_json(folder / "run.json")
    return record if isinstance(record, dict) and isinstance(record.get("causalab_ref"), str) else None


def fault(error: OSError, what: str) -> Refusal:
    """An environment fault (read-only or full file system, a file where a folder goes, an over-long name)
    as one refusal naming the path and the cause (SPEC.md S9)."""
    named = error.filename or what
    cause = error.strerror or type(error).__name__
    if isinstance(error, (FileExistsError, NotADirectoryError)) and not Path(named).is_dir():
        cause = "Not a directory (a file is where a folder must be)"
    return Refusal(f"cannot {what}: {named}: {cause}; choose an --out on a "
                   "writable file system, with room, under folders", path="--out", stage="run")


def check_out(out: Path, replace: bool) -> None:
    """An --out that may be written: not `.`, `..` or empty; new, or with --replace a folder a run wrote."""
    if out.name in ("", ".", ".."):
        raise Refusal(f"--out '{out}' names no new folder (it is the current folder, a parent or the root); "
                      "name a folder for the results", path="--out", stage="run")
    try:
        present = out.exists() or out.is_symlink()
    except OSError as error:  # a name the file system will not take, a folder it will not open
        raise fault(error, f"use --out {out}") from None
    if not present:
        return
    if not replace:
        raise Refusal(f"--out {out} already exists; choose a new folder or say --replace", stage="run")
    if out.is_symlink() or not out.is_dir():
        raise Refusal(f"--out {out} is a link or a file, not a results folder; choose a new folder", stage="run")
    if record_of(out) is None:
        raise Refusal(f"--out {out} is not a folder a run wrote (it holds no run.json of causalab_ref); "
                      "--replace only replaces a previous run's results, so it is left as it is; choose a new "
                      "folder", path="--out", stage="run")


def open_own(path: Path, what: str) -> int:
    """A file this tool creates or truncates (a lock), opened read-write without ever following a link
    (O_NOFOLLOW) and checked on the opened descriptor: a regular file with no other name (a hard link
    planted there would make a truncation reach another file). Anything else is refused (SPEC.md S11)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | os.O_NONBLOCK, 0o644)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.EMLINK):
            raise Refusal(f"{what} {path} is a link; remove it (this tool never writes through a link)",
                          path="--out", stage="run") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        kind = "not a regular file" if not stat.S_ISREG(info.st_mode) else "a hard link to another file"
        raise Refusal(f"{what} {path} is {kind}; remove it (this tool writes only files of its own)",
                      path="--out", stage="run")
    return fd


class Claim:
    """The exclusive right to write one --out: a lock on `.<out>.lock` beside it (flock, so the kernel
    drops it when the process dies, SIGKILL included). A second run is refused while the first holds it."""

    def __init__(self, out: Path):
        self.path = out.parent / f".{out.name}.lock"
        self.fd: Optional[int] = None
        for _attempt in range(5):
            fd = open_own(self.path, f"--out {out}: its lock")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
                os.close(fd)
                raise Refusal(f"--out {out} is being written by another run (pid {holder}); wait for it to "
                              "finish, or choose another --out", path="--out", stage="run") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not a lock file its last holder removed between our open and our lock
                os.ftruncate(fd, 0)
                os.write(fd, str(os.getpid()).encode())
                self.fd = fd
                return
            os.close(fd)
        raise Refusal(f"--out {out}: its lock {self.path} keeps changing; try again", path="--out", stage="run")

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        try:
            os.ftruncate(self.fd, 0)  # emptied first: on ext4 an unlinked file is closed faster empty
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None


@contextmanager
def signals_held():
    """SIGINT and SIGTERM wait until the block is done (the moves of a commit are not interrupted)."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


@functools.lru_cache(maxsize=None)
def _renameat2():
    return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)


def rename2(src: Path, dst: Path, flags: int) -> bool:
    """Linux renameat2: False when the system or the file system does not offer it."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(-100, os.fsencode(src), -100, os.fsencode(dst), flags) == 0:  # -100: AT_FDCWD
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(dst))


class Written(KeyboardInterrupt):
    """An interrupt that arrived while the results were moved into place: they were, whole."""


class Folder:
    """A run's results folder: claimed, written in a staging folder beside `out`, moved into place by `commit`.

    Used as a context manager: leaving it by an exception (a refusal, SIGINT, SIGTERM) removes the
    staging folder and leaves --out as it was. What a killed run left beside --out is cleaned by the
    next run (`clean_stale`). The claim is taken before --out is judged, so two runs cannot both
    decide it is theirs (SPEC.md S1-S7).
    """

    def __init__(self, out: Path, replace: bool = False):
        out = Path(out)
        self.out, self.claim = out, None
        self.written: list[str] = []
        check_out(out, replace)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            self.claim = Claim(out)
            clean_stale(out)
            check_out(out, replace)  # again, now that no other run can change it
            self.replacing = out.exists()
            self.staging = Path(tempfile.mkdtemp(prefix=staged_prefix(out.name, "partial"), dir=out.parent))
            self.canonical = self.staging.resolve()  # made here, by this run: what every save must stay under
        except OSError as error:
            self._release()
            raise fault(error, f"write --out {out}") from None
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        if self.claim is not None:
            self.claim.release()

    def __enter__(self) -> "Folder":
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
        self._release()

    def confine(self, relative: str, path: str) -> Path:
        """Where `relative` lands in the folder, refused (at `path`) if a link takes it outside."""
        return confined(self.staging, relative, path, self.staging, canonical=self.canonical)

    def write(self, relative: str, obj: Any, path: str = "", at: Optional[int] = None) -> None:
        """Write one JSON file; `at` puts it at that place in the list of written files."""
        target = self.confine(relative, path)
        try:
            dump(target, obj, made=self.staging)
        except OSError as error:
            raise fault(error, f"write {self.out / relative}") from None
        self.written.insert(len(self.written) if at is None else at, relative)

    def write_bytes(self, relative: str, data: bytes, path: str = "") -> None:
        """Write one binary file (a .safetensors bundle or tensor) into the folder."""
        target = self.confine(relative, path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except OSError as error:
            raise fault(error, f"write {self.out / relative}") from None
        self.written.append(relative)

    def commit(self) -> list[str]:
        """Move the staging folder into place, signals held: a new --out appears whole; an old one is swapped
        for the new at once (or, where the file system cannot swap, moved aside first and put back by the
        next run if this one is killed in between). The written paths."""
        try:
            with signals_held():
                self._move()
        except KeyboardInterrupt:  # delivered as the signals were let through: the move was done
            raise Written() from None
        except OSError as error:
            raise fault(error, f"move the results into {self.out}") from None
        return [str(self.out / w) for w in self.written]

    def _move(self) -> None:
        out, staging = self.out, self.staging
        if not self.replacing:
            if not rename2(staging, out, RENAME_NOREPLACE):
                if out.exists() or out.is_symlink():
                    raise FileExistsError(errno.EEXIST, "appeared while the run was writing", str(out))
                os.rename(staging, out)
            return
        if rename2(staging, out, RENAME_EXCHANGE):
            shutil.rmtree(staging, ignore_errors=True)  # the old result, now under the staging name
            return
        aside = Path(tempfile.mkdtemp(prefix=staged_prefix(out.name, "old"), dir=out.parent))
        os.replace(out, aside)
        os.rename(staging, out)
        shutil.rmtree(aside, ignore_errors=True)
