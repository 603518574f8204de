"""Names that become paths: a save's file_path and a sweep point's folder stay inside --out.

A document's names end up as file and folder names under --out (and as parts of dotted
paths). What such a name may be is decided here, once, for validation and sweep lowering
(SPEC.md §4 Runs, R12).
"""
from __future__ import annotations

from ..shapes import Refusal


def inside_out(name: str, path: str, what: str, folder: bool = False) -> None:
    """A name that becomes a path under --out stays there: no absolute path, no `..` or `.`,
    no empty part, no NUL, each part a file name (at most 255 bytes); a sweep point's
    folder is one name, so it has no separator at all (SPEC.md R12)."""
    parts = name.replace("\\", "/").split("/")
    if (not name or name.startswith("/") or "\x00" in name or any(p in ("", ".", "..") for p in parts)
            or (folder and len(parts) > 1)
            or any(len(p.encode("utf-8", "surrogatepass")) > 255 for p in parts)
            or any(0xD800 <= ord(c) <= 0xDFFF for c in name)):
        raise Refusal(f"{what} '{name[:200]}' would leave --out or is not a file name: an absolute path, '..', "
                      "a separator in a folder name, an empty part and a part over 255 bytes are refused; results "
                      "stay inside --out", path=path, stage="validation")


def one_segment(name: str, path: str) -> None:
    """A declared name (role, site, intervention, read, write, model, metric, step, featurizer) is one
    segment of a file path (`<step>/<intervention>`, `<intervention>/<metric>`) and of a dotted document
    path: not empty, at most 255 bytes, no '/', '\\', '.' and no control character (SPEC.md S43)."""
    bad = (not name or len(name.encode("utf-8", "surrogatepass")) > 255
           or any(c in "/\\." or ord(c) < 0x20 or ord(c) == 0x7F for c in name))
    if bad:
        raise Refusal(f"name '{name[:200]}' cannot be one path segment: names become parts of file paths "
                      "('<step>/<intervention>', '<intervention>/<metric>') and of dotted paths, so a name is "
                      "not empty, at most 255 bytes, and has no '/', '\\', '.' or control character; rename it "
                      "(letters, digits, '_' and '-' are always safe)", path=path, stage="validation")


def colliding(file_paths: list[str]) -> tuple[int, str] | None:
    """The first save (its index, and the earlier path it collides with) whose path is a folder of an
    earlier one or has an earlier one as a folder: `a.json` and `a.json/b.json` cannot both be written;
    document.json and run.json are written at the root (SPEC.md S44)."""
    taken = ["document.json", "run.json"]
    for k, file_path in enumerate(file_paths):
        parts = file_path.replace("\\", "/").split("/")
        for other in taken:
            theirs = other.replace("\\", "/").split("/")
            n = min(len(parts), len(theirs))
            if parts != theirs and parts[:n] == theirs[:n]:
                return k, other
        taken.append(file_path)
    return None
