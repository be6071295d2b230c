"""A bookie's bind address and advertised address (``quorumlog bookie --bind-address
--advertised-address``): it listens where it is bound, registers and records in its
cookie the advertised host, and clients reach it at what it registered.

127.0.0.0/8 is loopback on Linux, so 127.0.0.2 stands in for a second interface of this
machine: a bookie bound to it is not reachable at 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import (
    QUORUMLOG_ENV,
    poll_until,
    port_for_a_child,
    run,
    shell,
    start_quorumlog,
    stop_process,
)

from quorumlog.aio import BookKeeper
from quorumlog.bookie.cookie import COOKIE_FILE_NAME
from quorumlog.meta.bookies import BookieRegistry
from quorumlog.meta.factory import open_store
from quorumlog.server.local_cluster import LocalCluster, embedded_metadata_uri


async def _registered(uri: str) -> list[str]:
    store = await open_store(uri)
    try:
        return await BookieRegistry(store).writable_bookies()
    finally:
        await store.close()


async def _write_and_read(uri: str, count: int) -> list[bytes]:
    bk = await BookKeeper.connect(uri)
    try:
        ledger = await bk.create_ledger(3, 3, 3)  # every bookie holds every entry
        for i in range(count):
            await ledger.add_entry(b"entry-%d" % i)
        await ledger.close()
        reader = await bk.open_ledger(ledger.ledger_id)
        entries = await reader.read_entries(0, count - 1)
        await reader.close()
        return [entry.data for entry in entries]
    finally:
        await bk.close()


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def test_bookies_bound_to_every_interface_register_the_advertised_host(
    metadata_uri: str, tmp_path: Path
) -> None:
    """Bound to 0.0.0.0, advertised as ``localhost``: the registry and the cookie name
    ``localhost:PORT``, and a client that knows only the registry writes and reads."""
    args = ["--bind-address", "0.0.0.0", "--advertised-address", "localhost"]
    with LocalCluster(metadata_uri, tmp_path / "c", 3, extra_args=args, journal_sync=False) as c:
        assert all(address.startswith("localhost:") for address in c.addresses), c.addresses
        assert sorted(run(_registered(metadata_uri))) == sorted(c.addresses)
        cookie = (c.bookies[0].data_dir / COOKIE_FILE_NAME).read_text()
        assert c.addresses[0] in cookie
        assert run(_write_and_read(metadata_uri, 5)) == [b"entry-%d" % i for i in range(5)]


def test_a_bookie_listens_only_on_its_bind_address(tmp_path: Path) -> None:
    uri = embedded_metadata_uri(tmp_path)
    args = ["--bind-address", "127.0.0.2"]
    with LocalCluster(uri, tmp_path / "c", 1, extra_args=args, journal_sync=False) as cluster:
        address = cluster.addresses[0]
        host, _, port = address.rpartition(":")
        assert host == "127.0.0.2"  # advertised: the bind address by default
        assert _accepts("127.0.0.2", int(port))
        assert not _accepts("127.0.0.1", int(port))


def test_a_bookie_keeps_its_advertised_identity_across_restarts(tmp_path: Path) -> None:
    """The cookie records the advertised host: the same directories under another
    advertised address refuse to start, as BookKeeper's bookies do."""
    uri = embedded_metadata_uri(tmp_path)
    args = ["--bind-address", "0.0.0.0", "--advertised-address", "localhost"]
    with LocalCluster(uri, tmp_path / "c", 1, extra_args=args, journal_sync=False) as cluster:
        first = cluster.addresses[0]
        cluster.stop(0)
        assert cluster.restart(0) == first  # same flags, port from the cookie
        cluster.stop(0)
        cluster.extra_args = ["--bind-address", "127.0.0.1"]
        cluster.restart(0, wait=False)
        assert cluster.wait_exit(0) == 2
        stderr = cluster.bookies[0].stderr_text()
        assert "refusing to start" in stderr and first in stderr
        assert "--advertised-address" in stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--bind-address", "0.0.0.0"], "give --advertised-address"),
        (["--advertised-address", "db1:3181"], "no port"),
        (["--bind-address", "0.0.0.0", "--advertised-address", "0.0.0.0"], "not an address"),
    ],
)
def test_bookie_address_flags_refuse_what_no_client_could_reach(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "quorumlog", "bookie", "--data-dir", str(tmp_path), *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=QUORUMLOG_ENV,
    )
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["db", "serve", "--name", "x", "--data-dir", "."], "give --advertised-address"),
        (["autorecovery", "--advertised-address", "h:1"], "no port"),
    ],
)
def test_db_and_autorecovery_address_flags_refuse_unreachable_addresses(
    tmp_path: Path, command: list[str], message: str
) -> None:
    if command[0] == "db":
        command = [*command, "--http-addr", "0.0.0.0:4001"]
    done = subprocess.run(
        [sys.executable, "-m", "quorumlog", *command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env=QUORUMLOG_ENV,
    )
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def three_bookies(tmp_path: Path) -> Iterator[LocalCluster]:
    uri = embedded_metadata_uri(tmp_path)
    with LocalCluster(uri, tmp_path / "c", 3, journal_sync=False) as cluster:
        yield cluster


def _nodes(addr: str) -> dict[str, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://{addr}/nodes", timeout=5) as answer:
            nodes: dict[str, dict[str, object]] = json.loads(answer.read())
            return nodes
    except OSError:
        return {}


def test_db_replica_and_autorecovery_publish_their_advertised_addresses(
    three_bookies: LocalCluster, tmp_path: Path
) -> None:
    """A database replica bound to every interface publishes its advertised HTTP address
    in the election (where followers forward writes); an autorecovery daemon's identifier
    and admin API address carry its advertised host, and the API listens everywhere."""
    uri = three_bookies.metadata_uri
    port = port_for_a_child()
    db_args = ["db", "serve", "--metadata", uri, "--name", "hosts", "--data-dir"]
    db_args += [str(tmp_path / "db"), "--http-addr", f"0.0.0.0:{port}"]
    db = start_quorumlog(tmp_path, "db", [*db_args, "--http-adv-addr", "localhost"])
    ar_args = ["autorecovery", "--metadata", uri, "--http-port", "0"]
    ar_args += ["--bind-address", "0.0.0.0", "--advertised-address", "localhost"]
    daemon = start_quorumlog(tmp_path, "ar", ar_args)
    try:
        me = f"localhost:{port}"
        poll_until(lambda: me in _nodes(me), timeout_s=60, interval_s=0.2, what="replica listed")
        assert _nodes(me)[me]["api_addr"] == f"http://{me}"
        expected = f"localhost:{daemon.pid}"
        poll_until(
            lambda: shell(uri, "whoisauditor").stdout.strip() == expected,
            timeout_s=60,
            interval_s=0.5,
            what="auditor named by its advertised host",
        )
        printed = (tmp_path / "ar.out").read_text().split()
        admin_url = printed[printed.index("admin") + 1]
        assert admin_url.startswith("http://localhost:")
        with urllib.request.urlopen(f"{admin_url}/heartbeat", timeout=10) as answer:
            assert json.loads(answer.read()) == {"status": "OK"}
    finally:
        stop_process(db)
        stop_process(daemon)
