"""Catalogue: the refusal catalogue's line format and its templates (SPEC.md §13, C13-C15).

A catalogue line is `<stage> | <path template> | <message template> | <source>`; a template's
`<placeholder>`s stand for text the document or the model decides and every other word is fixed.
`matches(template, text)` is how a conformance case judges a refusal: the fixed words in order,
each placeholder covering any text. `entries(spec_text)` reads the catalogue out of SPEC.md's
text (the corpus runner needs it only to record a case; checking one needs only the case).

A path template is dotted segments: a literal, a `<name>` standing for exactly one segment, or a
form of FORMS standing for the paths it lists (`<site>` is `sites.<s>`; `<pos>` a read's or a write's
`pos`), `<swept>` and `<the value>` for any path. `path_fits(entry, path)` expands the forms and
matches strictly, a protocol document's path as its plan-shaped one re-pathed (PR17); `forms(spec_text)`
reads SPEC.md §13's list of the forms, which FORMS must equal (SPEC.md C21).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

HEADING = "## 13. Refusal catalogue"
PLACEHOLDER = re.compile(r"<[A-Za-z][A-Za-z0-9_|.\- ]*>")
NO_PATH = "-"
ANY = None  # a form that stands for any path
#: what each path form stands for (SPEC.md §13): the path templates it is, or ANY
FORMS: dict[str, Optional[tuple[str, ...]]] = {
    "<site>": ("sites.<s>",),
    "<featurizer>": ("featurizers.<f>",),
    "<intervention>": ("interventions.<i>",),
    "<read>": ("<intervention>.reads.<r>",),
    "<write>": ("<intervention>.writes.<w>",),
    "<read or write>": ("<read>", "<write>"),
    "<pos>": ("<read or write>.pos",),
    "<model>": ("<intervention>.models.<m>",),
    "<metric>": ("<intervention>.metrics.<m>",),
    "<rows>": ("steps.<step>.rows", "steps.<step>.eval.rows"),
    "<dataset ref>": ("<rows>.<role>", "ref"),
    "<saves>": ("steps.<step>.saves", "steps.<step>.eval.saves"),
    "<save>": ("<saves>.<k>",),
    "<output>": ("steps.<step>.outputs.<name>",),
    "<swept>": ANY,
    "<the value>": ANY,
}
_ANY_MARK = "<*>"
_FORM_LINE = re.compile(r"^- `(<[^`]+>)`: (.*)$")


@dataclass(frozen=True)
class Entry:
    stage: str
    path: str
    message: str
    source: str
    line: int


def entries(spec_text: str) -> list[Entry]:
    """The catalogue's lines: the fenced block(s) under the catalogue heading of SPEC.md."""
    lines = spec_text.splitlines()
    start = next((k for k, line in enumerate(lines) if line.startswith(HEADING)), None)
    if start is None:
        return []
    out, fenced = [], False
    for number, line in enumerate(lines[start + 1:], start=start + 2):
        if line.startswith("## "):
            break
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced and line.strip():
            parts = [p.strip() for p in line.split(" | ")]
            if len(parts) != 4:
                raise ValueError(f"SPEC.md line {number}: a catalogue line is `stage | path | message | source`")
            out.append(Entry(parts[0], parts[1], parts[2], parts[3], line=number))
    return out


def regex(template: str) -> re.Pattern:
    """Fixed words exact, each `<placeholder>` any text (possibly empty)."""
    return re.compile("(?s)" + ".*?".join(re.escape(p) for p in PLACEHOLDER.split(template)))


def matches(template: str, text: str) -> bool:
    return regex(template).fullmatch(text) is not None


def fixed_length(template: str) -> int:
    return len(PLACEHOLDER.sub("", template))


def split_line(line: str) -> dict:
    """A refusal line `<stage>: <path>: <message>` as {stage, path, message}; a path has no spaces,
    so a line whose second part has one carries no path."""
    stage, _, rest = line.partition(": ")
    head, sep, tail = rest.partition(": ")
    if sep and head and " " not in head:
        return {"stage": stage, "path": head, "message": tail}
    return {"stage": stage, "path": "", "message": rest}


def forms(spec_text: str) -> dict[str, Optional[tuple[str, ...]]]:
    """SPEC.md §13's list of path forms: `- `<form>`: `t1` or `t2` — prose`, or `any path — prose`."""
    lines = spec_text.splitlines()
    start = next((k for k, line in enumerate(lines) if line.startswith(HEADING)), len(lines))
    out: dict[str, Optional[tuple[str, ...]]] = {}
    for line in lines[start + 1:]:
        if line.startswith(("## ", "```")):
            break
        found = _FORM_LINE.match(line)
        if found:
            head = found.group(2).split(" — ", 1)[0]
            out[found.group(1)] = ANY if head.startswith("any path") else tuple(re.findall(r"`([^`]+)`", head))
    return out


def expanded(template: str) -> list[str]:
    """The template with every form replaced by each path it stands for (ANY as `<*>`), recursively."""
    for form, paths in FORMS.items():
        if form in template:
            if paths is ANY:
                return expanded(template.replace(form, _ANY_MARK))
            return [t for p in paths for t in expanded(template.replace(form, p, 1))]
    return [template]


def strict(template: str) -> re.Pattern:
    """An expanded template as a pattern: a `<name>` one segment (no dot), `<*>` any path, the rest literal."""
    pieces = re.split(r"(<\*>|" + PLACEHOLDER.pattern + ")", template)
    return re.compile("".join(".+" if p == _ANY_MARK else "[^.]+" if PLACEHOLDER.fullmatch(p) else re.escape(p)
                              for p in pieces))


def path_fits(entry: Entry, path: str) -> bool:
    """The entry's path template fits `path` strictly (each form expanded, each `<name>` one segment), as
    written or as a protocol document's refusal names it (the lowered document's path re-pathed, PR17)."""
    from ..documents.protocol import INTERVENTION, STEP, protocol_path
    template = "" if entry.path == NO_PATH else entry.path
    for plain in expanded(template):
        lowered = plain.replace("interventions.<i>", f"interventions.{INTERVENTION}").replace(
            "steps.<step>", f"steps.{STEP}")
        if strict(plain).fullmatch(path) or strict(protocol_path(lowered)).fullmatch(path):
            return True
    return False


def entry_for(refusal: dict, catalogue: list[Entry]) -> Optional[Entry]:
    """The most specific entry stating this refusal's stage, path and message."""
    fits = [e for e in catalogue if e.stage == refusal["stage"] and matches(e.message, refusal["message"])
            and path_fits(e, refusal["path"])]
    return max(fits, key=lambda e: (fixed_length(e.message), fixed_length(e.path)), default=None)
