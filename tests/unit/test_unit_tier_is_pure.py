"""tests/unit holds pure, fast tests: none asks for a temporary directory or makes one,
and none runs a Hypothesis state machine (minutes each: tests/model/). Real files are
tests/local/'s (docs/TESTING.md, Layers)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent


def _unit_conftest_fixtures() -> frozenset[str]:
    """The guard's fixture names, from tests/unit/conftest.py by its path (every layer
    has a conftest module of that name: which one ``import conftest`` finds depends on
    the order pytest collected them in)."""
    spec = importlib.util.spec_from_file_location("unit_conftest", UNIT / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return frozenset(module.DISK_FIXTURES)


DISK_FIXTURES = _unit_conftest_fixtures()
SOURCES = sorted(p for p in UNIT.glob("*.py") if p.name != Path(__file__).name)
# What makes a test touch the disk or run for minutes, as it appears in a source.
_IMPURE = re.compile(
    r"\b(" + "|".join(sorted(DISK_FIXTURES)) + r"|tempfile|mkdtemp|RuleBasedStateMachine)\b"
)


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_no_unit_test_touches_the_disk_or_runs_a_state_machine(source: Path) -> None:
    text = source.read_text()
    if source.name == "conftest.py":
        text = text.split("def pytest_runtest_setup", 1)[1]  # the guard names them
        text = text.split("pytest.fail(", 1)[0]
    found = sorted({m.group(1) for m in _IMPURE.finditer(text)})
    assert not found, f"{source.name} uses {', '.join(found)}: move it to tests/local/"


def test_the_guard_refuses_every_temporary_directory_fixture() -> None:
    assert {"tmp_path", "tmpdir", "tmp_path_factory", "tmpdir_factory"} <= DISK_FIXTURES
