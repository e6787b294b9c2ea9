"""No import cycle between turnlog's subpackages and core modules.

The graph is built from the source with ``ast`` (nothing is imported): a node
is a subpackage (``turnlog.sinks``, ``turnlog.kafka``, ...) or a top-level
module of ``turnlog/`` (``turnlog.settings``, ``turnlog.follow``, ...). Every
import counts, also those inside functions: a lazy import hides a cycle, it
does not remove it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Folders outside turnlog/ that are turnlog subpackages (pyproject.toml, ``package-dir``).
TOP_LEVEL_SUBPACKAGES = ("producers", "sinks", "stream_processors", "schemas", "deploy", "tools")
#: Edges known to close a cycle, each waiting for its owner's fix; left out of the graph.
#: ``test_every_tolerated_edge_still_exists`` fails once one is gone, so the entry is removed.
TOLERATED_EDGES: frozenset[tuple[str, str]] = frozenset()


def source_files() -> Iterable[tuple[str, Path]]:
    """``(module name, path)`` of every turnlog module."""
    core = ROOT / "turnlog"
    for path in sorted(core.rglob("*.py")):
        parts = path.relative_to(core).with_suffix("").parts
        yield ".".join(("turnlog", *parts)).removesuffix(".__init__"), path
    for folder in TOP_LEVEL_SUBPACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            yield ".".join(("turnlog", folder, *parts)).removesuffix(".__init__"), path


def node_of(module: str) -> str:
    """``turnlog.<first part>``: the subpackage or core module ``module`` belongs to."""
    parts = module.split(".")
    return ".".join(parts[:2])


def imported_modules(module: str, path: Path, known: set[str]) -> set[str]:
    """The turnlog modules ``path`` imports (``from X import name`` names X.name when that is a module)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in known else target)
    return {name for name in found if name == "turnlog" or name.startswith("turnlog.")}


def import_graph(tolerated: frozenset[tuple[str, str]] = TOLERATED_EDGES) -> dict[str, set[str]]:
    """``{node: nodes it imports}`` over turnlog's source, without the ``tolerated`` edges."""
    files = list(source_files())
    known = {module for module, _ in files}
    graph: dict[str, set[str]] = {}
    for module, path in files:
        edges = graph.setdefault(node_of(module), set())
        edges.update(node_of(target) for target in imported_modules(module, path, known))
    for node, edges in graph.items():
        edges.discard(node)
        edges.difference_update(target for source, target in tolerated if source == node)
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle_and_accepts_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_the_edges_it_must():
    graph = import_graph()
    assert {"turnlog.kafka", "turnlog.producers", "turnlog.sinks", "turnlog.stream_processors"} <= set(graph)
    assert "turnlog.kafka" in graph["turnlog.sinks"]  # sinks/service.py uses the Kafka layer
    assert "turnlog.settings" in graph["turnlog.kafka"]
    assert "turnlog.metrics" in graph["turnlog.sinks"]  # `from turnlog import metrics` names the module


def test_no_import_cycle_between_subpackages():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_tolerated_edge_still_exists():
    graph = import_graph(tolerated=frozenset())
    gone = [edge for edge in TOLERATED_EDGES if edge[1] not in graph.get(edge[0], ())]
    assert not gone, f"remove from TOLERATED_EDGES (fixed): {gone}"
