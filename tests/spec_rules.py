"""SPEC.md's rules and the tests' citations of them.

A rule is a SPEC.md line `- **<ID>** ...`; a citation is `SPEC.md:<line>[-<line>] [<ID>]` in a
test's docstring (or in the package's own source, which cites rules by id alone, `SPEC.md R4`, and
may not cite a line without its rule). `python tests/spec_rules.py --fix` rewrites every citation's
line number to where its rule now stands (run it after editing SPEC.md); test_spec.py fails on a
stale one.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RULE = re.compile(r"^- \*\*([A-Z]+\d+)\*\*")
CITATION = re.compile(r"SPEC\.md:(\d+)(?:-(\d+))?(?: \[([A-Z]+\d+)\])?")


def rules() -> dict[str, int]:
    out = {}
    for number, line in enumerate((ROOT / "SPEC.md").read_text(encoding="utf-8").splitlines(), start=1):
        m = RULE.match(line)
        if m:
            out[m.group(1)] = number
    return out


def cited_files() -> list[Path]:
    """The files whose citations are checked: the tests and the package's modules."""
    return sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "causalab_ref").rglob("*.py"))


def _name(file: Path) -> str:
    return str(file.relative_to(ROOT))


def citations() -> list[tuple[str, int, int, int, str]]:
    """(file relative to the repo, line in file, first SPEC line, last SPEC line, rule id or '')."""
    out = []
    for file in cited_files():
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            for m in CITATION.finditer(line):
                first = int(m.group(1))
                last = int(m.group(2) or first)
                out.append((_name(file), number, first, last, m.group(3) or ""))
    return out


PLACEHOLDER = re.compile(r"SPEC\.md:(?!\d)\S*")


def placeholders() -> list[tuple[str, int, str]]:
    """(file, line in file, text) of every `SPEC.md:` not followed by a line number (a citation the
    checker cannot see, such as a section placeholder). This file, which states the syntax, is skipped."""
    out = []
    for file in cited_files():
        if file.name == "spec_rules.py":
            continue
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            out += [(_name(file), number, m.group(0)) for m in PLACEHOLDER.finditer(line)]
    return out


def fix() -> int:
    where = rules()
    changed = 0
    for file in cited_files():
        text = file.read_text(encoding="utf-8")

        def move(m):
            rule = m.group(3)
            if rule and rule in where:
                return f"SPEC.md:{where[rule]} [{rule}]"
            return m.group(0)

        new = CITATION.sub(move, text)
        if new != text:
            file.write_text(new, encoding="utf-8")
            changed += 1
    return changed


if __name__ == "__main__":
    if "--fix" in sys.argv:
        print(f"rewrote citations in {fix()} file(s)")
