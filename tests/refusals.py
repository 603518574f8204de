"""The refusal catalogue (SPEC.md §13) and the refusals the package's code raises.

A catalogue entry is one line of the fenced block under SPEC.md's "Refusal catalogue" heading:

    <stage> | <path template> | <message template> | <source>

with placeholders written `<name>`. A template matches a refusal when its fixed words stand
in order and each placeholder covers any text (catalogue.matches). The code side is read from
the package's source (`code_sites`): every call of `Refusal(...)`, or of a function that passes
its own parameter on to `Refusal` (`_fail`, `_refuse`, ...), with its message rendered so that
every interpolated value is a hole. A site is catalogued when some entry has its stage and the
site's fixed words, in order, with the entry's text in the holes (`covers`).

`python tests/refusals.py` lists the sites that have no entry, each with a suggested line to
paste into the catalogue (fix the placeholder names and the path, then keep it).
"""
from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from causalab_ref.conformance import catalogue as catalogue_format

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDER = catalogue_format.PLACEHOLDER
HOLE = "\x00"
Entry = catalogue_format.Entry


@dataclass(frozen=True)
class Site:
    file: str
    line: int
    stage: Optional[str]
    path: Optional[str]  # rendered with holes; None when the code passes a variable
    message: Optional[str]  # rendered with holes; None when it cannot be read statically


def catalogue(spec: Path = ROOT / "SPEC.md") -> list[Entry]:
    return catalogue_format.entries(spec.read_text(encoding="utf-8"))


def _code_regex(rendered: str) -> re.Pattern:
    return re.compile("(?s)" + ".*".join(re.escape(p) for p in rendered.split(HOLE)))


def covers(entry: Entry, site: Site) -> bool:
    """The entry states the site's stage and every fixed word of its message (and path, when known)."""
    if site.message is None or (site.stage is not None and site.stage != entry.stage):
        return False
    if not _fits(site.message, entry.message):
        return False
    if site.path is None:
        return True
    template = "" if entry.path == catalogue_format.NO_PATH else entry.path
    # a path template may be more general than the code (`<where>` for any path) or more specific
    return _fits(site.path, template) or bool(catalogue_format.regex(template).fullmatch(site.path))


def _fits(rendered: str, template: str) -> bool:
    """The code's fixed words stand in the template, in order, the holes covering the rest (a template's
    `<...>` counts as a hole, or as its own letters where the code writes them, as in `<dir>/<table>`)."""
    code = _code_regex(rendered)
    return bool(code.fullmatch(PLACEHOLDER.sub(HOLE, template)) or code.fullmatch(template))


# ---------------------------------------------------------------- reading the code


def _render(node: ast.AST, constants: dict[str, str], local: dict[str, ast.AST]) -> Optional[str]:
    """A string expression with every interpolated value as HOLE, or None when it is not static."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _render(node.left, constants, local), _render(node.right, constants, local)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Name):
        if node.id in local:
            return _render(local[node.id], constants, {})
        return constants.get(node.id)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and isinstance(node.slice, ast.Constant):
        return constants.get(f"{node.value.id}[{node.slice.value!r}]")  # a message table's entry
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id + "()" in constants:
        return constants[node.func.id + "()"]  # a helper that returns the message
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        base = _render(node.func.value, constants, local)
        if base is not None and node.func.attr == "format":
            return re.sub(r"\{[^{}]*\}", HOLE, base)
        if base is not None and node.func.attr == "join":
            return HOLE
    return None


def _wrappers(tree: ast.Module) -> dict[str, tuple[int, int, Optional[str], Optional[int]]]:
    """{function name: (message param index, path param index, fixed stage, stage param index)} for
    the functions that hand a parameter of theirs to Refusal as its message."""
    out = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = [a.arg for a in fn.args.args]
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and _called(call) == "Refusal" and call.args):
                continue
            msg = call.args[0]
            if not (isinstance(msg, ast.Name) and msg.id in params):
                continue
            kw = {k.arg: k.value for k in call.keywords}
            path = kw.get("path")
            stage = kw.get("stage")
            out[fn.name] = (params.index(msg.id),
                            params.index(path.id) if isinstance(path, ast.Name) and path.id in params else -1,
                            stage.value if isinstance(stage, ast.Constant) else None,
                            params.index(stage.id) if isinstance(stage, ast.Name) and stage.id in params else None)
    return out


def _called(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else (f.attr if isinstance(f, ast.Attribute) else "")


def _stage_default(tree: ast.Module, name: str) -> Optional[str]:
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == name:
            defaults = dict(zip([a.arg for a in fn.args.args][-len(fn.args.defaults):], fn.args.defaults)) \
                if fn.args.defaults else {}
            value = defaults.get("stage")
            return value.value if isinstance(value, ast.Constant) else None
    return None


def _locals(fn: ast.AST) -> dict[str, ast.AST]:
    """Names assigned exactly once in a function (a message built before it is raised)."""
    seen: dict[str, list] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            seen.setdefault(node.targets[0].id, []).append(node.value)
    return {k: v[0] for k, v in seen.items() if len(v) == 1}


def _sites_in(file: Path) -> list[Site]:
    tree = ast.parse(file.read_text(encoding="utf-8"))
    constants: dict[str, str] = {}
    tables: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            text = _render(node.value, {}, {})
            if text is not None:
                constants[node.targets[0].id] = text
            if isinstance(node.value, ast.Dict):  # a table of messages: each entry, and the table as a whole
                table = {k.value: _render(v, {}, {}) for k, v in zip(node.value.keys, node.value.values)
                         if isinstance(k, ast.Constant)}
                constants.update({f"{node.targets[0].id}[{k!r}]": v for k, v in table.items() if v is not None})
                tables[node.targets[0].id] = [v for v in table.values() if v is not None]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.body and isinstance(node.body[-1], ast.Return):
            text = _render(node.body[-1].value, constants, _locals(node)) if node.body[-1].value else None
            if text is not None:
                constants[node.name + "()"] = text
    wrappers = _wrappers(tree)
    sites = []
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    owner, inner = {}, {}
    for fn in functions:  # ast.walk meets an outer function before the functions nested in it
        for node in ast.walk(fn):
            owner.setdefault(id(node), fn)  # the outermost: nested functions share its locals
            inner[id(node)] = fn  # the innermost: a wrapper's own Refusal is not a site
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        name = _called(call)
        fn = owner.get(id(call))
        local = _locals(fn) if fn is not None else {}
        if name == "Refusal" and call.args:
            if id(call) in inner and inner[id(call)].name in wrappers:
                continue
            if isinstance(call.args[0], ast.Attribute) and isinstance(call.args[0].value, ast.Name):
                continue  # relays a caught exception's message (reader.Malformed): its lines are stated by hand
            kw = {k.arg: k.value for k in call.keywords}
            stage = kw.get("stage")
            path = kw.get("path")
            sites.append(Site(file.name, call.lineno, stage.value if isinstance(stage, ast.Constant) else None,
                              _render(path, constants, local) if path is not None else "",
                              _render(call.args[0], constants, local)))
        elif name in wrappers and isinstance(call.func, ast.Name):
            m, p, stage, stage_at = wrappers[name]
            args = call.args
            kw = {k.arg: k.value for k in call.keywords}
            stage_node = kw.get("stage") or (args[stage_at] if stage_at is not None and len(args) > stage_at else None)
            if stage_node is not None:
                stage = stage_node.value if isinstance(stage_node, ast.Constant) else None
            elif stage is None:
                stage = _stage_default(tree, name)
            path_node = args[p] if 0 <= p < len(args) else kw.get("path")
            path = _render(path_node, constants, local) if path_node is not None else None
            message = args[m] if len(args) > m else None
            if (isinstance(message, ast.Subscript) and isinstance(message.value, ast.Name)
                    and not isinstance(message.slice, ast.Constant) and message.value.id in tables):
                sites += [Site(file.name, call.lineno, stage, path, text) for text in tables[message.value.id]]
                continue
            sites.append(Site(file.name, call.lineno, stage, path,
                              _render(message, constants, local) if message is not None else None))
    return sites


def code_sites(package: Path = ROOT / "causalab_ref") -> list[Site]:
    return [s for file in sorted(package.rglob("*.py")) for s in _sites_in(file)]


def uncatalogued(entries: Optional[list[Entry]] = None) -> list[Site]:
    entries = catalogue() if entries is None else entries
    return [s for s in code_sites() if not any(covers(e, s) for e in entries)]


def stale(entries: Optional[list[Entry]] = None) -> list[Entry]:
    """Catalogue lines that state no refusal the code can raise (left behind when a refusal changed)."""
    entries = catalogue() if entries is None else entries
    sites = code_sites()
    return [e for e in entries if not any(covers(e, s) for s in sites)]


def suggestion(site: Site) -> str:
    """A catalogue line for a site, holes as `<value>`: a start, to be given real names and a path."""
    def named(text: Optional[str], fallback: str) -> str:
        return fallback if text is None else text.replace(HOLE, "<value>")
    return f"{site.stage or '<stage>'} | {named(site.path, '<path>') or '-'} | {named(site.message, '<message>')} | own"


def main() -> int:
    missing = uncatalogued()
    for site in missing:
        print(f"{site.file}:{site.line}: no catalogue entry; suggested line for SPEC.md §13:\n    {suggestion(site)}")
    old = stale()
    for entry in old:
        print(f"SPEC.md line {entry.line}: states no refusal the code raises; remove or correct it")
    print(f"refusals: {len(code_sites())} site(s) in the code, {len(missing)} without a catalogue entry, "
          f"{len(old)} catalogue line(s) stating none")
    return 1 if missing or old else 0


if __name__ == "__main__":
    sys.exit(main())
