"""The unit tier is pure and fast: logic in memory, no files, no processes.

A unit test that asks for a temporary directory (``tmp_path``, ``tmpdir`` or their
factories, directly or through another fixture) fails at setup: tests on real files go
to ``tests/local/`` (``test_unit_tier_is_pure.py`` also holds the sources to this).
"""

from __future__ import annotations

import pytest

DISK_FIXTURES = frozenset({"tmp_path", "tmpdir", "tmp_path_factory", "tmpdir_factory"})


def pytest_runtest_setup(item: pytest.Item) -> None:
    asked = DISK_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    if asked:
        pytest.fail(
            f"{item.nodeid} asks for {', '.join(sorted(asked))}: the unit tier touches no "
            f"disk; a test on real files belongs in tests/local/",
            pytrace=False,
        )
