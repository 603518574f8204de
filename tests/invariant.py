"""The fuzz invariant, one rule in one place: what no call may do, whatever its input (SPEC.md §7).

tests/fuzzing.py's `check` (documents and tables, bench/fuzz.py) and tests/fuzz_surfaces.py (every other
surface, bench/fuzz_surfaces.py) both judge a call by `violations`:

* no `internal error` or traceback (and no SystemExit that is not a status);
* no metric-table row under a successful run's --out that is eligible with a non-finite or null value;
* no file of a watched folder (a sentinel, the cwd, the corpus, the documents, an exported folder) written,
  truncated, removed or added, but the call's own --out (a run's, plot's figure, `fixtures export DIR`) and
  the staging and lock names beside it; a refused call leaves its --out itself as it was too;
* no call past its time bound.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import stat
from typing import Callable, Optional

BOUND = 60.0  # seconds one call may take (a --timeout'd fake sleeps at most a few seconds)


def _entry(path: pathlib.Path) -> tuple:
    info = path.lstat()
    if stat.S_ISREG(info.st_mode):
        return ("file", info.st_size, hashlib.sha256(path.read_bytes()).hexdigest())
    if stat.S_ISLNK(info.st_mode):
        return ("link", os.readlink(path), "")
    return ("dir", 0, "")


def snapshot(folder: pathlib.Path, skip: Callable[[pathlib.Path], bool] = lambda p: False,
             deep: bool = True) -> dict:
    """{path: (kind, size, digest)} of everything under `folder` (links not followed); with `deep` false,
    only its own entries (a cwd that is the repository)."""
    seen: dict = {}
    if not folder.is_dir() or folder.is_symlink():
        return seen
    for path in sorted(folder.rglob("*") if deep else folder.iterdir()):
        if not skip(path):
            seen[str(path)] = _entry(path)
    return seen


def _non_finite(value) -> bool:
    """None or a non-finite float, anywhere in a value (a top_k row's value is a list of [token, probability])."""
    if isinstance(value, list):
        return any(_non_finite(v) for v in value)
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def bad_rows(out: pathlib.Path) -> list[str]:
    """Metric-table rows under `out` that are eligible with a non-finite or null value."""
    found: list[str] = []
    try:
        if not out.is_dir() or out.is_symlink():
            return found
        tables = sorted(out.rglob("*.json"))
    except OSError:  # a name the file system will not take: nothing was written there
        return found
    for table in tables:
        if table.name in ("document.json", "run.json", "manifest.json") or table.is_symlink():
            continue
        try:
            rows = json.loads(table.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict) and row.get("eligible") is True and "value" in row and _non_finite(row["value"]):
                found.append(f"{table}: {row.get('example_id')}: value {row['value']!r} eligible")
    return found


def out_of(argv: list[str]) -> Optional[pathlib.Path]:
    """The one place a call may write: a run's or plot's --out (plot's default figure beside its folder, FG6),
    `fixtures export DIR`'s DIR; None for a verb that writes nothing."""
    if argv[:2] == ["fixtures", "export"] and len(argv) > 2:
        return pathlib.Path(argv[2])
    if argv[0] == "plot" and not any(word.startswith("--out") for word in argv):
        return pathlib.Path(f"{argv[1]}.png")
    if argv[0] not in ("run", "plot"):
        return None
    for i, word in enumerate(argv):
        if word == "--out" and i + 1 < len(argv):
            return pathlib.Path(argv[i + 1])
        if word.startswith("--out="):
            return pathlib.Path(word[len("--out="):])
    return None


def allowed(out: Optional[pathlib.Path], cwd: pathlib.Path, done: bool = True) -> Callable[[pathlib.Path], bool]:
    """True for a path a call may write: its --out (when it ended with status 0), and the staging and lock
    names beside it."""
    if out is None or str(out) in ("", ".", "..", "/"):
        return lambda p: False
    full = out if out.is_absolute() else cwd / out
    parent, name = full.parent, full.name

    def own(path: pathlib.Path) -> bool:
        return ((done and (path == full or full in path.parents))
                or (path.parent == parent and path.name.startswith(f".{name}.")))
    return own


def violations(argv: list[str], status: int, text: str, seconds: float, snapshots: tuple[dict, dict],
               cwd: pathlib.Path) -> list[str]:
    """What one call broke of the invariant; `snapshots` is the watched folders (before, after) the call."""
    found = []
    if "internal error" in text or "Traceback" in text or status == -1:
        found.append(f"internal error (status {status}): {text.strip().splitlines()[-1:] if text.strip() else ''}")
    out = out_of(argv)
    if out is not None and status == 0:  # a refused run leaves --out as it was
        found += bad_rows(out if out.is_absolute() else cwd / out)
    own = allowed(out, cwd, status == 0)
    before, after = snapshots
    changed = [p for p in sorted(set(before) | set(after)) if before.get(p) != after.get(p) and not own(pathlib.Path(p))]
    if changed:
        found.append(f"changed outside --out: {changed[:5]}")
    if seconds > BOUND:
        found.append(f"took {seconds:.0f} s (bound {BOUND:.0f} s)")
    return found
