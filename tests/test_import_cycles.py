"""No import cycle among autotune's modules, counting every import: module-level, deferred and TYPE_CHECKING."""

from __future__ import annotations

from pathlib import Path

from import_graph import Import, all_imports, imports_of, modules


def cycles(imports: list[Import]) -> list[list[str]]:
    """The strongly connected groups of more than one module in the graph of ``imports`` (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.target.startswith("tuner") and imp.source != imp.target:
            graph.setdefault(imp.source, set()).add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    found = cycles(all_imports())
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_the_check_catches_a_deferred_cycle() -> None:
    known = set(modules()) | {"tuner.util.fake", "tuner.util.fake2"}
    down = imports_of("tuner.util.files", Path("tuner/util/files.py"), known)
    up = imports_of("tuner.util.fake", Path("tuner/util/fake.py"), known,
                    "def f():\n    from . import fake2\n")
    back = imports_of("tuner.util.fake2", Path("tuner/util/fake2.py"), known,
                      "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .fake import f\n")
    assert cycles(down + up + back) == [["tuner.util.fake", "tuner.util.fake2"]]
