"""What the peer modules of ``bench/compare.py`` share.

- :class:`Processes`: every server process a peer starts, stopped by its pid (also at
  interpreter exit, should a run be interrupted).
- :class:`PeerCluster`: the start and stop steps of a peer's three-server cluster in a
  temporary directory (etcd, ZooKeeper, JetStream): each says how to launch its
  servers and when they are ready.
- :func:`ensure_modules` / :func:`ensure_binary`: install missing (or too old) PyPI
  packages with pip, Debian packages with apt-get, once, and say so on stderr.
- :func:`run_one_at_a_time` and :func:`run_windowed`: the two measurement loops. Both
  time each operation from issue to confirmation into an HDR histogram (microseconds),
  skip ``warmup`` operations, stop after ``time_limit_s`` whatever happens, and return
  the same summary shape as ``quorumlog bench --json``.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

HIST_MAX_US = 60_000_000  # one minute
REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = Path(__file__).resolve().parents[1]


def log(message: str) -> None:
    """A progress line on stderr (stdout of client processes carries their JSON)."""
    print(f"[compare] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ processes


class Processes:
    """Server processes of one peer. ``stop_all`` stops each by its pid: SIGTERM, then
    SIGKILL after ``grace_s``."""

    _registry: list[Processes] = []

    def __init__(self, name: str, grace_s: float = 10.0) -> None:
        self.name = name
        self.grace_s = grace_s
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []
        Processes._registry.append(self)

    def start(
        self,
        args: Sequence[str],
        log_path: Path,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        stdin: int | None = subprocess.DEVNULL,
        stdout_pipe: bool = False,
    ) -> subprocess.Popen[bytes]:
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed in stop_all
        self._logs.append(log_file)
        proc = subprocess.Popen(
            list(args),
            stdin=stdin,
            stdout=subprocess.PIPE if stdout_pipe else log_file,
            stderr=log_file,
            cwd=cwd,
            env=env,
        )
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
        self.procs.clear()
        for log_file in self._logs:
            log_file.close()
        self._logs.clear()

    @classmethod
    def stop_everything(cls) -> None:
        for group in cls._registry:
            group.stop_all()


atexit.register(Processes.stop_everything)


class PeerCluster:
    """A peer's servers on 127.0.0.1, each with a directory under ``base_dir`` (a
    temporary one, removed at :meth:`stop`, unless given). A subclass names itself
    (``NAME``: process labels and the temporary directory), launches its servers
    (:meth:`launch`), says when they serve (:meth:`ready`) and which log to show when
    they do not (``FIRST_LOG``, relative to ``base_dir``)."""

    NAME = "peer"
    READY_WHAT = "peer cluster"
    FIRST_LOG = ""
    START_TIMEOUT_S = 60.0

    def __init__(self, base_dir: Path | None = None) -> None:
        self._own_dir = base_dir is None
        self.base_dir = base_dir or Path(tempfile.mkdtemp(prefix=f"compare-{self.NAME}-"))
        self.procs = Processes(self.NAME)
        self.version = ""

    def launch(self) -> None:
        """Start every server process through ``self.procs``."""
        raise NotImplementedError

    def ready(self) -> bool:
        """Whether the cluster serves (a leader is known)."""
        raise NotImplementedError

    def started(self) -> None:
        """Called once the cluster is ready (e.g. to ask a server its version)."""

    def start(self, timeout_s: float | None = None) -> Self:
        """Launch the servers and wait until :meth:`ready`; on a timeout, stop them and
        raise RuntimeError with the tail of ``FIRST_LOG``."""
        self.launch()
        try:
            wait_until(self.ready, timeout_s or self.START_TIMEOUT_S, self.READY_WHAT)
        except RuntimeError as exc:
            tail = log_tail(self.base_dir / self.FIRST_LOG)
            self.stop()
            raise RuntimeError(f"{exc}\n{tail}") from exc
        self.started()
        return self

    def stop(self) -> None:
        self.procs.stop_all()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together while chosen)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, step_s: float = 0.1) -> None:
    """Poll ``check`` until it is true; RuntimeError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(step_s)
    raise RuntimeError(f"{what}: not ready after {timeout_s:.0f} s")


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ------------------------------------------------------------------ installation


def module_present(module: str) -> bool:
    """Whether ``module`` can be found, without importing it (so a package that is
    installed but whose own dependencies are missing still counts as present)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package of a dotted name
        return False


def requirement_met(requirement: str) -> bool:
    """Whether the installed distribution satisfies a pip ``requirement`` (name and
    version specifiers; extras are ignored). False when it is not installed."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # a bare virtualenv: the copy inside pip, which is always there
        from pip._vendor.packaging.requirements import Requirement

    parsed = Requirement(requirement)
    try:
        installed = importlib.metadata.version(parsed.name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return parsed.specifier.contains(installed, prereleases=True)


def ensure_modules(packages: Sequence[tuple[str | None, str]]) -> list[str]:
    """Install, with this interpreter's pip and in one call, every ``(module, pip
    requirement)`` whose module is missing or whose installed version the requirement
    rules out; then import each module. Returns the requirements installed. A module of
    None is a distribution with nothing to import (a server binary in a wheel): only its
    version is checked.

    One call so that pip resolves them together: a client library may need another
    package at a version it does not declare (etcd-sdk-python's generated code needs
    protobuf >= 5.27.2 and never asks for protobuf at all)."""
    missing = [
        requirement
        for module, requirement in packages
        if (module is not None and not module_present(module)) or not requirement_met(requirement)
    ]
    if missing:
        log(f"installing {' '.join(missing)} (pip)")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", *missing],
            check=True,
            timeout=900,
        )
        importlib.invalidate_caches()
    for module, _ in packages:
        if module is not None:
            importlib.import_module(module)
    return missing


def ensure_debian(package: str, present: Callable[[], bool]) -> None:
    """Install Debian's ``package`` with apt-get unless ``present()`` says it is there."""
    if present():
        return
    log(f"installing {package} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", package]
    if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=900)
        subprocess.run(install, env=env, check=True, capture_output=True, timeout=900)
    if not present():
        raise RuntimeError(f"Debian package {package} installed, but still not usable")


def ensure_binary(binary: str, package: str) -> str:
    """Path of ``binary``, installing Debian's ``package`` with apt-get if it is missing."""
    ensure_debian(package, lambda: shutil.which(binary) is not None)
    found = shutil.which(binary)
    assert found is not None
    return found


# ------------------------------------------------------------------ measurement


def new_histogram() -> HdrHistogram:
    # Imported here: on a fresh clone the comparison installs quorumlog's dependencies
    # (hdrhistogram among them) before anything measures.
    from hdrh.histogram import HdrHistogram

    return HdrHistogram(1, HIST_MAX_US, 3)


def summarize(hist: HdrHistogram, entries: int, seconds: float, **extra: Any) -> dict[str, Any]:
    """The summary shape of ``quorumlog bench --json`` (throughput and latency in ms, the
    latency distribution and histogram computed by the same code as quorumlog's)."""
    from quorumlog.bench.workloads import DISTRIBUTION_PERCENTILES, log_buckets

    rate = entries / seconds if seconds > 0 else 0.0
    return {
        "latency_distribution_ms": [
            [percentile, hist.get_value_at_percentile(percentile) / 1000]
            for percentile in DISTRIBUTION_PERCENTILES
        ],
        "latency_histogram_us": log_buckets(hist),
        "entries": entries,
        "seconds": round(seconds, 3),
        "entries_per_s": round(rate, 1),
        "latency_ms": {
            "p50": hist.get_value_at_percentile(50) / 1000,
            "p99": hist.get_value_at_percentile(99) / 1000,
            "p99.9": hist.get_value_at_percentile(99.9) / 1000,
            "max": hist.get_max_value() / 1000,
            "mean": round(hist.get_mean_value() / 1000, 3),
            "samples": hist.get_total_count(),
        },
        **extra,
    }


def run_one_at_a_time(
    op: Callable[[int], object], entries: int, warmup: int, time_limit_s: float
) -> dict[str, Any]:
    """Call ``op(i)`` (blocking until confirmed) ``warmup + entries`` times, one after the
    other; only the last ``entries`` are measured. Stops early after ``time_limit_s``."""
    hist = new_histogram()
    deadline = time.monotonic() + time_limit_s
    started = time.perf_counter()
    measured = 0
    for i in range(warmup + entries):
        if time.monotonic() > deadline:
            break
        if i == warmup:
            started = time.perf_counter()
        t0 = time.perf_counter_ns()
        op(i)
        if i >= warmup:
            hist.record_value(max(1, (time.perf_counter_ns() - t0) // 1000))
            measured += 1
    seconds = time.perf_counter() - started
    return summarize(hist, measured, seconds, truncated=measured < entries, window=1)


# ``start(i, done)`` issues operation i and arranges for ``done(error_or_None)`` to be
# called (from any thread) once it is confirmed or has failed.
StartOp = Callable[[int, Callable[[BaseException | None], None]], None]


def run_windowed(
    start: StartOp, entries: int, warmup: int, window: int, time_limit_s: float
) -> dict[str, Any]:
    """Issue ``warmup + entries`` operations with at most ``window`` unconfirmed at once.

    Throughput runs from the issue of the first measured operation to the confirmation
    of the last one. Failed operations are counted and not measured; the summary has
    their number and the first error. Stops issuing after ``time_limit_s``.
    """
    hist = new_histogram()
    slots = threading.Semaphore(window)
    lock = threading.Lock()
    all_done = threading.Event()
    state: dict[str, Any] = {"done": 0, "sent": None, "errors": 0, "first_error": "", "last": 0.0}
    total = warmup + entries

    def completion(index: int, t0_ns: int) -> Callable[[BaseException | None], None]:
        def done(error: BaseException | None) -> None:
            now_ns = time.perf_counter_ns()
            with lock:
                if error is not None:
                    state["errors"] += 1
                    state["first_error"] = state["first_error"] or repr(error)
                elif index >= warmup:
                    hist.record_value(max(1, (now_ns - t0_ns) // 1000))
                state["done"] += 1
                state["last"] = now_ns / 1e9
                if state["sent"] is not None and state["done"] >= state["sent"]:
                    all_done.set()
            slots.release()

        return done

    deadline = time.monotonic() + time_limit_s
    started = time.perf_counter()
    sent = 0
    for i in range(total):
        if not slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            break
        if i == warmup:
            started = time.perf_counter()
        start(i, completion(i, time.perf_counter_ns()))
        sent += 1
    with lock:
        state["sent"] = sent
        if state["done"] >= sent:
            all_done.set()
    all_done.wait(timeout=max(5.0, deadline - time.monotonic() + 5.0))
    with lock:
        seconds = state["last"] - started
        measured = max(0, min(sent, state["done"]) - warmup - state["errors"])
        errors, first_error = state["errors"], state["first_error"]
    return summarize(
        hist,
        measured,
        seconds,
        truncated=measured < entries,
        window=window,
        errors=errors,
        first_error=first_error,
    )


def print_json(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def last_json_line(text: str) -> dict[str, Any]:
    """The last line of ``text`` that parses as a JSON object."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                parsed = json.loads(line)
                if isinstance(parsed, dict):
                    return parsed
    raise RuntimeError(f"no JSON result in output: {text[-500:]!r}")


def client_env() -> dict[str, str]:
    """Environment for client processes: ``peers`` and ``quorumlog`` importable."""
    env = dict(os.environ)
    parts = [str(BENCH_DIR), str(REPO_ROOT), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    return env


def run_client(script: Path, args: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """Run ``python script client ARGS`` in its own process and return its JSON result.

    The measuring client has a process of its own, as ``quorumlog bench`` has, so that
    no thread of the comparison script competes with it.
    """
    proc = subprocess.run(
        [sys.executable, str(script), "client", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=client_env(),
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{script.name} client failed ({proc.returncode}): {proc.stderr[-800:]}")
    return last_json_line(proc.stdout)


def add_client_arguments(parser: Any) -> None:
    """The arguments every peer's ``client`` subcommand takes."""
    parser.add_argument("--mode", choices=("one-at-a-time", "pipelined"), required=True)
    parser.add_argument("--entries", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--window", type=int, default=1000, help="pipelined: most in flight")
    parser.add_argument("--entry-size", type=int, default=100)
    parser.add_argument("--time-limit-s", type=float, default=60.0)


def client_arguments(
    mode: str, entries: int, warmup: int, window: int, time_limit_s: float, entry_size: int = 100
) -> list[str]:
    return [
        "--mode",
        mode,
        "--entries",
        str(entries),
        "--warmup",
        str(warmup),
        "--window",
        str(window),
        "--entry-size",
        str(entry_size),
        "--time-limit-s",
        str(time_limit_s),
    ]


def run_modes(
    system: str,
    peer_file: Path,
    target_args: list[str],
    modes: dict[str, dict[str, Any]],
    time_limit_s: float,
) -> dict[str, dict[str, Any]]:
    """Run a peer's client once per mode (``{mode: {entries, warmup, window}}``) against
    the server named by ``target_args``; returns ``{mode: summary}``."""
    results: dict[str, dict[str, Any]] = {}
    for mode, spec in modes.items():
        args = [*target_args, *client_arguments(mode, time_limit_s=time_limit_s, **spec)]
        results[mode] = run_client(peer_file, args, timeout_s=time_limit_s + 60)
        log(f"{system} {mode}: {results[mode]['entries_per_s']:,.0f} appends/s")
    return results
