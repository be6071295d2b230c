"""Imports point one way (docs/ARCHITECTURE.md). Each package of quorumlog may import,
of quorumlog, only what its row of the table in docs/ARCHITECTURE.md allows (an
allow-list: what a row does not name is refused; the table and :data:`ALLOWED` are
checked to say the same), and beside it:

- the pure core and the codec import no module that does I/O;
- only the command line imports the command line; a layer whose row names ``commands``
  may only start it as a process (a benchmark running ``quorumlog db serve``);
- only quorumlog.spark and the command line import pyspark;
- nothing outside quorumlog.log builds the paths of the logs' metadata nodes
  (``/logs/...``), so nothing else can write them: only log/ imports the path helpers
  (``LOGS_PATH``, ``log_path``) and no other module spells ``/logs``. A log's ledger list
  has one update path, ``log/metadata_updates.py`` (the Spark sink commits through it).

The graph is read from the source with ``ast``: every ``import`` and ``from ... import``
of every module, wherever it stands (module level, inside a function, under
``TYPE_CHECKING``), relative imports resolved, plus ``importlib.import_module`` with a
constant name, plus every process a module starts with ``"-m", "quorumlog..."`` in a
list or tuple (``python -m quorumlog bookie`` runs the command line: an edge to it). A
name computed at run time is beyond a static reading: keep such tables inside the layer
they belong to.
"""

from __future__ import annotations

import ast
import itertools
import re
import textwrap
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "quorumlog"


# ---------------------------------------------------------------- the graph


@dataclass(frozen=True, order=True)
class Import:
    """``importer`` imports ``imported`` at ``path:line`` (dotted module names)."""

    importer: str
    imported: str
    path: Path
    line: int
    kind: str = "import"  # or "spawn": starts ``python -m <imported>`` as a process

    def __str__(self) -> str:
        verb = "starts python -m" if self.kind == "spawn" else "imports"
        return f"{self.importer} {verb} {self.imported} ({self.path.name}:{self.line})"


def package_modules(package_dir: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (``__init__`` names its package)."""
    modules: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _absolute_base(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module a ``from`` import names, its dots resolved against ``importer``."""
    if node.level == 0:
        assert node.module is not None
        return node.module
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    if node.level - 1 >= len(package):
        raise ValueError(f"{importer}: relative import beyond the top (line {node.lineno})")
    parts = package[: len(package) - (node.level - 1)]
    if node.module:
        parts.append(node.module)
    return ".".join(parts)


def _constant_import_module(node: ast.Call) -> str | None:
    """The name ``importlib.import_module("x")`` or ``import_module("x")`` loads, if constant."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    value = first.value if isinstance(first, ast.Constant) else None
    if isinstance(value, str) and not value.startswith("."):  # a relative one needs its package
        return value
    return None


def module_imports(importer: str, path: Path, modules: Iterable[str]) -> list[Import]:
    """Every import in the module ``importer`` (file ``path``), in the order of the source.

    ``from a import b`` counts as importing ``a.b`` when that is a module of the package,
    else as importing ``a``. ``"-m", "NAME"`` in a list or tuple, NAME a module of the
    package's name, is a spawn of NAME (of ``NAME.__main__`` for a bare package name).
    """
    known = set(modules)
    is_package = path.name == "__init__.py"
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [Import(importer, alias.name, path, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute_base(importer, is_package, node)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                target = submodule if submodule in known else base
                found.append(Import(importer, target, path, node.lineno))
        elif isinstance(node, ast.Call):
            name = _constant_import_module(node)
            if name is not None:
                found.append(Import(importer, name, path, node.lineno))
        elif isinstance(node, ast.List | ast.Tuple):
            found += _spawns(importer, path, node)
    return sorted(set(found), key=lambda i: (i.line, i.imported))


def _spawns(importer: str, path: Path, node: ast.List | ast.Tuple) -> list[Import]:
    """``python -m MODULE`` in a command line written as a list or tuple of constants."""
    top = importer.split(".")[0]
    values = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
    found = []
    for at, (flag, module) in enumerate(itertools.pairwise(values)):
        if flag != "-m" or not isinstance(module, str) or module.split(".")[0] != top:
            continue
        target = f"{module}.__main__" if module == top else module
        found.append(Import(importer, target, path, node.elts[at + 1].lineno, "spawn"))
    return found


def import_graph(package_dir: Path) -> list[Import]:
    """Every import of every module of the package in ``package_dir``."""
    modules = package_modules(package_dir)
    graph: list[Import] = []
    for name, path in modules.items():
        graph += module_imports(name, path, modules)
    return graph


# ---------------------------------------------------------------- the layers

ARCHITECTURE_MD = PACKAGE_DIR.parent / "docs" / "ARCHITECTURE.md"

# Modules at the top of the package, by their job; any other module's layer is its
# package (quorumlog.server.process: "server").
TOP_MODULE_LAYERS = {
    "quorumlog": "api",
    "quorumlog.aio": "api",
    "quorumlog.errors": "errors",
    "quorumlog.stats": "stats",
    "quorumlog.__main__": "commands",
}

# The table of docs/ARCHITECTURE.md: layer -> the layers it may import (its own always).
ALLOWED: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "stats": frozenset(),
    "formats": frozenset({"errors"}),
    "proto": frozenset({"errors"}),
    "security": frozenset({"errors", "proto"}),
    "core": frozenset({"errors", "proto"}),
    "meta": frozenset({"errors", "proto"}),
    "bookie": frozenset({"errors", "proto", "core", "stats"}),
    "server": frozenset({"errors", "proto", "core", "meta", "bookie", "stats", "security"}),
    "client": frozenset({"errors", "proto", "core", "meta", "stats", "security"}),
    "log": frozenset({"errors", "proto", "core", "meta", "client"}),
    "recipes": frozenset({"errors", "meta", "client"}),
    "replication": frozenset({"errors", "client", "core", "proto", "meta", "recipes", "security"}),
    "apps": frozenset({"errors", "log", "recipes", "client", "formats"}),
    "db": frozenset({"errors", "log", "recipes", "client", "meta", "security"}),
    "spark": frozenset({"errors", "log", "client", "replication", "formats", "core", "meta"}),
    "bench": frozenset({"errors", "client", "log", "server", "proto", "commands"}),
    "api": frozenset({"errors", "proto", "meta", "client", "log"}),
}
ANYTHING = frozenset({"testing", "commands"})  # rows that say "anything"
LAYERS = frozenset(ALLOWED) | ANYTHING


def layer_of(module: str) -> str | None:
    """The layer of a module of quorumlog (None for any other module)."""
    parts = module.split(".")
    if parts[0] != "quorumlog":
        return None
    top = ".".join(parts[:2])
    return TOP_MODULE_LAYERS.get(top, parts[1] if len(parts) > 1 else "api")


# Standard and third-party modules that do I/O: sockets, event loops, threads,
# processes, clocks, stores.
IO_MODULES = frozenset(
    {
        "asyncio",
        "concurrent",
        "http",
        "kazoo",
        "lmdb",
        "multiprocessing",
        "pyspark",
        "select",
        "selectors",
        "shutil",
        "signal",
        "socket",
        "socketserver",
        "sqlite3",
        "ssl",
        "subprocess",
        "threading",
        "time",
        "urllib",
        "uvloop",
    }
)


@dataclass(frozen=True)
class Rule:
    """Modules of the ``importers`` layers may import, of quorumlog, only the ``allowed``
    layers (when given) and none of the ``forbidden`` ones, and no module whose top-level
    name is in ``forbidden_outside``; with ``imports_only``, processes started are not
    held to it."""

    name: str
    says: str
    importers: frozenset[str]
    allowed: frozenset[str] | None = None
    forbidden: frozenset[str] = frozenset()
    forbidden_outside: frozenset[str] = frozenset()
    imports_only: bool = False

    def broken_by(self, edge: Import) -> bool:
        if layer_of(edge.importer) not in self.importers:
            return False
        if self.imports_only and edge.kind != "import":
            return False
        target = layer_of(edge.imported)
        if target is None:
            return edge.imported.split(".")[0] in self.forbidden_outside
        if self.allowed is not None and target not in self.allowed:
            return True
        return target in self.forbidden


RULES = [
    *(
        Rule(
            f"{layer}-imports-its-row",
            f"{layer} imports only what its row of docs/ARCHITECTURE.md allows: "
            + (", ".join(sorted(allowed)) or "nothing of quorumlog"),
            importers=frozenset({layer}),
            allowed=allowed | {layer},
        )
        for layer, allowed in sorted(ALLOWED.items())
    ),
    Rule(
        "core-and-proto-do-no-io",
        "the pure core and the codec import no sockets, event loop, threads, processes, "
        "clock or store",
        importers=frozenset({"core", "proto"}),
        forbidden_outside=IO_MODULES,
    ),
    Rule(
        "no-layer-imports-commands",
        "only the command line imports the command line (a layer whose row allows it may "
        "start it as a process)",
        importers=LAYERS - {"commands"},
        forbidden=frozenset({"commands"}),
        imports_only=True,
    ),
    Rule(
        "nothing-below-spark-needs-spark",
        "only quorumlog.spark and the command line import pyspark",
        importers=LAYERS - {"spark", "commands"},
        forbidden_outside=frozenset({"pyspark"}),
    ),
]


# ---------------------------------------------------------------- the logs' nodes

LOGS_NODE = "/logs"
PATH_HELPERS = frozenset({"LOGS_PATH", "log_path"})  # of quorumlog.log.metadata


def log_node_builders(package_dir: Path) -> list[str]:
    """Where a module outside ``<package>.log`` builds a path under the logs' metadata
    nodes: imports or reads a path helper of ``<package>.log.metadata``, or spells
    ``/logs`` (alone or as a path's start) in a string."""
    top = package_dir.name
    helpers_module = f"{top}.log.metadata"
    modules = package_modules(package_dir)
    found: list[tuple[str, int, str]] = []
    for name, path in modules.items():
        if name == f"{top}.log" or name.startswith(f"{top}.log."):
            continue
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_bytes(), filename=str(path))
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        where = f"{path.relative_to(package_dir.parent)}"
        # Names this module binds to the helpers' module (``from quorumlog.log import
        # metadata``, ``import quorumlog.log.metadata as m``): their attributes count.
        aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _absolute_base(name, is_package, node)
                aliases |= {
                    a.asname or a.name for a in node.names if f"{base}.{a.name}" == helpers_module
                }
            elif isinstance(node, ast.Import):
                aliases |= {a.asname for a in node.names if a.name == helpers_module and a.asname}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _absolute_base(name, is_package, node)
                named = {alias.name for alias in node.names}
                if base == helpers_module and named & PATH_HELPERS:
                    found.append((where, node.lineno, f"imports {sorted(named & PATH_HELPERS)}"))
            elif isinstance(node, ast.Attribute) and node.attr in PATH_HELPERS:
                value = node.value
                held = isinstance(value, ast.Name) and value.id in aliases
                if node.attr == "LOGS_PATH" or held or ast.unparse(value) == helpers_module:
                    found.append((where, node.lineno, f"reads .{node.attr}"))
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and (node.value == LOGS_NODE or node.value.startswith(LOGS_NODE + "/"))
            ):
                found.append((where, node.lineno, f"spells {node.value!r}"))
    return [f"{where}:{line} {what}" for where, line, what in sorted(found)]


def violations(graph: Iterable[Import]) -> dict[str, list[Import]]:
    """Rule name -> the imports that break it (rules with none left out)."""
    broken: dict[str, list[Import]] = defaultdict(list)
    for edge in sorted(graph):
        for rule in RULES:
            if rule.broken_by(edge):
                broken[rule.name].append(edge)
    return dict(broken)


# ---------------------------------------------------------------- the tests


def test_every_module_of_quorumlog_belongs_to_a_known_layer() -> None:
    unknown = sorted(name for name in package_modules(PACKAGE_DIR) if layer_of(name) not in LAYERS)
    assert not unknown, f"modules in no known layer (give each a layer in {__name__}): {unknown}"


def test_imports_point_one_way() -> None:
    graph = import_graph(PACKAGE_DIR)
    assert len(graph) > 100, f"{len(graph)} imports in {PACKAGE_DIR}: not the package?"
    broken = violations(graph)
    says = {rule.name: rule.says for rule in RULES}
    report = "\n".join(
        f"{name} ({says[name]}):\n" + "\n".join(f"    {edge}" for edge in edges)
        for name, edges in broken.items()
    )
    assert not broken, f"imports against the layer directions:\n{report}"


def write_package(root: Path, files: dict[str, str]) -> Path:
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root / "pkg"


def test_graph_sees_function_level_type_checking_relative_and_dynamic_imports(
    tmp_path: Path,
) -> None:
    package = write_package(
        tmp_path,
        {
            "pkg/__init__.py": "from .low import base\n",
            "pkg/low/__init__.py": "",
            "pkg/low/base.py": "import json\n",
            "pkg/low/sibling.py": "",
            "pkg/high/__init__.py": "from . import view\n",
            "pkg/high/view.py": "",
            "pkg/low/leaky.py": """\
                from __future__ import annotations

                import importlib
                from typing import TYPE_CHECKING

                from . import sibling
                from .base import helper

                if TYPE_CHECKING:
                    from pkg.high.view import View


                def late():
                    from ..high import view

                    return view


                class Lazy:
                    def method(self):
                        import pkg.high

                        return importlib.import_module("pkg.high.view")
                """,
        },
    )
    graph = import_graph(package)
    edges = {(i.importer, i.imported, i.line) for i in graph}
    assert edges == {
        ("pkg", "pkg.low.base", 1),
        ("pkg.low.base", "json", 1),
        ("pkg.high", "pkg.high.view", 1),
        ("pkg.low.leaky", "__future__", 1),
        ("pkg.low.leaky", "importlib", 3),
        ("pkg.low.leaky", "typing", 4),
        ("pkg.low.leaky", "pkg.low.sibling", 6),
        ("pkg.low.leaky", "pkg.low.base", 7),  # a name from a module: the module
        ("pkg.low.leaky", "pkg.high.view", 10),  # under TYPE_CHECKING
        ("pkg.low.leaky", "pkg.high.view", 14),  # in a function, two dots up
        ("pkg.low.leaky", "pkg.high", 21),  # in a method
        ("pkg.low.leaky", "pkg.high.view", 23),  # importlib with a constant name
    }
    assert {i.path for i in graph if i.importer == "pkg.high"} == {package / "high/__init__.py"}


def test_rules_name_each_import_against_them() -> None:
    here = Path("x.py")
    graph = [
        Import("quorumlog.client.sync", "quorumlog.log.sync", here, 1),
        Import("quorumlog.client.sync", "quorumlog.meta.store", here, 2),
        Import("quorumlog.core.adds", "quorumlog.meta.store", here, 3),
        Import("quorumlog.proto.frames", "socket", here, 4),
        Import("quorumlog.meta.store", "quorumlog.meta.zk", here, 5),
        Import("quorumlog.meta.store", "quorumlog.client.config", here, 6),
        Import("quorumlog.bookie.gc", "quorumlog.client.bookkeeper", here, 7),
        Import("quorumlog.log.log", "quorumlog.apps.dice", here, 8),
        Import("quorumlog.spark.common", "quorumlog.commands.bench", here, 9),
        Import("quorumlog.apps.dice", "quorumlog.commands.dice", here, 10),
        Import("quorumlog.commands.dice", "quorumlog.apps.dice", here, 11),
        Import("quorumlog.client.sync", "pyspark.sql", here, 12),
        Import("quorumlog.spark.scan", "pyspark.sql", here, 13),
        Import("quorumlog.server.localbookie", "quorumlog.testing.cluster", here, 14),
        Import("quorumlog.testing.sim", "quorumlog.client.connection", here, 15),
        Import("quorumlog.client.metrics", "quorumlog.bookie.metrics", here, 16),
        Import("quorumlog.server.admin_http", "quorumlog.replication.worker", here, 17),
        Import("quorumlog.stats", "quorumlog.errors", here, 18),
        Import("quorumlog.bookie.metrics", "quorumlog.stats", here, 19),
        Import("quorumlog.server.local_cluster", "quorumlog.__main__", here, 20, "spawn"),
        Import("quorumlog.server.local_cluster", "quorumlog.server", here, 21, "spawn"),
        Import("quorumlog.bench.db", "quorumlog.__main__", here, 22, "spawn"),
        Import("quorumlog.bench.db", "quorumlog.commands.db", here, 23),
        Import("quorumlog.spark.pipelines.dice_stats", "quorumlog.apps.dice", here, 24),
        Import("quorumlog.formats.dice", "quorumlog.errors", here, 25),
    ]
    broken = {name: sorted(e.line for e in edges) for name, edges in violations(graph).items()}
    assert broken == {
        "client-imports-its-row": [1, 16],
        "core-imports-its-row": [3],
        "core-and-proto-do-no-io": [4],
        "meta-imports-its-row": [6],
        "bookie-imports-its-row": [7],
        "log-imports-its-row": [8],
        "spark-imports-its-row": [9, 24],
        "apps-imports-its-row": [10],
        "no-layer-imports-commands": [9, 10, 23],
        "nothing-below-spark-needs-spark": [12],
        "server-imports-its-row": [14, 17, 20],
        "stats-imports-its-row": [18],
    }


def test_graph_sees_processes_started_with_python_dash_m(tmp_path: Path) -> None:
    package = write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/__main__.py": "",
            "pkg/low/__init__.py": "",
            "pkg/low/spawner.py": """\
                import sys

                ENTRY = ("-m", "pkg.low")
                COMMAND = [sys.executable, "-m", "pkg", "serve"]
                OTHER = ["python", "-m", "json.tool"]
                """,
        },
    )
    edges = {(i.importer, i.imported, i.line, i.kind) for i in import_graph(package)}
    assert ("pkg.low.spawner", "pkg.low", 3, "spawn") in edges
    assert ("pkg.low.spawner", "pkg.__main__", 4, "spawn") in edges
    assert not any(imported == "json.tool" for _, imported, _, _ in edges)


def _architecture_rows() -> dict[str, frozenset[str]]:
    """Layer -> what its row of the table in docs/ARCHITECTURE.md may import."""
    rows: dict[str, frozenset[str]] = {}
    for line in ARCHITECTURE_MD.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        name = re.findall(r"`([^`]+)`", cells[0])[0].rstrip("/")
        layer = "api" if name == "quorumlog" else name
        if cells[2].startswith("anything"):
            rows[layer] = frozenset(LAYERS)
            continue
        allowed = cells[2].split("never")[0]  # "...; never `client/` or ..." forbids
        named = {n.rstrip("/") for n in re.findall(r"`([^`]+)`", allowed)}
        rows[layer] = frozenset(named & LAYERS)
    return rows


def test_the_architecture_table_is_the_allow_list() -> None:
    rows = _architecture_rows()
    expected = {layer: frozenset(LAYERS) for layer in ANYTHING} | ALLOWED
    differ = {
        layer: (sorted(rows.get(layer, set())), sorted(allowed))
        for layer, allowed in expected.items()
        if rows.get(layer) != allowed
    }
    assert not differ, f"docs/ARCHITECTURE.md's table vs ALLOWED (table, test): {differ}"
    assert set(rows) == set(expected), f"rows of no layer: {sorted(set(rows) - set(expected))}"


def test_nothing_outside_log_builds_the_logs_nodes() -> None:
    found = log_node_builders(PACKAGE_DIR)
    assert not found, (
        "only quorumlog/log/ builds or writes the logs' metadata nodes (a log's ledger list "
        "changes through log/metadata_updates.py):\n" + "\n".join(found)
    )


def test_log_node_builders_sees_helpers_attributes_and_spelt_paths(tmp_path: Path) -> None:
    write_package(
        tmp_path,
        {
            "quorumlog/__init__.py": "",
            "quorumlog/log/__init__.py": "",
            "quorumlog/log/metadata.py": 'LOGS_PATH = "/logs"\n',
            "quorumlog/log/writer.py": "from .metadata import LOGS_PATH\n",
            "quorumlog/db/__init__.py": "",
            "quorumlog/db/replica.py": """\
                \"\"\"/logs/<name> is the log's node (a docstring: not a path).\"\"\"
                from quorumlog.log.metadata import log_node_name, log_path
                from quorumlog.log import metadata


                def path(name):
                    return metadata.LOGS_PATH + "/" + log_node_name(name)


                def spelt(name):
                    return f"/logs/{name}"
                """,
        },
    )
    found = log_node_builders(tmp_path / "quorumlog")
    assert [line.split(" ", 1)[1] for line in found] == [
        "imports ['log_path']",
        "reads .LOGS_PATH",
        "spells '/logs/'",
    ]


def test_the_public_testing_package_stays_small() -> None:
    """quorumlog.testing ships with the product for applications' tests: a local cluster,
    the in-memory store, the simulator's engine, the checkers and a raw client. The
    project's own workloads and harnesses belong to tests/harness, not here."""
    files = sorted((PACKAGE_DIR / "testing").rglob("*.py"))
    lines = sum(len(path.read_text().splitlines()) for path in files)
    assert lines < 3000, f"quorumlog/testing has {lines} lines in {len(files)} files"
