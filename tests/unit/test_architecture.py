"""The import structure: imports go down the layers of docs/design.md (Layout), the two adapters do not import
each other, no module imports itself back through others, and no two parts depend on each other.

The graph has an edge a -> b when module a imports module b anywhere in its text (top level, inside a
function or under `if TYPE_CHECKING:`: a deferred import is still a dependency). A *cycle* is a strongly
connected component of more than one module. A *part* is a top-level package or module of `app`
(`app.api`, `app.cli`, ...), and inside `app.evaluation` each subpackage (`app.evaluation.golden`,
`app.evaluation.report`, ...); two parts are in a cycle when each imports the other. The *layers* (`LAYERS`)
order the top-level parts: a module imports only modules of its own top-level part and of the layers below
its own.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
DESIGN = APP.parent / "docs" / "design.md"

# The layers of `app`, top first. A module may import modules of its own top-level part and of the layers
# below; the parts of one layer do not import each other. docs/design.md (Layout) states the same list.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("app.__main__",),  # `python -m app`
    ("app.cli",),  # the `sieve` command
    ("app.main",),  # the HTTP application, which `sieve serve` and `sieve label` start
    ("app.api",),  # its routes, schemas, dependencies and state
    ("app.label_desk",),  # the labelling desk the API and the CLI both serve
    ("app.experiment",),  # `sieve experiment`: variants side by side over the composition root
    ("app.service",),  # the composition root: embedder, store, BM25 index and the one chain
    ("app.evaluation",),
    ("app.retrieve_response",),  # the answer to one retrieval: serving never depends on the evaluation
    ("app.retrieval", "app.ingest"),
    ("app.lexical",),  # the BM25 index, which follows the store's change log
    ("app.store", "app.models"),
    (
        "app.settings",
        "app.exit_codes",
        "app.files",
        "app.jsonl",
        "app.querylog_files",
        "app.pidlock",
        "app.stall",  # the last resort against a frozen interpreter (`sieve serve`)
        "app.records",  # the camelCase records serving and the evaluation both show
        "app.access",  # who may read what: principals, document scopes and the one rule
    ),
)
# The parts of `app.evaluation`, top first, under the same rule: the session wires the parts, the renderers
# read every part's results, the tuning replays runs and compares, a run and a comparison read the golden
# set, the report model and the measures. docs/design.md (Layout) states the same list.
EVALUATION_LAYERS: tuple[tuple[str, ...], ...] = (
    ("app.evaluation.session",),
    ("app.evaluation.render",),
    ("app.evaluation.tune",),
    ("app.evaluation.compare", "app.evaluation.run"),
    ("app.evaluation.golden",),
    ("app.evaluation.report", "app.evaluation.scoring"),
)
# The two adapters, side by side: neither imports the other (the CLI starts the HTTP side through app.main).
ADAPTERS = ("app.cli", "app.api")
# Imports that break a rule today, each with what removes it; a test fails once one is gone, so the list
# only shrinks.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()


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


def top_part(module: str) -> str:
    """The top-level package or module of `app` that `module` is in."""
    return ".".join(module.split(".")[:2])


def layer_violations(
    graph: dict[str, set[str]],
    layers: tuple[tuple[str, ...], ...] = LAYERS,
    part_of: Callable[[str], str] = top_part,
) -> list[tuple[str, str]]:
    """Every edge a -> b between two layered parts (`part_of`) that goes up the layers, or across to another
    part of the same layer, sorted. Modules of no layered part are not checked."""
    depth = {p: i for i, layer in enumerate(layers) for p in layer}
    return sorted(
        (a, b)
        for a, imported in graph.items()
        for b in imported
        if part_of(a) in depth
        and part_of(b) in depth
        and part_of(a) != part_of(b)
        and depth[part_of(b)] <= depth[part_of(a)]
    )


def adapter_imports(
    graph: dict[str, set[str]], adapters: tuple[str, ...] = ADAPTERS
) -> list[tuple[str, str]]:
    """Every edge from one adapter into another, sorted."""
    return sorted(
        (a, b)
        for a, imported in graph.items()
        for b in imported
        if top_part(a) in adapters and top_part(b) in adapters and top_part(a) != top_part(b)
    )


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


def test_layer_violations_are_imports_up_or_across_and_not_down() -> None:
    layers = (("app.top",), ("app.left", "app.right"), ("app.bottom",))
    graph = {
        "app.top.a": {"app.left.b", "app.bottom"},
        "app.left.b": {"app.left.c", "app.bottom", "app.right"},
        "app.left.c": set(),
        "app.right": {"app.top.a"},
        "app.bottom": set(),
    }
    assert layer_violations(graph, layers) == [("app.left.b", "app.right"), ("app.right", "app.top.a")]


def test_adapter_imports_are_the_edges_between_two_adapters() -> None:
    graph = {"app.cli.x": {"app.api.y", "app.service"}, "app.api.y": {"app.service"}, "app.service": set()}
    assert adapter_imports(graph) == [("app.cli.x", "app.api.y")]


def test_every_part_of_app_has_a_layer() -> None:
    placed = {p for layer in LAYERS for p in layer}
    assert {top_part(m) for m in module_graph() if m != "app"} - placed == set()


def test_no_import_goes_up_a_layer_or_across_one() -> None:
    assert [e for e in layer_violations(module_graph()) if e not in KNOWN_EXCEPTIONS] == []


def test_the_cli_and_the_api_do_not_import_each_other() -> None:
    assert [e for e in adapter_imports(module_graph()) if e not in KNOWN_EXCEPTIONS] == []


def design_layers(
    text: str, marker: str = "(top first):", prefix: str = "app."
) -> tuple[tuple[str, ...], ...]:
    """The layers as docs/design.md's Layout states them: the list after `marker` up to the first full stop,
    layers apart by "→", the backquoted names of each outside parentheses, each after `prefix`."""
    listed = text.split(marker, 1)[1].split(". ", 1)[0]
    return tuple(
        tuple(f"{prefix}{name}" for name in re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", layer)))
        for layer in listed.split("→")
    )


def test_design_md_states_the_layers_this_test_checks() -> None:
    assert design_layers(DESIGN.read_text(encoding="utf-8")) == LAYERS


def test_design_md_states_the_evaluation_layers_this_test_checks() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    assert design_layers(text, "its parts (top first):", "app.evaluation.") == EVALUATION_LAYERS


def test_every_part_of_the_evaluation_has_a_layer() -> None:
    placed = {p for layer in EVALUATION_LAYERS for p in layer}
    found = {part(m) for m in module_graph() if m.startswith("app.evaluation.")}
    assert found - placed == set()


def test_no_evaluation_import_goes_up_its_layers_or_across_them() -> None:
    assert layer_violations(module_graph(), EVALUATION_LAYERS, part) == []


def test_every_known_exception_is_still_an_import() -> None:
    graph = module_graph()
    assert [(a, b) for a, b in sorted(KNOWN_EXCEPTIONS) if b not in graph.get(a, set())] == []


# What serves a retrieval: the chain, its inputs and the answer the API and `sieve query` return.
SERVING = ("app.retrieve_response", "app.retrieval", "app.ingest", "app.lexical", "app.store", "app.models")


def test_nothing_that_serves_a_retrieval_imports_the_evaluation() -> None:
    graph = module_graph()
    into_evaluation = [
        (a, b)
        for a, imported in sorted(graph.items())
        if top_part(a) in SERVING
        for b in sorted(imported)
        if top_part(b) == "app.evaluation"
    ]
    assert into_evaluation == []


def test_importing_the_serving_answer_loads_no_module_of_the_evaluation() -> None:
    code = (
        "import sys, app.retrieve_response, app.retrieval.chain, app.retrieval.stages; "
        "print(sorted(m for m in sys.modules if m.split('.')[:2] == ['app', 'evaluation']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=APP.parent, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
