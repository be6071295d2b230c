"""``quorumlog shell gc`` picks its bookies from their registrations: each one that
published an admin address is asked, each one that did not is named, and the exit
status says whether every registered bookie was reached."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import pytest

from quorumlog.commands import gc_trigger


class FakeRegistry:
    def __init__(self, published: dict[str, dict[str, str]]) -> None:
        self.published = published

    async def writable_bookies(self) -> list[str]:
        return sorted(self.published)

    async def readonly_bookies(self) -> list[str]:
        return []

    async def read_service_info(self, address: str) -> dict[str, str] | None:
        return self.published.get(address)


class FakeClient:
    def __init__(self, published: dict[str, dict[str, str]]) -> None:
        self.registry = FakeRegistry(published)


def run_gc(
    published: dict[str, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    http: list[str] | None = None,
) -> tuple[int, list[str]]:
    """The exit status and the admin addresses asked, each answering as its bookie."""
    asked: list[str] = []
    by_url = {info["http"]: bookie for bookie, info in published.items() if "http" in info}

    async def one(url: str, major: bool, timeout_s: float, credentials: object) -> dict[str, Any]:
        asked.append(url)
        return {"bookie": by_url[url], "http": url, "major": major, "result": {}}

    monkeypatch.setattr(gc_trigger, "_one", one)
    args = argparse.Namespace(http=http or [], minor=False, timeout=5.0, json=True)
    status = asyncio.run(gc_trigger.run_gc(FakeClient(published), args))
    return status, asked


def test_every_bookie_is_reached_at_the_address_it_published(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    published = {
        "10.0.0.1:3181": {"http": "http://10.0.0.1:8000"},
        "10.0.0.2:3181": {"http": "https://10.0.0.2:8000"},
    }
    status, asked = run_gc(published, monkeypatch)
    assert status == 0
    assert sorted(asked) == ["http://10.0.0.1:8000", "https://10.0.0.2:8000"]
    assert capsys.readouterr().err == ""


def test_a_bookie_without_an_admin_api_is_named_and_fails_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    published = {"10.0.0.1:3181": {"http": "http://10.0.0.1:8000"}, "10.0.0.2:3181": {}}
    status, asked = run_gc(published, monkeypatch)
    assert status == 1
    assert asked == ["http://10.0.0.1:8000"]
    err = capsys.readouterr().err
    assert "10.0.0.2:3181: registered without an admin API (start it with --http-port)" in err
    assert "10.0.0.1:3181" not in err


def test_http_flags_replace_the_published_addresses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    published = {
        "10.0.0.1:3181": {"http": "http://10.0.0.1:8000"},
        "10.0.0.2:3181": {"http": "http://10.0.0.2:8000"},
    }
    status, asked = run_gc(published, monkeypatch, http=["http://10.0.0.2:8000"])
    assert status == 1
    assert asked == ["http://10.0.0.2:8000"]
    assert "10.0.0.1:3181: registered, but no --http reached it" in capsys.readouterr().err
