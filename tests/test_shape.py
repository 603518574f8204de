"""The shape of the code, checked from the AST (SPEC.md:379 [E7]): modules import each other without cycles, no module imports another's private
name, no function is longer than a reader can hold, and locate.py stays runnable where a remote
model is (stdlib, torch and shapes.py only)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "causalab_ref"
LONGEST = 50


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for p in sorted(PACKAGE.glob("*.py"))}


def _imports(name: str, tree: ast.Module) -> list[tuple[str, list[str]]]:
    """(module of the package, names taken from it) for every import in the module, at any depth."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.append((node.module.split(".")[0], [a.name for a in node.names]))
            else:  # from . import a, b
                out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("causalab_ref"):
            parts = node.module.split(".")
            if len(parts) > 1:
                out.append((parts[1], [a.name for a in node.names]))
            else:
                out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "causalab_ref" and len(parts) > 1:
                    out.append((parts[1], []))
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: {m for m, _ in _imports(name, tree) if m in mods and m != name} for name, tree in mods.items()}


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


def test_no_module_imports_another_modules_private_name():
    """A name starting with '_' belongs to its module; another module that needs it needs it public."""
    private = [(name, mod, n) for name, tree in _modules().items() for mod, names in _imports(name, tree)
               for n in names if n.startswith("_") and not n.startswith("__")]
    attribute = []
    for name, tree in _modules().items():
        imported = {mod for mod, _ in _imports(name, tree)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in imported
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                attribute.append((name, node.value.id, node.attr, node.lineno))
    assert private == [] and attribute == []


def test_no_function_is_longer_than_fifty_lines():
    """A function a reader can hold in their head: at most 50 lines, decorators and docstring included."""
    long = []
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                length = node.end_lineno - first + 1
                if length > LONGEST:
                    long.append((f"{name}.{node.name}", length))
    assert long == []


def test_locate_imports_only_the_standard_library_torch_and_shapes():
    """locate.py must run where a remote model is: stdlib, torch and shapes.py only."""
    tree = _modules()["locate"]
    outside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            outside |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                outside |= {node.module or a.name for a in node.names} if node.module else {a.name for a in node.names}
            elif node.module == "causalab_ref":
                outside |= {a.name for a in node.names}
            elif node.module:
                outside.add(node.module.split(".")[0])
    allowed = set(sys.stdlib_module_names) | {"torch", "shapes", "__future__"}
    assert outside - allowed == set()
