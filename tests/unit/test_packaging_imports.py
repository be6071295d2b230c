"""The test command installs `.[test,spark]` and nothing else, then lints and type-checks
the package: every third-party module the package imports must come with that install,
or be an optional extra's module that is imported only inside functions and that the
type check is told may be absent ([tool.mypy.overrides] in pyproject.toml).

This is the cheap guard against a check that passes only on a machine where someone
installed a package by hand (docs/TESTING.md, "From a fresh clone").
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("quorumlog", "pyspark_quorumlog")
INSTALLED_EXTRAS = ("test", "spark")


def _distribution_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _installed_distributions() -> set[str]:
    """What `pip install -e '.[test,spark]'` brings: the requirements and theirs."""
    project = _project()["project"]
    wanted = [*project["dependencies"]]
    for extra in INSTALLED_EXTRAS:
        wanted += project["optional-dependencies"][extra]
    names = {_distribution_name(r) for r in wanted}
    for name in list(names):
        for requirement in metadata.requires(name) or []:
            if "extra ==" not in requirement:
                names.add(_distribution_name(requirement))
    return names


def _optional_modules() -> set[str]:
    modules: set[str] = set()
    for override in _project()["tool"]["mypy"].get("overrides", []):
        if override.get("ignore_missing_imports"):
            modules |= {m.split(".")[0] for m in override["module"]}
    return modules


def _third_party_imports() -> dict[str, list[tuple[str, bool]]]:
    """Top-level module -> (file, imported at module level) for every import."""
    found: dict[str, list[tuple[str, bool]]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            top_level = {id(node) for node in tree.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top in sys.stdlib_module_names or top in PACKAGES:
                        continue
                    where = str(path.relative_to(ROOT))
                    found.setdefault(top, []).append((where, id(node) in top_level))
    return found


def test_every_import_of_the_package_comes_with_the_test_install_or_is_optional():
    installed = _installed_distributions()
    optional = _optional_modules()
    by_module = metadata.packages_distributions()
    problems = []
    for module, places in sorted(_third_party_imports().items()):
        distributions = {_distribution_name(d) for d in by_module.get(module, [])}
        if distributions & installed:
            continue
        if module not in optional:
            problems.append(
                f"{module} (imported by {places[0][0]}) is not installed by .[test,spark]: "
                "add it to the dependencies, or make it an optional extra's module"
            )
            continue
        for where, at_module_level in places:
            if at_module_level:
                problems.append(
                    f"{where} imports the optional module {module} at module level: "
                    "import it inside the function that needs it"
                )
    assert not problems, "\n".join(problems)


def test_optional_modules_belong_to_an_extra_the_test_command_does_not_install():
    project = _project()["project"]
    other_extras = {
        _distribution_name(r)
        for extra, requirements in project["optional-dependencies"].items()
        if extra not in INSTALLED_EXTRAS
        for r in requirements
    }
    # psycopg's module has the distribution's name; an override for anything else is
    # a missing dependency hidden from the type check.
    for module in _optional_modules():
        assert _distribution_name(module) in other_extras, (
            f"mypy may ignore the missing module {module}, which no extra outside "
            f"{INSTALLED_EXTRAS} provides"
        )
