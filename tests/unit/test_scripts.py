"""The scripts a newcomer runs first (scripts/*.sh) say what they are doing."""

from __future__ import annotations

from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_pip_install_is_announced(script: Path) -> None:
    """A quiet pip install can take minutes: the line before it says what comes."""
    lines = [
        line.strip()
        for line in script.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    installs = [i for i, line in enumerate(lines) if "pip install" in line and "echo" not in line]
    assert installs, f"{script.name}: no pip install"
    for i in installs:
        announced = [
            line
            for line in lines[max(0, i - 4) : i]
            if line.startswith("echo") and "install" in line
        ]
        assert announced, f"{script.name}: nothing said before {lines[i]}"
