"""Results: the folder a run writes, and everything about files that a run needs.

This module owns the results folder (`Folder`): the staging folder beside --out, the
refusals of a destination that is not a new folder (or a replaceable one), confinement
of every file a document names (`confined`), the cleanup of staging folders a killed
run left (`clean_stale`, `alive`), writing JSON (`dump`), the move into place; and what
run.json says about this package (`package_digest`, `versions`) and the progress bar
(`progress`). The run (run.py) hands it plain data and never touches a path. SPEC.md §4 Runs.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from .shapes import Refusal


def dump(path: Path, obj: Any) -> None:
    """One JSON file (its folders made), indented, newline-terminated."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")


@functools.lru_cache(maxsize=None)
def package_digest() -> str:
    """sha256 over this package's own .py files in path order."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for file in sorted(root.glob("*.py")):
        h.update(file.name.encode())
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


def confined(base: Path, file_path: str, path: str, root: Path) -> Path:
    """A save's file (or a sweep point's folder) under `base`, never outside `root` (SPEC.md R12).

    The name itself was judged at validation (names.inside_out: no absolute path, `..`,
    empty or over-long part); what only the disk knows is a link that resolves outside."""
    target = base / file_path
    try:
        inside = root.resolve() in target.resolve().parents
    except (OSError, RuntimeError, ValueError):
        inside = False
    if not inside:
        raise Refusal(f"'{file_path}' resolves outside --out ({target.resolve()}); results stay inside --out",
                      path=path, stage="run")
    return target


def clean_stale(out: Path) -> None:
    """Staging folders a killed run left beside --out (`.NAME.partial-*`) are never results: removed here."""
    for old in out.parent.glob(f".{out.name}.partial-*"):
        if old.is_dir() and not old.is_symlink():
            try:
                pid = int(old.name.rsplit("-pid", 1)[1].split("-")[0])
            except (IndexError, ValueError):
                pid = None
            if pid is not None and pid != os.getpid() and alive(pid):
                continue  # another run is writing it
            shutil.rmtree(old, ignore_errors=True)


def alive(pid: int) -> bool:
    """Whether a process with this id exists (a staging folder's writer)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def progress(total: int, show: bool, what: str):
    """A tqdm bar on stderr when it is a terminal and the run is not --quiet; otherwise nothing."""
    if not show or total <= 1 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=what, unit="pass", leave=False, file=sys.stderr)


class Folder:
    """A run's results folder: written in a staging folder beside `out`, moved into place by `commit`.

    Used as a context manager: leaving it by an exception (a refusal, an interrupt) removes the
    staging folder, so a refused or interrupted run leaves no result folder behind. A staging
    folder that a killed run left (`.<out>.partial-*`) is removed by the next run beside it.
    """

    def __init__(self, out: Path, replace: bool = False):
        out = Path(out)
        if (out.exists() or out.is_symlink()) and not replace:
            raise Refusal(f"--out {out} already exists; choose a new folder or say --replace", stage="run")
        if out.is_symlink() or (out.exists() and not out.is_dir()):
            raise Refusal(f"--out {out} is a link or a file, not a results folder; choose a new folder", stage="run")
        out.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(out)
        self.out = out
        self.staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-pid{os.getpid()}-", dir=out.parent))
        self.written: list[str] = []

    def __enter__(self) -> "Folder":
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is not None:
            shutil.rmtree(self.staging, ignore_errors=True)

    def confine(self, relative: str, path: str) -> Path:
        """Where `relative` lands in the folder, refused (at `path`) if a link takes it outside."""
        return confined(self.staging, relative, path, self.staging)

    def write(self, relative: str, obj: Any, path: str = "", at: Optional[int] = None) -> None:
        """Write one JSON file; `at` puts it at that place in the list of written files."""
        dump(self.confine(relative, path), obj)
        self.written.insert(len(self.written) if at is None else at, relative)

    def write_bytes(self, relative: str, data: bytes, path: str = "") -> None:
        """Write one binary file (a .safetensors bundle or tensor) into the folder."""
        target = self.confine(relative, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        self.written.append(relative)

    def commit(self) -> list[str]:
        """Move the staging folder into place (over the old folder with --replace); the written paths."""
        try:
            if self.out.exists():
                shutil.rmtree(self.out)
            os.replace(self.staging, self.out)
        except BaseException:
            shutil.rmtree(self.staging, ignore_errors=True)
            raise
        return [str(self.out / w) for w in self.written]
