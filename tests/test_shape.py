"""The shape of the code, checked from the AST (SPEC.md:1935 [E7]): modules import each other without cycles, no module imports another's private
name, no function is longer than a reader can hold, and resolve.py stays runnable where a remote
model is (stdlib, torch and shapes.py only)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # the edit-test loop's subset: `pytest -m fast` (README)

PACKAGE = Path(__file__).resolve().parents[1] / "causalab_ref"
LONGEST = 50
MOST_PARAMETERS = 6
LONGEST_MODULE = 600


def _dotted(path: Path) -> str:
    """A module's name under the package: `runs.compile`, `shapes`, `documents` (a package's __init__)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"


def _modules() -> dict[str, ast.Module]:
    return {_dotted(p): ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def _packages() -> set[str]:
    return {_dotted(p) for p in PACKAGE.rglob("__init__.py")} - {"__init__"}


def _imports(name: str, tree: ast.Module) -> list[tuple[str, list[str]]]:
    """(module of the package, names taken from it) for every import in the module, at any depth, with
    relative imports resolved (`from ..runs import compile` in documents.validate is runs.compile)."""
    here = name.split(".")[:-1] if name not in _packages() else name.split(".")
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
            prefix = ".".join(base + ([node.module] if node.module else []))
            out += _targets(prefix, node)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "causalab_ref":
            out += _targets(node.module.removeprefix("causalab_ref").lstrip("."), node)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("causalab_ref."):
                    out.append((a.name.removeprefix("causalab_ref."), []))
    return out


def _targets(prefix: str, node: ast.ImportFrom) -> list[tuple[str, list[str]]]:
    """`from prefix import a, b`: the modules among a, b when prefix is a package, else prefix itself."""
    modules = set(_modules_cached())
    subs = [(f"{prefix}.{a.name}" if prefix else a.name) for a in node.names]
    if all(sub in modules for sub in subs):
        return [(sub, []) for sub in subs]
    return [(prefix, [a.name for a in node.names])]


_CACHE: dict[str, ast.Module] = {}


def _modules_cached() -> dict[str, ast.Module]:
    if not _CACHE:
        _CACHE.update(_modules())
    return _CACHE


def _graph() -> dict[str, set[str]]:
    mods = _modules_cached()
    return {name: {m for m, _ in _imports(name, tree) if m in mods and m != name} for name, tree in mods.items()}


def _package_graph() -> dict[str, set[str]]:
    """The import graph between packages (shapes.py and cli.py are their own)."""
    top = {name: name.split(".")[0] for name in _modules_cached()}
    graph: dict[str, set[str]] = {p: set() for p in top.values()}
    for name, targets in _graph().items():
        graph[top[name]] |= {top[t] for t in targets if top[t] != top[name]}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_modules_import_each_other_without_a_cycle():
    """An import cycle means two modules own one thing between them; none may exist."""
    assert _cycle(_graph()) == []


def test_packages_import_each_other_without_a_cycle():
    """The packages are layers: one that imports another is never imported by it, at any distance."""
    assert _cycle(_package_graph()) == []


def test_no_private_name_crosses_a_package():
    """A name starting with '_' may be shared between the modules of one package, never taken by another."""
    crossing = [(name, mod, n) for name, tree in _modules_cached().items() for mod, names in _imports(name, tree)
                for n in names if n.startswith("_") and not n.startswith("__")
                and mod.split(".")[0] != name.split(".")[0]]
    assert crossing == []


def test_no_function_takes_more_than_six_parameters():
    """A pass's state travels in one object: no function takes more than six parameters (self and cls aside)."""
    wide = []
    for name, tree in _modules_cached().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                named = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
                if len(named) > MOST_PARAMETERS:
                    wide.append((f"{name}.{node.name}", len(named)))
    assert wide == []


def test_no_module_is_longer_than_six_hundred_lines():
    """A module a reader can read in one sitting: at most 600 lines."""
    long = {_dotted(p): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > LONGEST_MODULE}
    assert long == {}


def _bound_modules(name: str, tree: ast.Module) -> dict[str, str]:
    """{the name an import binds in the module: the package's module it names} (`from ..runs import compile as
    c` binds `c` to runs.compile; `import causalab_ref.runs.plan` binds nothing usable by one name)."""
    modules, bound = set(_modules_cached()), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for (mod, names), alias in zip(_imports(name, ast.Module(body=[node], type_ignores=[])), node.names):
                if mod in modules and not names:
                    bound[alias.asname or alias.name] = mod
        elif isinstance(node, ast.Import):
            for alias in node.names:
                mod = alias.name.removeprefix("causalab_ref.")
                if alias.asname and mod in modules:
                    bound[alias.asname] = mod
    return bound


def _private_uses(name: str, tree: ast.Module) -> list[tuple]:
    """Every private name (`_x`, not `__x__`) the module takes from another: imported by name, or read as an
    attribute of a module it bound by import."""
    uses = [(name, mod, n) for mod, names in _imports(name, tree) for n in names
            if n.startswith("_") and not n.startswith("__")]
    bound = _bound_modules(name, tree)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and bound[node.value.id] != name and node.attr.startswith("_") and not node.attr.startswith("__")):
            uses.append((name, bound[node.value.id], node.attr, node.lineno))
    return uses


def test_no_module_imports_another_modules_private_name():
    """A name starting with '_' belongs to its module; another module that needs it needs it public."""
    assert [use for name, tree in _modules_cached().items() for use in _private_uses(name, tree)] == []


def test_the_private_name_check_sees_a_planted_use():
    """The check can fail: `from ..runs import compile as c` then `c._tap`, `from ..runs.plan import _x`, and
    `from ..runs import compile` then `compile._y`, planted in documents.validate, are each reported."""
    planted = ast.parse("from ..runs import compile as c\nfrom ..runs.plan import _x\n"
                        "from ..runs import compile\nc._tap\ncompile._y\n")
    found = sorted((mod, n) for _name, mod, n, *_line in _private_uses("documents.validate", planted))
    assert found == [("runs.compile", "_tap"), ("runs.compile", "_y"), ("runs.plan", "_x")]


def test_no_function_is_longer_than_fifty_lines():
    """A function a reader can hold in their head: at most 50 lines, decorators and docstring included."""
    long = []
    for name, tree in _modules_cached().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                length = node.end_lineno - first + 1
                if length > LONGEST:
                    long.append((f"{name}.{node.name}", length))
    assert long == []


def test_resolve_imports_only_the_standard_library_torch_and_shapes():
    """resolve.py must run where a remote model is: stdlib, torch and shapes.py only."""
    tree = _modules_cached()["positions.resolve"]
    outside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            outside |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                outside |= {(node.module or "").split(".")[-1]} if node.module else {a.name for a in node.names}
            elif node.module == "causalab_ref":
                outside |= {a.name for a in node.names}
            elif node.module:
                outside.add(node.module.split(".")[0])
    allowed = set(sys.stdlib_module_names) | {"torch", "shapes", "__future__"}
    assert outside - allowed == set()


def _header_modules() -> dict[str, list[str]]:
    """{module: [the SPEC.md section headers naming it]}: a header's `pkg/:` names that package's modules
    up to the next `;`, `top level:` the package's own top-level modules."""
    import re

    named: dict[str, list[str]] = {}
    for line in (PACKAGE.parent / "SPEC.md").read_text(encoding="utf-8").splitlines():
        if not line.startswith("## ") or "(" not in line:
            continue
        for part in line[line.index("(") + 1:].split(";"):
            m = re.match(r"\s*(\w+)/:", part)
            if m or part.strip().startswith("top level:"):
                for module in re.findall(r"(\w+)\.py", part):
                    named.setdefault(f"{m.group(1)}.{module}" if m else module, []).append(line[3:line.index("(")])
    return named


def test_every_module_is_named_by_exactly_one_spec_section_header():
    """SPEC.md's section headers are the map of the house: each module of the package is named by one of them
    (`## 4. Runs (runs/: compile.py, ...)`), and no header names a module that is not there."""
    named = _header_modules()
    modules = {m for m in _modules_cached() if m not in _packages() and m not in ("__init__", "__main__")}
    assert sorted(m for m in modules if len(named.get(m, [])) != 1) == []
    assert sorted(set(named) - modules) == []
