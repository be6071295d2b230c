"""The floor under large appends on this machine: what three bookies' kernel work alone costs.

Three server processes and one client on loopback do what a 3/3/2 ledger's large
appends make the kernel do, with no protocol, no checksums and almost no Python per
entry: the client sends each entry to all three servers (``--in-flight`` at once,
waiting for the second answer of the oldest as an ack quorum of 2 does); each server
receives whatever has arrived into one reused buffer, appends it to a journal file
(one ``write``), ``fdatasync``s it, drops the synced pages from the page cache, copies
the entries into a 4 MiB entry-log buffer written with ``pwrite`` when full (pages more
than 256 MiB behind dropped, as the bookie does), and answers each entry with 8 bytes.

Its entries per second and CPU per entry (all four processes, user + system, from
``/proc``) bound what the real write path can reach here: every copy and system call
it makes, quorumlog's path makes too, with the protocol's own work on top::

    python bench/large_entry_floor.py --entry-size 65536 --entries 6000

With ``--direct`` the servers write as bookies do by default: journal and entry log
around the page cache (``O_DIRECT``, from page-aligned buffers: each batch copied
into one and padded to a 4 KiB block, the entry log in 4 MiB blocks). Every entry
then reaches the disk twice on each server within the run, so the disk's bandwidth
(six times the entries' bytes) bounds the rate rather than the CPU::

    python bench/large_entry_floor.py --entries 6000 --direct
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import select
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from multiprocessing import Process, Queue

from quorumlog.bench.workloads import processes_cpu_s

_HEADER = struct.Struct(">I")
_ACK = b"\x00" * 8
_ENTRY_LOG_BUFFER_BYTES = 4 * 1024 * 1024
_ENTRY_LOG_CACHED_BYTES = 256 * 1024 * 1024
_JOURNAL_DROP_STEP_BYTES = 1024 * 1024
_BLOCK_BYTES = 4096  # direct writes' alignment


def _machine_busy_s() -> float:
    """CPU time of the whole machine, kernel threads (writeback) included."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _batches(ports: Queue, frame: int) -> Iterator[memoryview]:  # type: ignore[type-arg]
    """Accept the client and yield each batch of whole entries received (as one read of
    the socket brought them); each entry is answered once the caller is done with it."""
    listener = socket.create_server(("127.0.0.1", 0))
    ports.put(listener.getsockname()[1])
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    view = memoryview(bytearray(frame * 64))
    have = 0
    while True:
        try:
            n = conn.recv_into(view[have:])
        except ConnectionResetError:
            n = 0
        if not n:
            return
        have += n
        whole = have // frame * frame
        if not whole:
            continue
        yield view[:whole]
        conn.sendall(_ACK * (whole // frame))
        view[: have - whole] = view[whole:have]
        have -= whole


def _serve(directory: str, entry_size: int, ports: Queue) -> None:  # type: ignore[type-arg]
    frame = _HEADER.size + entry_size
    journal = os.open(os.path.join(directory, "journal"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    entry_log = os.open(os.path.join(directory, "entrylog"), os.O_WRONLY | os.O_CREAT)
    log_buffer = bytearray(_ENTRY_LOG_BUFFER_BYTES + frame * 64)
    log_fill = log_offset = log_dropped = journal_end = journal_dropped = 0
    for batch in _batches(ports, frame):
        whole = len(batch)
        os.write(journal, batch)  # the journal: one write, one sync per batch
        os.fdatasync(journal)
        journal_end += whole
        if journal_end - journal_dropped >= _JOURNAL_DROP_STEP_BYTES:
            os.posix_fadvise(
                journal, journal_dropped, journal_end - journal_dropped, os.POSIX_FADV_DONTNEED
            )
            journal_dropped = journal_end - journal_end % 4096
        log_buffer[log_fill : log_fill + whole] = batch  # the entry log's copy
        log_fill += whole
        if log_fill >= _ENTRY_LOG_BUFFER_BYTES:
            os.pwrite(entry_log, memoryview(log_buffer)[:log_fill], log_offset)
            log_offset += log_fill
            log_fill = 0
            if log_offset - _ENTRY_LOG_CACHED_BYTES - log_dropped >= 16 * 1024 * 1024:
                drop_to = log_offset - _ENTRY_LOG_CACHED_BYTES
                start = max(0, log_dropped - (16 << 20))
                os.posix_fadvise(entry_log, start, drop_to - start, os.POSIX_FADV_DONTNEED)
                log_dropped = drop_to


def _serve_direct(directory: str, entry_size: int, ports: Queue) -> None:  # type: ignore[type-arg]
    """As :func:`_serve`, with both files written around the page cache."""
    frame = _HEADER.size + entry_size
    flags = os.O_WRONLY | os.O_CREAT | os.O_DIRECT
    journal = os.open(os.path.join(directory, "journal"), flags)
    entry_log = os.open(os.path.join(directory, "entrylog"), flags)
    staged = memoryview(mmap.mmap(-1, frame * 64 + 2 * _BLOCK_BYTES))
    logged = memoryview(mmap.mmap(-1, _ENTRY_LOG_BUFFER_BYTES + frame * 64 + _BLOCK_BYTES))
    log_fill = log_offset = journal_end = 0
    for batch in _batches(ports, frame):
        whole = len(batch)
        padded = -(-whole // _BLOCK_BYTES) * _BLOCK_BYTES
        staged[:whole] = batch  # the journal: one aligned write, one sync per batch
        os.pwrite(journal, staged[:padded], journal_end)
        journal_end += padded
        os.fdatasync(journal)
        logged[log_fill : log_fill + whole] = batch  # the entry log's copy
        log_fill += whole
        if log_fill >= _ENTRY_LOG_BUFFER_BYTES:
            out = log_fill // _BLOCK_BYTES * _BLOCK_BYTES
            os.pwrite(entry_log, logged[:out], log_offset)
            log_offset += out
            logged[: log_fill - out] = logged[out:log_fill]
            log_fill -= out


def run(entry_size: int, entries: int, in_flight: int, direct: bool = False) -> dict[str, float]:
    ports: Queue = Queue()  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory(prefix="quorumlog-floor-") as scratch:
        servers = []
        for n in range(3):
            directory = os.path.join(scratch, f"server-{n}")
            os.mkdir(directory)
            serve = _serve_direct if direct else _serve
            servers.append(Process(target=serve, args=(directory, entry_size, ports)))
            servers[-1].start()
        conns = [socket.create_connection(("127.0.0.1", ports.get())) for _ in servers]
        for conn in conns:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = os.urandom(entry_size)
        header = _HEADER.pack(entry_size)
        acked = [0, 0, 0]
        pids = [os.getpid(), *(s.pid for s in servers if s.pid)]
        cpu_before = [processes_cpu_s([pid]) for pid in pids]
        machine_before = _machine_busy_s()
        started = time.perf_counter()
        sent = 0
        while min(sorted(acked)[1], entries) < entries:
            while sent < entries and sent - sorted(acked)[1] < in_flight:
                for conn in conns:
                    conn.sendmsg([header, payload])
                sent += 1
            readable, _, _ = select.select(conns, [], [], 5.0)
            for conn in readable:  # the answers that have come
                n = conns.index(conn)
                acked[n] += len(conn.recv(65536)) // len(_ACK)
        seconds = time.perf_counter() - started
        cpu = [
            processes_cpu_s([pid]) - before for pid, before in zip(pids, cpu_before, strict=True)
        ]
        machine_s = _machine_busy_s() - machine_before
        for conn in conns:
            conn.close()
        for server in servers:
            server.join(30)
    return {
        "entries_per_s": round(entries / seconds, 1),
        "mb_per_s": round(entries * entry_size / seconds / 1e6, 1),
        "cpu_us_per_entry_client": round(cpu[0] / entries * 1e6, 1),
        "cpu_us_per_entry_servers": round(sum(cpu[1:]) / entries * 1e6, 1),
        # Everything the machine did meanwhile (writeback threads, and any other work).
        "machine_cpu_us_per_entry": round(machine_s / entries * 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--entry-size", type=int, default=65536)
    parser.add_argument("--entries", type=int, default=6000)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument(
        "--direct", action="store_true", help="write around the page cache (O_DIRECT)"
    )
    args = parser.parse_args(argv)
    print(json.dumps(run(args.entry_size, args.entries, args.in_flight, args.direct)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
