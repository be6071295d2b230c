"""A TCP proxy in front of a bookie that delays, loses and reorders, for kernels
without ``tc netem``.

It runs in the bookie's namespace, listens on the address the bookie advertises and
forwards to the address the bookie is bound to, so every client (writers, readers,
recovery) reaches the bookie through it. Faults come from a JSON control file that
the harness rewrites and the proxy re-reads within ``CONTROL_POLL_S``::

    {"delay_ms": 50, "jitter_ms": 40, "loss_rate": 0.05, "retransmit_ms": 200,
     "direction": "both"}

What each setting does to the bytes, and why that is what the network would do:

- ``delay_ms`` (+ uniform ``jitter_ms``): each chunk read is written out that much
  later. Within one connection chunks keep their order, as TCP keeps it; across
  connections jitter lets a later chunk overtake an earlier one, which is the
  reordering an application can see over TCP.
- ``loss_rate``: TCP turns a lost segment into a retransmission, so the application
  sees a stall, not a hole: a chunk "lost" waits ``retransmit_ms`` more (200 ms,
  Linux's minimum RTO), doubled for each further loss in a row, up to three.
- ``direction``: ``to_target`` (client to bookie), ``from_target`` or ``both``.

Run as ``python -m tests.harness.netns.proxy --listen A:P --target B:Q --control F``;
it prints ``proxy ready A:P`` once listening. Standard library only, so it starts fast.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass

CONTROL_POLL_S = 0.02
CHUNK_BYTES = 64 * 1024
# Chunks held per direction of a connection before the proxy stops reading it
# (back-pressure: a slow link never buffers without bound).
MAX_HELD_CHUNKS = 256
MAX_LOSSES_IN_A_ROW = 3


@dataclass(frozen=True)
class LinkFaults:
    """The faults a proxy applies; the default is none (a plain pass-through)."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_rate: float = 0.0
    retransmit_ms: float = 200.0
    direction: str = "both"

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> LinkFaults:
        raw = json.loads(text) if text.strip() else {}
        return LinkFaults(**raw)

    def applies(self, to_target: bool) -> bool:
        return self.direction == "both" or (self.direction == "to_target") == to_target

    def hold_s(self, rng: random.Random) -> float:
        """How long one chunk is held."""
        held_ms = self.delay_ms + rng.uniform(0.0, self.jitter_ms)
        backoff_ms = self.retransmit_ms
        for _ in range(MAX_LOSSES_IN_A_ROW):
            if rng.random() >= self.loss_rate:
                break
            held_ms += backoff_ms
            backoff_ms *= 2
        return held_ms / 1000.0


class Proxy:
    def __init__(self, target_host: str, target_port: int, control_path: str, seed: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.control_path = control_path
        self.faults = LinkFaults()
        self.rng = random.Random(seed)
        self._control_mtime_ns = -1

    async def watch_control(self) -> None:
        while True:
            with contextlib.suppress(OSError, ValueError, TypeError):
                mtime_ns = os.stat(self.control_path).st_mtime_ns
                if mtime_ns != self._control_mtime_ns:
                    with open(self.control_path, encoding="utf-8") as control:
                        self.faults = LinkFaults.from_json(control.read())
                    self._control_mtime_ns = mtime_ns
            await asyncio.sleep(CONTROL_POLL_S)

    async def serve_connection(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection(
                self.target_host, self.target_port
            )
        except OSError:
            client_writer.close()
            return
        pumps = [
            asyncio.ensure_future(self._pump(client_reader, target_writer, to_target=True)),
            asyncio.ensure_future(self._pump(target_reader, client_writer, to_target=False)),
        ]
        # Either side closing or failing ends the connection, as a TCP peer would see it.
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        for writer in (client_writer, target_writer):
            writer.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, to_target: bool
    ) -> None:
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(MAX_HELD_CHUNKS)
        sender = asyncio.ensure_future(self._send_held(held, writer))
        last_due = 0.0
        try:
            while True:
                chunk = await reader.read(CHUNK_BYTES)
                if not chunk:
                    break
                faults = self.faults
                hold_s = faults.hold_s(self.rng) if faults.applies(to_target) else 0.0
                # Never before an earlier chunk of this connection: TCP keeps order.
                last_due = max(last_due, time.monotonic() + hold_s)
                await held.put((last_due, chunk))
            await held.put((last_due, b""))
            await sender
        finally:
            sender.cancel()

    async def _send_held(
        self, held: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter
    ) -> None:
        while True:
            due, chunk = await held.get()
            wait_s = due - time.monotonic()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            if not chunk:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _main(args: argparse.Namespace) -> None:
    listen_host, listen_port = _host_port(args.listen)
    target_host, target_port = _host_port(args.target)
    proxy = Proxy(target_host, target_port, args.control, args.seed)
    server = await asyncio.start_server(
        proxy.serve_connection, listen_host, listen_port, reuse_address=True
    )
    watcher = asyncio.ensure_future(proxy.watch_control())
    print(f"proxy ready {args.listen}", flush=True)
    async with server:
        await server.serve_forever()
    watcher.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--listen", required=True, help="ADDR:PORT to accept clients on")
    parser.add_argument("--target", required=True, help="ADDR:PORT to forward to")
    parser.add_argument("--control", required=True, help="JSON file of LinkFaults")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args))
    sys.exit(0)


if __name__ == "__main__":
    main()
