"""turnlog's import graph: no cycle, and every import goes in an allowed direction.

The graph is built from the source with ``ast`` (nothing is imported). The
modules are every ``.py`` file of the folders that ``package-dir`` in
pyproject.toml maps into the package (``turnlog/`` is ``turnlog``, ``sinks/``
is ``turnlog.sinks``, ``tools/`` is ``turnlog.tools``, ...). Every import
counts, also those inside functions: a lazy import hides a cycle or a wrong
direction, it does not remove it. The one exception is written in the rules:
the command line reaches ``turnlog.tools`` only inside a command.

The layers and what each may import are drawn in docs/architecture.md; the
tables ``LAYERS`` and ``MAY_IMPORT`` below are the same rules, enforced.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Edges known to close a cycle, each waiting for its owner's fix; left out of the graph.
#: ``test_every_tolerated_edge_still_exists`` fails once one is gone, so the entry is removed.
TOLERATED_EDGES: frozenset[tuple[str, str]] = frozenset()


def package_dirs() -> dict[str, Path]:
    """``{package: folder}`` from pyproject.toml's ``package-dir`` (``turnlog.sinks`` -> ``sinks/``)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {package: ROOT / folder for package, folder in setuptools["package-dir"].items()}


def source_files() -> Iterable[tuple[str, Path]]:
    """``(module name, path)`` of every turnlog module."""
    for package, folder in sorted(package_dirs().items()):
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            yield ".".join((package, *parts)).removesuffix(".__init__"), path


@dataclass(frozen=True, slots=True)
class Import:
    """One turnlog module imported by a module: at ``line``, ``lazy`` if inside a function."""

    target: str
    line: int
    lazy: bool


def imports_in(module: str, source: str, known: set[str], *, is_package: bool = False) -> list[Import]:
    """The turnlog modules ``source`` (the text of ``module``) imports. ``from X import name``
    names ``X.name`` when that is a module of ``known``, else ``X``."""
    found: list[Import] = []

    def names(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        if node.level:
            base = module.split(".")
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            target = ".".join([*base, node.module] if node.module else base)
        else:
            target = node.module or ""
        return [f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target for alias in node.names]

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.extend(Import(name, node.lineno, lazy) for name in names(node)
                         if name == "turnlog" or name.startswith("turnlog."))
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))  # runs when called, not at import
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(source), False)
    return list(dict.fromkeys(found))  # `from turnlog.sinks import a, b` is one import of turnlog.sinks


def imports_of(module: str, path: Path, known: set[str]) -> list[Import]:
    return imports_in(module, path.read_text(), known, is_package=path.name == "__init__.py")


def all_imports() -> dict[str, tuple[Path, list[Import]]]:
    """``{module: (its file, what it imports)}`` over turnlog's source."""
    files = list(source_files())
    known = {module for module, _ in files}
    return {module: (path, imports_of(module, path, known)) for module, path in files}


# --- No cycle between subpackages ---------------------------------------------------------------


def node_of(module: str) -> str:
    """``turnlog.<first part>``: the subpackage or top-level module ``module`` belongs to."""
    parts = module.split(".")
    return ".".join(parts[:2])


def import_graph(tolerated: frozenset[tuple[str, str]] = TOLERATED_EDGES) -> dict[str, set[str]]:
    """``{node: nodes it imports}`` over turnlog's source, without the ``tolerated`` edges."""
    graph: dict[str, set[str]] = {}
    for module, (_, imports) in all_imports().items():
        graph.setdefault(node_of(module), set()).update(node_of(i.target) for i in imports)
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
    assert {"turnlog.kafka", "turnlog.producers", "turnlog.sinks", "turnlog.stream_processors", "turnlog.tools"} <= set(graph)
    assert "turnlog.kafka" in graph["turnlog.sinks"]  # sinks/service.py uses the Kafka layer
    assert "turnlog.settings" in graph["turnlog.kafka"]
    assert "turnlog.metrics" in graph["turnlog.sinks"]  # `from turnlog import metrics` names the module
    assert "turnlog.tools" in graph["turnlog.cli"]  # inside the demo/chaos/bench commands: lazy, still counted


def test_no_import_cycle_between_subpackages():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_tolerated_edge_still_exists():
    graph = import_graph(tolerated=frozenset())
    gone = [edge for edge in TOLERATED_EDGES if edge[1] not in graph.get(edge[0], ())]
    assert not gone, f"remove from TOLERATED_EDGES (fixed): {gone}"


# --- Allowed import directions ------------------------------------------------------------------

#: The layer of each module, by its longest matching prefix (``turnlog`` alone is the package's
#: own ``__init__``: the public names for agents).
LAYERS: dict[str, str] = {
    "turnlog.exceptions": "foundation",
    "turnlog.settings": "foundation",
    "turnlog.metrics": "foundation",
    "turnlog.faults": "foundation",
    "turnlog.dlq": "foundation",
    "turnlog.readiness": "foundation",
    "turnlog.signing": "foundation",
    "turnlog.redact": "foundation",
    "turnlog.polling": "foundation",
    "turnlog.tracing": "foundation",
    "turnlog.schemas": "schemas",
    "turnlog.crypto": "crypto",
    "turnlog.kafka": "kafka",
    "turnlog.sinks": "sinks",
    "turnlog.producers": "producers",
    "turnlog.stream_processors": "stream_processors",
    "turnlog": "public_api",
    "turnlog.adapters": "adapters",
    "turnlog.follow": "serving",
    "turnlog.resume_barrier": "serving",
    "turnlog.api": "serving",
    "turnlog.ops": "ops",
    "turnlog.deploy": "deploy",
    "turnlog.cli": "cli",
    "turnlog.tools": "tools",
}
_LIBRARY_CORE = {"foundation", "schemas", "crypto", "kafka", "sinks", "producers", "stream_processors"}
#: The layers each layer's modules may import (besides their own subpackage or module). A layer
#: missing here may import nothing of turnlog; ``tools`` is not in any library layer's set.
MAY_IMPORT: dict[str, set[str]] = {
    "foundation": {"foundation"},
    "schemas": {"foundation"},
    "crypto": {"foundation", "schemas"},
    "kafka": {"foundation", "schemas"},
    "sinks": {"foundation", "schemas", "crypto", "kafka"},
    "producers": {"foundation", "schemas", "crypto", "kafka"},  # the store is reached through the API or a ResumeSource
    "stream_processors": {"foundation", "schemas", "crypto", "kafka", "sinks"},
    "public_api": {"foundation", "schemas", "producers"},
    "adapters": {"public_api", "foundation", "schemas", "producers"},
    "serving": {"foundation", "schemas", "crypto", "kafka", "sinks", "producers", "serving"},
    "ops": {*_LIBRARY_CORE, "serving"},
    "deploy": {"foundation", "schemas", "crypto", "kafka", "sinks"},
    "cli": {*_LIBRARY_CORE, "public_api", "adapters", "serving", "ops", "deploy", "tools"},
    "tools": {*_LIBRARY_CORE, "public_api", "adapters", "serving", "ops", "deploy", "cli", "tools"},
}
#: ``(importer, imported)`` layer pairs allowed only inside a function: the command line loads the
#: demo, chaos and bench tooling in the commands that run them, and no other command pays for it.
LAZY_ONLY: set[tuple[str, str]] = {("cli", "tools")}


def layer_of(module: str, layers: Mapping[str, str] = LAYERS) -> str | None:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if (layer := layers.get(".".join(parts[:end]))) is not None:
            return layer
    return None


def direction_problems(
    imports: Mapping[str, tuple[Path, list[Import]]],
    layers: Mapping[str, str] = LAYERS,
    may_import: Mapping[str, set[str]] = MAY_IMPORT,
    lazy_only: set[tuple[str, str]] = LAZY_ONLY,
) -> list[str]:
    """One line per import that breaks the rules, naming the module, its file and line, and the import."""
    problems = []
    for module, (path, found) in sorted(imports.items()):
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        source = layer_of(module, layers)
        if source is None:
            problems.append(f"{module} ({where}) is in no layer: add it to LAYERS")
            continue
        allowed = may_import.get(source, set())
        for imp in found:
            target = layer_of(imp.target, layers)
            if node_of(imp.target) == node_of(module):
                continue  # within its own subpackage or module
            at = f"{module} ({where}:{imp.line}) imports {imp.target}"
            if target is None:
                problems.append(f"{at}, which is in no layer: add it to LAYERS")
            elif target not in allowed:
                problems.append(f"{at}: {source} may import {', '.join(sorted(allowed)) or 'nothing'}; not {target}")
            elif (source, target) in lazy_only and not imp.lazy:
                problems.append(f"{at} at module level: {source} may import {target} only inside a function")
    return problems


def test_every_import_goes_in_an_allowed_direction():
    problems = direction_problems(all_imports())
    assert not problems, "imports against the layers (docs/architecture.md):\n" + "\n".join(problems)


def test_every_layer_has_its_rules():
    assert set(LAYERS.values()) == set(MAY_IMPORT)
    assert all(targets <= set(MAY_IMPORT) for targets in MAY_IMPORT.values())


def test_the_recorder_does_not_reach_the_store():
    """The resume barrier runs where the store is (the API, or a ``StoreResumeSource`` a composition
    root injects): nothing in ``producers`` imports ``sinks``."""
    assert "sinks" not in MAY_IMPORT["producers"]
    problems = check("turnlog.producers.recorder", "def grant():\n    from turnlog.sinks import open_store\n")
    assert [p.split(": ", 1)[1] for p in problems] == ["producers may import crypto, foundation, kafka, schemas; not sinks"]


def test_no_library_layer_may_import_the_tools():
    library = set(MAY_IMPORT) - {"tools", "cli"}
    assert not [layer for layer in library if "tools" in MAY_IMPORT[layer]]
    assert ("cli", "tools") in LAZY_ONLY


# The checker itself, on synthetic modules: it must be able to fail.

KNOWN = {"turnlog", "turnlog.sinks", "turnlog.sinks.base", "turnlog.tools", "turnlog.tools.demo",
         "turnlog.tools.demo.runner", "turnlog.cli", "turnlog.kafka", "turnlog.ops", "turnlog.ops.replay"}


def check(module: str, source: str) -> list[str]:
    path = ROOT / "synthetic" / (module.replace(".", "/") + ".py")
    return direction_problems({module: (path, imports_in(module, source, KNOWN))})


def test_the_checker_names_a_library_module_importing_the_tools():
    source = "import os\n\nfrom turnlog.kafka import producer\nfrom turnlog.tools.demo import runner\n"
    problems = check("turnlog.sinks.base", source)
    assert problems == [
        "turnlog.sinks.base (synthetic/turnlog/sinks/base.py:4) imports turnlog.tools.demo.runner: "
        "sinks may import crypto, foundation, kafka, schemas; not tools"
    ]


def test_the_checker_sees_a_lazy_import_and_a_relative_one_too():
    lazy = "def f():\n    from turnlog.ops.replay import replay_events\n"
    assert [p.split(": ", 1)[1] for p in check("turnlog.sinks.base", lazy)] == [
        "sinks may import crypto, foundation, kafka, schemas; not ops"
    ]
    relative = "from ..tools.demo import runner\n"  # from turnlog.sinks.base: turnlog.tools.demo.runner
    assert "imports turnlog.tools.demo.runner" in check("turnlog.sinks.base", relative)[0]
    upward = "from turnlog import SessionRecorder\n"  # the package's public names, from below them
    assert "not public_api" in check("turnlog.sinks.base", upward)[0]


def test_the_checker_lets_the_cli_reach_the_tools_only_inside_a_command():
    inside = "def demo():\n    from turnlog.tools.demo.runner import run_demo\n"
    at_top = "from turnlog.tools.demo.runner import run_demo\n"
    assert check("turnlog.cli", inside) == []
    assert check("turnlog.cli", at_top) == [
        "turnlog.cli (synthetic/turnlog/cli.py:1) imports turnlog.tools.demo.runner at module level: "
        "cli may import tools only inside a function"
    ]


def test_the_checker_names_a_module_in_no_layer():
    problems = direction_problems(
        {"turnlog.newthing": (ROOT / "turnlog" / "newthing.py", [])}, layers={"turnlog.sinks": "sinks"}
    )
    assert problems == ["turnlog.newthing (turnlog/newthing.py) is in no layer: add it to LAYERS"]


# --- Every package folder is installed ----------------------------------------------------------


def test_every_package_folder_is_in_the_packages_list():
    """pyproject.toml lists the packages by hand: a new subpackage folder missing from the list
    works in the editable install and is absent from the wheel."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {module for module, path in source_files() if path.name == "__init__.py"}
    assert folders == listed, f"missing from packages: {sorted(folders - listed)}; no folder: {sorted(listed - folders)}"


# The store's boundary: only sinks/ opens transactions and speaks SQL (docs/architecture.md).

#: Third-party packages that only ``turnlog.sinks`` may import.
STORE_PACKAGES = ("sqlalchemy", "alembic", "psycopg")
#: Modules of ``turnlog.sinks`` that only ``turnlog.sinks`` may import: the tables, the driver-error
#: mapping and the connection-taking queries (others reach them through ``SqlStore.reading()`` /
#: ``writing()``, ``sinks/access.py``).
STORE_INTERNALS = ("turnlog.sinks.tables", "turnlog.sinks.driver_errors", "turnlog.sinks.migrate")
#: Modules outside ``turnlog.sinks`` allowed across the boundary, each with its reason.
STORE_BOUNDARY_EXCEPTIONS = {
    "turnlog.redact": "parses a database URL as SQLAlchemy will (make_url) to hide its password; no connection",
}
#: The tooling that audits a store with its own SQL (the demo's verdict, chaos's invariants, the
#: bench's databases) is outside the library: the rule covers the library only.
STORE_RULE_EXEMPT_LAYERS = {"tools"}


def store_boundary_problems(module: str, source: str) -> list[str]:
    """One line per place where ``module`` crosses the store's boundary: an import of a store
    package or of a sinks internal, or a use of an ``.engine`` attribute."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            targets = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            targets = []
        crossing = [t for t in targets if t.split(".")[0] in STORE_PACKAGES or t in STORE_INTERNALS]
        if crossing:
            problems.append(f"{module}:{node.lineno} imports {crossing[0]}")
        if isinstance(node, ast.Attribute) and node.attr == "engine":
            problems.append(f"{module}:{node.lineno} uses .engine")
    return problems


def test_only_the_store_opens_transactions_and_speaks_sql():
    problems = []
    for module, path in source_files():
        layer = layer_of(module)
        if layer in ("sinks", *STORE_RULE_EXEMPT_LAYERS) or module in STORE_BOUNDARY_EXCEPTIONS:
            continue
        problems += store_boundary_problems(module, path.read_text())
    assert not problems, (
        "outside sinks/, reach the store through SqlStore.reading() / writing() (sinks/access.py):\n"
        + "\n".join(problems)
    )


def test_the_store_boundary_check_can_fail():
    source = (
        "from sqlalchemy import select\n"
        "import alembic.command\n"
        "from turnlog.sinks.tables import sessions\n"
        "from turnlog.sinks import access\n"
        "def f(store):\n"
        "    with store.engine.connect() as conn:\n"
        "        pass\n"
    )
    assert store_boundary_problems("turnlog.api.app", source) == [
        "turnlog.api.app:1 imports sqlalchemy",
        "turnlog.api.app:2 imports alembic.command",
        "turnlog.api.app:3 imports turnlog.sinks.tables",
        "turnlog.api.app:6 uses .engine",
    ]
