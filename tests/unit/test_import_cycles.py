"""No import cycle among the project's modules (issue 40): the layers' contracts (pyproject's
import-linter) order the packages, and inside a package no two modules import each other,
directly or around a loop, function-local imports included (they hid the one cycle there
was, `entrypoints.cli` <-> `entrypoints.dead_letter_cli`), nor through a package's
`__init__`, which importing any of its modules runs first (`application.null_tracer`
imported `application.ports.observability`, whose package imported
`application.ports.endpoint`, which imported `application.null_tracer`: a command that
imported it first failed)."""

from __future__ import annotations

import sys

import grimp

PACKAGES = ("domain", "application", "adapters", "entrypoints", "service", "tools")


def imported_by(graph: grimp.ImportGraph, module: str) -> set[str]:
    """What importing `module` runs: the modules it imports and, for each, the packages above
    it (their `__init__` runs first), but for `module`'s own packages (they are running
    already when it runs)."""
    own = {module.rsplit(".", n)[0] for n in range(1, module.count(".") + 1)}
    found = set()
    for other in graph.find_modules_directly_imported_by(module):
        found.add(other)
        parents = {other.rsplit(".", n)[0] for n in range(1, other.count(".") + 1)}
        found |= {p for p in parents - own if p in graph.modules}
    return found


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import cycles of `graph`: its strongly connected components of more than one
    module (Tarjan's algorithm, R. Tarjan, "Depth-first search and linear graph
    algorithms", SIAM J. Comput. 1972)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(imported_by(graph, module)):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for module in sorted(graph.modules):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_the_framework_has_no_import_cycle() -> None:
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False)
    assert cycles(graph) == []


def test_a_cycle_is_found() -> None:
    """The check itself: a cycle of three modules planted in a graph is reported."""
    graph = grimp.ImportGraph()
    for importer, imported in (("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")):
        graph.add_import(importer=importer, imported=imported)
    assert cycles(graph) == [["a", "b", "c"]]


def test_a_cycle_through_a_packages_init_is_found() -> None:
    """A module importing a package's submodule runs the package's `__init__` first: a
    cycle through it is reported, while a package importing its own submodules is none."""
    graph = grimp.ImportGraph()
    for importer, imported in (("p", "p.endpoint"), ("p.endpoint", "nulls"),
                               ("nulls", "p.observability"), ("p.endpoint", "p.observability")):
        graph.add_import(importer=importer, imported=imported)
    assert cycles(graph) == [["nulls", "p", "p.endpoint"]]
