"""Imports point one way (docs/ARCHITECTURE.md): the pure core and the codec do no I/O,
the bookie is not a client, the metadata store knows nothing above it, the client knows
no log streams, log streams know no applications, nothing below Spark needs Spark, no
shipped layer needs the testing module, and no layer imports the command line.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import``
of every module, wherever it stands (module level, inside a function, under
``TYPE_CHECKING``), relative imports resolved, plus ``importlib.import_module`` with a
constant name. A name computed at run time is beyond a static reading: keep such tables
inside the layer they belong to.
"""

from __future__ import annotations

import ast
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

    def __str__(self) -> str:
        return f"{self.importer} imports {self.imported} ({self.path.name}:{self.line})"


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
    else as importing ``a``.
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
    return sorted(set(found), key=lambda i: (i.line, i.imported))


def import_graph(package_dir: Path) -> list[Import]:
    """Every import of every module of the package in ``package_dir``."""
    modules = package_modules(package_dir)
    graph: list[Import] = []
    for name, path in modules.items():
        graph += module_imports(name, path, modules)
    return graph


# ---------------------------------------------------------------- the layers

# Modules at the top of the package, by their job.
TOP_MODULE_LAYERS = {
    "quorumlog": "api",
    "quorumlog.aio": "api",
    "quorumlog.errors": "errors",
    "quorumlog.stats": "stats",
    "quorumlog.__main__": "commands",
}
LAYERS = frozenset(
    {
        "api",  # the package itself and quorumlog.aio: the public API, over everything
        "errors",
        "stats",  # histogram buckets as plain integers: no I/O, imports nothing of ours
        "formats",  # applications' record formats, shared with the pipelines that read them
        "proto",
        "core",
        "security",  # tokens, roles, TLS contexts, redaction: below the server and client
        "bookie",
        "server",
        "meta",
        "client",
        "replication",
        "log",
        "recipes",
        "apps",
        "db",
        "spark",
        "bench",  # the benchmarks ``quorumlog bench`` runs, importable by bench/ scripts
        "testing",
        "commands",
    }
)


def layer_of(module: str) -> str | None:
    """The layer of a module of quorumlog (None for any other module)."""
    parts = module.split(".")
    if parts[0] != "quorumlog":
        return None
    top = ".".join(parts[:2])
    return TOP_MODULE_LAYERS.get(top, parts[1] if len(parts) > 1 else "api")


# What the client, and so whatever must not be a client, stays below.
ON_THE_CLIENT = frozenset(
    {"log", "recipes", "apps", "db", "spark", "replication", "bench", "testing"}
)
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
    name is in ``forbidden_outside``."""

    name: str
    says: str
    importers: frozenset[str]
    allowed: frozenset[str] | None = None
    forbidden: frozenset[str] = frozenset()
    forbidden_outside: frozenset[str] = frozenset()

    def broken_by(self, edge: Import) -> bool:
        if layer_of(edge.importer) not in self.importers:
            return False
        target = layer_of(edge.imported)
        if target is None:
            return edge.imported.split(".")[0] in self.forbidden_outside
        if self.allowed is not None and target not in self.allowed:
            return True
        return target in self.forbidden


RULES = [
    Rule(
        "core-and-proto-import-no-io-layer",
        "the pure core and the codec import only errors, proto and core",
        importers=frozenset({"core", "proto"}),
        allowed=frozenset({"errors", "proto", "core"}),
    ),
    Rule(
        "core-and-proto-do-no-io",
        "the pure core and the codec import no sockets, event loop, threads, processes, "
        "clock or store",
        importers=frozenset({"core", "proto"}),
        forbidden_outside=IO_MODULES,
    ),
    Rule(
        "bookie-is-not-a-client",
        "the bookie imports neither the client nor anything built on it",
        importers=frozenset({"bookie"}),
        forbidden=ON_THE_CLIENT | {"client", "api"},
    ),
    Rule(
        "client-is-not-a-bookie",
        "the client imports neither the bookie's storage nor its server",
        importers=frozenset({"client"}),
        forbidden=frozenset({"bookie", "server"}),
    ),
    Rule(
        "server-is-not-a-client",
        "the bookie's server imports neither the client nor anything built on it",
        importers=frozenset({"server"}),
        forbidden=ON_THE_CLIENT | {"client", "api"},
    ),
    Rule(
        "stats-imports-nothing-of-ours",
        "the shared histogram buckets import nothing of quorumlog",
        importers=frozenset({"stats"}),
        allowed=frozenset({"stats"}),
    ),
    Rule(
        "formats-import-nothing-of-ours",
        "the record formats import nothing of quorumlog but errors",
        importers=frozenset({"formats"}),
        allowed=frozenset({"errors", "formats"}),
    ),
    Rule(
        "security-knows-nothing-above-it",
        "the security helpers import only errors, proto and security",
        importers=frozenset({"security"}),
        allowed=frozenset({"errors", "proto", "security"}),
    ),
    Rule(
        "meta-knows-nothing-above-it",
        "the metadata store imports only errors, proto and meta",
        importers=frozenset({"meta"}),
        allowed=frozenset({"errors", "proto", "meta"}),
    ),
    Rule(
        "client-knows-no-log-streams",
        "the client imports nothing built on it (log streams, recipes, replication, "
        "applications, Spark, benchmarks, testing), nor the public API package or the "
        "command line",
        importers=frozenset({"client"}),
        forbidden=ON_THE_CLIENT | {"api", "commands"},
    ),
    Rule(
        "log-knows-no-applications",
        "log streams import no applications (apps, db) and no Spark",
        importers=frozenset({"log"}),
        forbidden=frozenset({"apps", "db", "spark"}),
    ),
    Rule(
        "no-layer-imports-commands",
        "only the command line imports the command line (quorumlog.commands)",
        importers=LAYERS - {"commands"},
        forbidden=frozenset({"commands"}),
    ),
    Rule(
        "shipped-layers-need-no-testing",
        "quorumlog.testing is for tests: no shipped layer but the command line imports it",
        importers=LAYERS - {"testing", "commands"},
        forbidden=frozenset({"testing"}),
    ),
    Rule(
        "nothing-below-spark-needs-spark",
        "only quorumlog.spark and the command line import pyspark",
        importers=LAYERS - {"spark", "commands"},
        forbidden_outside=frozenset({"pyspark"}),
    ),
]


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
    ]
    broken = {name: sorted(e.line for e in edges) for name, edges in violations(graph).items()}
    assert broken == {
        "client-knows-no-log-streams": [1],
        "core-and-proto-import-no-io-layer": [3],
        "core-and-proto-do-no-io": [4],
        "meta-knows-nothing-above-it": [6],
        "bookie-is-not-a-client": [7],
        "log-knows-no-applications": [8],
        "no-layer-imports-commands": [9, 10],
        "nothing-below-spark-needs-spark": [12],
        "shipped-layers-need-no-testing": [14],
        "server-is-not-a-client": [14, 17],
        "client-is-not-a-bookie": [16],
        "stats-imports-nothing-of-ours": [18],
    }
