"""The namespace layer itself, as root: hosts on a private bridge, one-way cuts that
drop in one direction only, healing, the fault proxy's delay, and removal of every
namespace at the end. A machine where namespaces cannot be made fails here, saying so."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.netns.nemesis import netem_arguments
from tests.harness.netns.network import (
    Host,
    Network,
    netem_available,
    netns_unavailable_reason,
    socket_in_namespace,
)
from tests.harness.netns.proxy import LinkFaults

UDP_PORT = 7100


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.fail(f"the namespace suite cannot run here: {reason}", pytrace=False)
    with Network.create() as net:
        yield net


def _udp_arrives(sender: Host, receiver: Host) -> bool:
    """Whether a datagram from ``sender`` reaches ``receiver`` (sockets made inside
    their namespaces; five tries, half a second to arrive)."""
    with (
        socket_in_namespace(receiver.namespace, socket.SOCK_DGRAM) as inbox,
        socket_in_namespace(sender.namespace, socket.SOCK_DGRAM) as outbox,
    ):
        inbox.bind((receiver.address, UDP_PORT))
        inbox.settimeout(0.5)
        for _ in range(5):
            outbox.sendto(b"hello", (receiver.address, UDP_PORT))
        try:
            return inbox.recv(100) == b"hello"
        except TimeoutError:
            return False


def test_hosts_reach_each_other_and_a_cut_drops_one_direction_only(network: Network) -> None:
    a, b = network.add_host("a"), network.add_host("b")
    assert _udp_arrives(a, b) and _udp_arrives(b, a)
    network.cut(a, b)
    assert not _udp_arrives(a, b), "a cut link still carried a datagram"
    assert _udp_arrives(b, a), "the other direction of a one-way cut was lost"
    network.heal()
    assert network.cuts == set()
    assert _udp_arrives(a, b)


def test_a_partition_is_silence_not_an_error(network: Network) -> None:
    """A cut link behaves as a pulled cable: connecting times out (no fast refusal)."""
    client, server = network.add_host("c"), network.add_host("s")
    network.isolate(server)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        client.connect(server.address, 9, timeout_s=0.5)
    assert time.monotonic() - started >= 0.5
    network.heal()
    with pytest.raises(ConnectionRefusedError):  # healed: the host answers (nothing listens)
        client.connect(server.address, 9, timeout_s=5)


def test_the_proxy_delays_each_direction_and_keeps_order(network: Network, tmp_path: Path) -> None:
    host = network.add_host("p")
    front = network.add_address(host)
    control = tmp_path / "faults.json"
    control.write_text(LinkFaults(delay_ms=100).to_json())
    echo = host.popen(
        [sys.executable, "-c",
         "import socket; s=socket.socket();"
         "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
         f"s.bind(('{host.address}', 7200)); s.listen();\n"
         "while True:\n c,_=s.accept()\n while d:=c.recv(100): c.sendall(d)"],
    )  # fmt: skip
    proxy = host.popen(
        [sys.executable, "-m", "tests.harness.netns.proxy", "--listen", f"{front}:7200",
         "--target", f"{host.address}:7200", "--control", str(control)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proxy.stdout is not None and proxy.stdout.readline().startswith(b"proxy ready")
        client = network.add_host("pc")
        sock = _connect_retrying(client, front, 7200)
        with sock:
            started = time.monotonic()
            for i in range(3):
                sock.sendall(b"%d;" % i)
            received = b""
            while received.count(b";") < 3:
                received += sock.recv(100)
            elapsed_s = time.monotonic() - started
        assert received == b"0;1;2;"  # in order, as TCP keeps it
        assert elapsed_s >= 0.2, f"a 100 ms delay each way took only {elapsed_s:.3f} s"
    finally:
        for process in (proxy, echo):
            process.kill()
            process.wait(timeout=10)


def _connect_retrying(client: Host, address: str, port: int) -> socket.socket:
    deadline = time.monotonic() + 10
    while True:
        try:
            return client.connect(address, port, timeout_s=5)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_link_faults_hold_chunks_for_delay_jitter_and_retransmissions() -> None:
    import random

    rng = random.Random(1)
    assert LinkFaults().hold_s(rng) == 0.0
    held = [LinkFaults(delay_ms=10, jitter_ms=20).hold_s(rng) for _ in range(200)]
    assert all(0.010 <= h <= 0.030 for h in held) and max(held) - min(held) > 0.01
    lossy = [LinkFaults(loss_rate=1.0).hold_s(rng) for _ in range(3)]
    assert lossy == [pytest.approx(1.4)] * 3  # three retransmissions: 0.2 + 0.4 + 0.8 s
    assert LinkFaults(direction="to_target").applies(True)
    assert not LinkFaults(direction="to_target").applies(False)


def test_removal_leaves_no_namespace_and_the_machine_untouched() -> None:
    before_links = subprocess.run(["ip", "-brief", "link"], capture_output=True, text=True).stdout
    before_routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    with Network.create() as net:
        net.add_host("x")
        prefix = net.prefix
        net.partition([net.hosts["x"]], [net.add_host("y")])
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix not in namespaces
    assert (
        subprocess.run(["ip", "-brief", "link"], capture_output=True, text=True).stdout
        == before_links
    )
    assert subprocess.run(["ip", "route"], capture_output=True, text=True).stdout == before_routes


def test_a_machine_without_namespaces_gets_a_reason_not_a_skip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The suite's fixtures fail with this reason (pytest.fail), never skip."""
    import os
    import shutil

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "need root" in (netns_unavailable_reason() or "")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "iproute2" in (netns_unavailable_reason() or "")


def test_netem_is_probed_without_touching_the_machine_and_its_arguments_match() -> None:
    """Delay, jitter and loss go to netem where the kernel has it (not here: the probe
    says so, and leaves no namespace behind); the arguments mirror the proxy's faults."""
    namespaces_before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    assert isinstance(netem_available(), bool)
    namespaces_after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    assert "qlnetem" not in namespaces_after.stdout
    assert namespaces_after.stdout.count("qlnetem") == namespaces_before.stdout.count("qlnetem")
    assert netem_arguments(LinkFaults()) == ["netem"]
    assert netem_arguments(LinkFaults(delay_ms=30, jitter_ms=10, loss_rate=0.2)) == [
        "netem", "delay", "35ms", "5ms", "loss", "20%",
    ]  # fmt: skip
