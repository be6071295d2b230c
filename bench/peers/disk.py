"""The disk under the temporary directory: sequential write bandwidth and fdatasync latency.

Bandwidth is what ``dd if=/dev/zero of=FILE bs=1M count=256 conv=fdatasync`` reports
(bytes over seconds, including the final fdatasync); the latency is that of
``fdatasync`` after each small append, the cost a journal pays per group commit.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

_DD_LINE = re.compile(r"^(\d+) bytes .* copied, ([\d.]+) s", re.MULTILINE)


def parse_dd(stderr: str) -> float:
    """MB/s (10^6 bytes) from dd's summary line, e.g.
    ``268435456 bytes (268 MB, 256 MiB) copied, 1.07 s, 250 MB/s``."""
    match = _DD_LINE.search(stderr)
    if not match:
        raise ValueError(f"no dd summary line in {stderr!r}")
    return int(match.group(1)) / float(match.group(2)) / 1e6


def dd_bandwidth(directory: str | None = None, count_mib: int = 256) -> dict[str, Any]:
    directory = directory or tempfile.gettempdir()
    fd, path = tempfile.mkstemp(prefix="compare-dd-", dir=directory)
    os.close(fd)
    command = ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={count_mib}", "conv=fdatasync"]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    finally:
        os.unlink(path)
    return {
        "command": " ".join([*command[:2], "of=<tmp file>", *command[3:]]),
        "directory": directory,
        "mb_per_s": round(parse_dd(proc.stderr), 1),
        "dd_output": proc.stderr.strip().splitlines()[-1],
    }


def dd_parallel(streams: int = 3, directory: str | None = None, count_mib: int = 256) -> dict:
    """The same dd, ``streams`` at once (one per replica): total MB over the slowest's time.

    A virtual disk can take several streams faster than one; this is the figure to hold
    three bookies' journals against, next to the single stream the target names.
    """
    directory = directory or tempfile.gettempdir()
    paths, procs = [], []
    started = time.perf_counter()
    try:
        for _ in range(streams):
            fd, path = tempfile.mkstemp(prefix="compare-dd-", dir=directory)
            os.close(fd)
            paths.append(path)
            procs.append(
                subprocess.Popen(
                    [
                        "dd",
                        "if=/dev/zero",
                        f"of={path}",
                        "bs=1M",
                        f"count={count_mib}",
                        "conv=fdatasync",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        outputs = [proc.communicate(timeout=300)[1] for proc in procs]
        elapsed_s = time.perf_counter() - started
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for path in paths:
            os.unlink(path)
    per_stream = [round(parse_dd(text), 1) for text in outputs]
    total_bytes = streams * count_mib * 2**20
    return {
        "streams": streams,
        "mb_per_s": round(total_bytes / elapsed_s / 1e6, 1),
        "per_stream_mb_per_s": per_stream,
    }


def fdatasync_latency(directory: str | None = None, count: int = 500) -> dict[str, Any]:
    """p50/p99 in ms of fdatasync after each 100-byte append to one file."""
    return _sync_summary(_append_and_sync(directory, count=count))


def _append_and_sync(
    directory: str | None, *, count: int | None = None, seconds: float = 0.0, pause_s: float = 0.0
) -> list[float]:
    """Seconds each fdatasync took after a 100-byte append to one new file: ``count`` of
    them, or as many as fit in ``seconds``, ``pause_s`` apart."""
    fd, path = tempfile.mkstemp(prefix="compare-sync-", dir=directory)
    samples: list[float] = []
    end = time.monotonic() + seconds
    try:
        while (len(samples) < count) if count is not None else (time.monotonic() < end):
            os.write(fd, b"x" * 100)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            samples.append(time.perf_counter() - t0)
            if pause_s:
                time.sleep(pause_s)
    finally:
        os.close(fd)
        os.unlink(path)
    return samples


def _sync_summary(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    count = len(ordered)
    return {
        "samples": count,
        "p50_ms": round(ordered[count // 2] * 1e3, 3),
        "p99_ms": round(ordered[min(count - 1, count * 99 // 100)] * 1e3, 3),
    }


def fdatasync_beside_bulk(
    directory: str, bulk_bytes_per_s: float, seconds: float = 5.0, rounds: int = 2
) -> dict[str, Any]:
    """The disk's own answer to "what does bulk writing cost a journal": p99 of
    fdatasync after each 100-byte append, alone and beside a second process writing
    ``bulk_bytes_per_s`` (1 MiB writes, an fdatasync every 4 MiB) to the same disk.
    Windows alternate ``rounds`` times; ``ratio`` is beside over alone, all windows."""
    samples: dict[str, list[float]] = {"alone": [], "beside": []}
    for _ in range(rounds):
        for window in ("alone", "beside"):
            bulk = None
            if window == "beside":
                bulk = subprocess.Popen(
                    [sys.executable, __file__, "--bulk", directory, str(bulk_bytes_per_s)]
                )
            try:
                # pause_s: a journal's pace, not a tight loop
                samples[window] += _append_and_sync(directory, seconds=seconds, pause_s=0.0005)
            finally:
                if bulk is not None:
                    bulk.terminate()
                    bulk.wait(timeout=30)
    out: dict[str, Any] = {"bulk_mb_per_s": round(bulk_bytes_per_s / 1e6, 1)}
    for window, values in samples.items():
        out[window] = _sync_summary(values)
    out["p99_ratio"] = round(out["beside"]["p99_ms"] / out["alone"]["p99_ms"], 2)
    return out


def _bulk_writer(directory: str, bytes_per_s: float) -> None:
    """Writes 1 MiB at a time at ``bytes_per_s`` until terminated, reusing one 64 MiB file."""
    fd, path = tempfile.mkstemp(prefix="floor-bulk-", dir=directory)
    chunk = b"y" * (1 << 20)
    started = time.monotonic()
    written = 0
    try:
        while True:
            if written % (64 << 20) == 0:
                os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, chunk)
            written += len(chunk)
            if written % (4 << 20) == 0:
                os.fdatasync(fd)
            time.sleep(max(0.0, started + written / bytes_per_s - time.monotonic()))
    finally:
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__" and sys.argv[1:2] == ["--bulk"]:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _bulk_writer(sys.argv[2], float(sys.argv[3]))
