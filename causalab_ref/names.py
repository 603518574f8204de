"""Names that become paths: a save's file_path and a sweep point's folder stay inside --out.

A document's names end up as file and folder names under --out (and as parts of dotted
paths). What such a name may be is decided here, once, for validation and sweep lowering
(SPEC.md §4 Runs, R12).
"""
from __future__ import annotations

from .shapes import Refusal


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
