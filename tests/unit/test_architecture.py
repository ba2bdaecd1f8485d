"""The import structure: no module imports itself back through others, and no two parts depend on each other.

The graph has an edge a -> b when module a imports module b anywhere in its text (top level or inside a
function: a deferred import is still a dependency). A *cycle* is a strongly connected component of more than
one module. A *part* is a top-level package or module of `app` (`app.api`, `app.cli`, ...), and inside
`app.evaluation` each subpackage (`app.evaluation.golden`, `app.evaluation.report`, ...); two parts are in a
cycle when each imports the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"


def module_graph(root: Path = APP) -> dict[str, set[str]]:
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names[name] = path
    graph: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in names:
                        graph[name].add(full)
                    elif node.module in names:
                        graph[name].add(node.module)
        graph[name].discard(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
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


def part(module: str) -> str:
    pieces = module.split(".")
    depth = 3 if pieces[:2] == ["app", "evaluation"] and len(pieces) > 2 else 2
    return ".".join(pieces[:depth])


def part_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    parts: dict[str, set[str]] = {}
    for module, imported in graph.items():
        parts.setdefault(part(module), set())
        for other in imported:
            if part(other) != part(module):
                parts[part(module)].add(part(other))
    return parts


def test_cycles_finds_a_cycle_and_ignores_a_chain() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_part_is_the_top_level_package_or_an_evaluation_subpackage() -> None:
    assert part("app.api.routes") == "app.api"
    assert part("app.cli") == "app.cli"
    assert part("app.evaluation.report.model") == "app.evaluation.report"
    assert part("app.evaluation.session") == "app.evaluation.session"


def test_no_module_import_cycle() -> None:
    assert cycles(module_graph()) == []


def test_no_two_parts_import_each_other() -> None:
    assert cycles(part_graph(module_graph())) == []
