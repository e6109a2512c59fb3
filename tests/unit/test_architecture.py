"""The product code has no import circles (issue 16, item 5).

Every import statement of every module in ``jupyter_trainfactory/`` and ``ray_backend/``
counts: those at module level and those inside functions alike (a function-level import
is how a circle hides: ``jobs`` -> ``dashboard`` -> ``jobs`` ran only when the function
ran). Imports under ``if TYPE_CHECKING:`` do not count (they never run). An import of
``a.b`` is an edge to ``a.b`` alone (the parent packages it implies are not counted);
``from a import b`` is an edge to ``a.b`` when that is a module, else to ``a``.

The imports are read with :mod:`ast`, nothing is imported: the test takes well under a
second.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("jupyter_trainfactory", "ray_backend")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the product packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "labextension" not in path.parts:
                found[_module_name(path)] = path
    return found


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, at any depth, except under TYPE_CHECKING."""
    found = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if _is_type_checking(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


def _targets(name: str, path: Path, node: ast.AST, known: set[str]) -> set[str]:
    """The product modules one import statement of module ``name`` (file ``path``) loads."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    if node.level:  # relative: from the module's package, up ``level - 1`` more
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    targets = set()
    for alias in node.names:
        if f"{base}.{alias.name}" in known:
            targets.add(f"{base}.{alias.name}")
        elif base in known:
            targets.add(base)
    return targets


def import_graph() -> dict[str, set[str]]:
    """Module -> the product modules it imports (see the module docstring for what counts)."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: set[str] = set()
        for node in _imports(tree):
            edges |= _targets(name, path, node, known)
        graph[name] = edges - {name}
    return graph


def components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted:
    the modules that reach each other through imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles, ``[a, b, ..., a]``: for every module of a component, the
    shortest circle through it (each circle once, starting at its smallest name)."""
    found: set[tuple[str, ...]] = set()
    for component in components(graph):
        for start in component:
            circle = _shortest_circle(graph, start, set(component))
            i = circle.index(min(circle[:-1]))
            found.add(tuple(circle[i:-1] + circle[:i] + [circle[i]]))
    return sorted(list(c) for c in found)


def _shortest_circle(graph: dict[str, set[str]], start: str, inside: set[str]) -> list[str]:
    """The shortest import path from ``start`` back to itself within ``inside``."""
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & inside):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    raise AssertionError(f"{start} is in a component but on no circle")


def test_no_import_circles():
    found = circles(import_graph())
    if found:
        pytest.fail("import circles:\n" + "\n".join(" -> ".join(c) for c in found), False)


def test_the_check_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert components(graph) == [["a", "b", "c"]]
    assert circles(graph) == [["a", "b", "c", "a"]]
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"b"}}
    assert circles(graph) == [["a", "b", "a"], ["b", "c", "b"]]
