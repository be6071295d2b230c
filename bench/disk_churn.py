"""Disk use under churn: what a bookie keeps on disk against the bytes of live ledgers.

Starts ``--bookies`` local bookie processes (journal sync on, small entry logs, garbage
collection and compaction every few seconds) and runs ``--writers`` writers that create
ledgers continuously (``--entries`` entries of ``--entry-size`` bytes each, ensembles of
2, paced to ``--write-bytes-per-s`` of payload). Half of the ledgers are short-lived
(deleted at a random time within ``--short-life-s``), half long-lived (kept; a share
``--long-deleted-fraction`` of them deleted after ``--long-life-s``). Meanwhile:

- **kill -9 during compaction.** After ``--kill-after-s`` the soak watches bookie 0's log
  for the line a compaction writes as it starts a log ("compacting entry log N"),
  kills the bookie with SIGKILL right then and restarts it on the same directories;
- **a disk near its threshold.** The last bookie's ``--disk-usage-threshold`` is set to
  the filesystem's used fraction at the start plus ``--full-headroom-bytes``: once it
  (with whatever else the machine writes) has used that much more, it turns read-only,
  its compaction is suspended, and it becomes writable again as garbage collection
  frees space. No tmpfs or loop device is needed.

Every ``--sample-interval-s`` each bookie is measured: the bytes allocated on disk by
its entry logs and its index (``disk``: what the bound covers), its journal (apart:
bounded by ``--journal-file-max-bytes`` and the checkpoint interval, and usually on
another disk), and the payload bytes of the live ledgers' entries it holds (``live``:
from the ledgers' metadata, i.e. their ensembles and confirmed entries). The bound::

    disk <= 1.2 x live + one entry log (--entry-log-max-bytes)

At the end the writers stop, the short-lived ledgers left are deleted, every bookie is
told to run garbage collection and a major compaction (``PUT /api/v1/bookie/gc``), and
the final sample must hold the bound; every live ledger is then read back whole. The
samples go to ``bench/results/disk-churn-DATE.json`` and a plot beside it::

    python bench/disk_churn.py                       # about 4 minutes
    python bench/disk_churn.py --duration-s 30 --kill-after-s 8 --plot ''   # a short one

Exit status 1 when the final sample breaks the bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import quorumlog.aio as aio
from quorumlog.server.local_cluster import LocalCluster, embedded_metadata_uri

BOUND_FACTOR = 1.2
RESULTS_DIR = Path(__file__).resolve().parent / "results"
_COMPACTING = re.compile(rb"compacting entry log (\d+)")
_ENSEMBLE = 2


# ---------------------------------------------------------------- measuring


def allocated_bytes(path: Path) -> int:
    """Bytes the filesystem allocated to the files under ``path`` (0 if absent)."""
    total = 0
    if not path.exists():
        return 0
    for p in path.rglob("*"):
        try:
            st = p.lstat()
        except FileNotFoundError:
            continue  # removed meanwhile
        if p.is_file():
            total += st.st_blocks * 512
    return total


def data_dir_bytes(data_dir: Path) -> tuple[int, int]:
    """(entry logs, index) bytes on disk; the reserved-space file and cookie are left out."""
    return allocated_bytes(data_dir / "entrylogs"), allocated_bytes(data_dir / "index")


def used_fraction(path: Path) -> tuple[float, int]:
    """The used fraction of ``path``'s filesystem as the bookie's disk checker counts it
    (everything not free to it), and the filesystem's size."""
    usage = shutil.disk_usage(path)
    return (usage.total - usage.free) / usage.total, usage.total


def call(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def read_only(admin: str) -> str | None:
    """Why the bookie is read-only ("" while it is writable; None while it is down)."""
    try:
        state = call("GET", f"{admin}/api/v1/bookie/state")
    except OSError:
        return None  # killed, restarting
    return (state["readOnlyReason"] or "read-only") if state["readOnly"] else ""


# ---------------------------------------------------------------- the workload


@dataclass
class Ledger:
    handle: Any  # the writer's handle: its metadata names the ensembles
    short: bool
    confirmed: int = 0  # entries confirmed so far
    delete_at: float | None = None  # monotonic time; None: kept


@dataclass
class Churn:
    args: argparse.Namespace
    rng: random.Random
    live: dict[int, Ledger] = field(default_factory=dict)
    created: int = 0
    deleted: int = 0
    failed_writes: int = 0
    written_bytes: int = 0

    def live_bytes(self, address: str) -> int:
        """Payload bytes of confirmed entries of live ledgers that ``address`` holds."""
        size = self.args.entry_size
        total = 0
        for ledger in list(self.live.values()):
            ensembles = ledger.handle.metadata.ensembles
            for i, (first, bookies) in enumerate(ensembles):
                end = ensembles[i + 1][0] if i + 1 < len(ensembles) else ledger.confirmed
                end = min(end, ledger.confirmed)
                if address in bookies and end > first:
                    total += (end - first) * size
        return total


def payload(ledger_id: int, entry_id: int, size: int) -> bytes:
    return (b"%d/%d:" % (ledger_id, entry_id)).ljust(size, b"x")


async def writer(bk: Any, churn: Churn, until: float, pace_s: float) -> None:
    """Ledgers one after another until ``until``, each closed once written."""
    a = churn.args
    while time.monotonic() < until and churn.created < a.ledgers:
        churn.created += 1
        started = time.monotonic()
        short = churn.created % 2 == 0
        try:
            handle = await bk.create_ledger(_ENSEMBLE, _ENSEMBLE, _ENSEMBLE)
        except Exception as exc:  # a bookie down or read-only: try again
            churn.failed_writes += 1
            print(f"  create failed: {exc}", flush=True)
            await asyncio.sleep(0.5)
            continue
        ledger = Ledger(handle, short)
        churn.live[handle.ledger_id] = ledger
        try:
            for first in range(0, a.entries, 10):
                last = min(a.entries, first + 10)
                await asyncio.gather(
                    *(
                        handle.append(payload(handle.ledger_id, e, a.entry_size))
                        for e in range(first, last)
                    )
                )
                ledger.confirmed = last
                churn.written_bytes += (last - first) * a.entry_size
            await handle.close()
        except Exception as exc:
            churn.failed_writes += 1
            print(f"  ledger {handle.ledger_id} write failed: {exc}", flush=True)
            ledger.confirmed = max(ledger.confirmed, handle.last_add_confirmed + 1)
            with contextlib.suppress(Exception):
                await handle.close()
        now = time.monotonic()
        if short:
            ledger.delete_at = now + churn.rng.uniform(0, a.short_life_s)
        elif churn.rng.random() < a.long_deleted_fraction:
            ledger.delete_at = now + a.long_life_s + churn.rng.uniform(0, a.long_life_s)
        # Paced: the whole cluster writes about --write-bytes-per-s of payload.
        await asyncio.sleep(max(0.0, pace_s - (time.monotonic() - started)))


async def deleter(bk: Any, churn: Churn, stop: asyncio.Event, everything_short: bool) -> None:
    while True:
        now = time.monotonic()
        due = [
            lid
            for lid, ledger in list(churn.live.items())
            if ledger.delete_at is not None
            and (ledger.delete_at <= now or (everything_short and ledger.short))
        ]
        for ledger_id in due:
            ledger = churn.live.pop(ledger_id)
            try:
                await bk.delete_ledger(ledger_id)
                churn.deleted += 1
            except Exception as exc:  # unknown outcome (R13): counted live, retried
                churn.live[ledger_id] = ledger
                print(f"  delete of ledger {ledger_id} failed: {exc}", flush=True)
        if stop.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


# ---------------------------------------------------------------- the soak


@dataclass
class Soak:
    args: argparse.Namespace
    cluster: LocalCluster
    churn: Churn
    started: float = field(default_factory=time.monotonic)
    samples: list[dict[str, Any]] = field(default_factory=list)
    kills: list[dict[str, Any]] = field(default_factory=list)
    read_only_spells: list[dict[str, Any]] = field(default_factory=list)
    _was_read_only: dict[int, str] = field(default_factory=dict)

    def bound(self, live: int) -> float:
        return BOUND_FACTOR * live + self.args.entry_log_max_bytes

    def sample(self, label: str = "") -> dict[str, Any]:
        at = round(time.monotonic() - self.started, 2)
        row: dict[str, Any] = {"t_s": at, "label": label, "bookies": []}
        for bookie in self.cluster.bookies:
            logs, index = data_dir_bytes(bookie.data_dir)
            journal = allocated_bytes(bookie.journal_dir)
            live = self.churn.live_bytes(bookie.address)
            disk = logs + index
            row["bookies"].append(
                {
                    "bookie": bookie.index,
                    "up": bookie.alive(),
                    "read_only": read_only(bookie.admin_url) if bookie.alive() else None,
                    "entry_log_bytes": logs,
                    "index_bytes": index,
                    "journal_bytes": journal,
                    "disk_bytes": disk,
                    "live_bytes": live,
                    "ratio": round(disk / live, 3) if live else None,
                    "within_bound": disk <= self.bound(live),
                }
            )
        self.samples.append(row)
        for b in row["bookies"]:
            why = b["read_only"]
            if why is not None and why != self._was_read_only.get(b["bookie"], ""):
                self._was_read_only[b["bookie"]] = why
                self.read_only_spells.append({"t_s": at, "bookie": b["bookie"], "why": why})
                print(f"{at:6.1f}s bookie {b['bookie']}: {why or 'writable again'}", flush=True)
        shown = "  ".join(
            f"b{b['bookie']}{'' if b['up'] else '(down)'}{'(ro)' if b['read_only'] else ''} "
            f"{b['disk_bytes'] / 2**20:.1f}/{b['live_bytes'] / 2**20:.1f} MiB"
            + (f" x{b['ratio']:.2f}" if b["ratio"] else "")
            + ("" if b["within_bound"] else " OVER")
            for b in row["bookies"]
        )
        print(f"{at:6.1f}s {label:>6} disk/live {shown}", flush=True)
        return row

    async def sampler(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.sample)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.args.sample_interval_s)

    async def killer(self, stop: asyncio.Event) -> None:
        """Once, after --kill-after-s: kill -9 bookie 0 as it starts compacting a log,
        then restart it on the same directories (and port)."""
        a = self.args
        await asyncio.sleep(a.kill_after_s)
        bookie = self.cluster.bookies[0]
        seen = len(_COMPACTING.findall(bookie.stderr_path.read_bytes()))
        while not stop.is_set():
            text = bookie.stderr_path.read_bytes()
            found = _COMPACTING.findall(text)
            if len(found) > seen:
                self.cluster.kill(0)
                at = round(time.monotonic() - self.started, 2)
                print(
                    f"{at:6.1f}s kill -9 bookie 0 while it compacts entry log {int(found[-1])}",
                    flush=True,
                )
                self.sample("killed")
                await asyncio.sleep(a.down_s)
                await asyncio.to_thread(self.cluster.restart, 0)
                self.kills.append({"t_s": at, "entry_log": int(found[-1])})
                self.sample("back")
                return
            await asyncio.sleep(0.02)
        print("no compaction seen on bookie 0 before the end: no kill", flush=True)

    def force_gc_everywhere(self) -> list[dict[str, Any]]:
        """Garbage collection and a major compaction on every bookie, one at a time."""
        outcomes = []
        for bookie in self.cluster.bookies:
            admin = bookie.admin_url
            call("PUT", f"{admin}/api/v1/bookie/gc", {"major": True})
            deadline = time.monotonic() + self.args.final_timeout_s
            while True:
                state = call("GET", f"{admin}/api/v1/bookie/gc")
                if not state["is_in_force_gc"] and state["last"]:
                    outcomes.append(state["last"])
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"bookie {bookie.index}: gc still running")
                time.sleep(0.1)
        return outcomes


async def read_back(bk: Any, churn: Churn) -> int:
    """Every confirmed entry of every live ledger, byte for byte; how many were read."""
    size = churn.args.entry_size
    count = 0
    for ledger_id, ledger in sorted(churn.live.items()):
        reader = await bk.open_ledger(ledger_id)
        last = ledger.confirmed - 1
        for first in range(0, last + 1, 100):
            got = await reader.read_entries(first, min(last, first + 99))
            for entry in got:
                if entry.data != payload(ledger_id, entry.entry_id, size):
                    raise SystemExit(f"ledger {ledger_id} entry {entry.entry_id} differs")
                count += 1
        await reader.close()
    return count


def bookie_args(a: argparse.Namespace) -> list[str]:
    return [
        *("--gc-interval-ms", str(a.gc_interval_ms)),
        *("--entry-log-max-bytes", str(a.entry_log_max_bytes)),
        *("--journal-file-max-bytes", str(a.journal_file_max_bytes)),
        *("--checkpoint-interval-ms", str(a.checkpoint_interval_ms)),
        *("--minor-compaction-interval-ms", str(a.minor_compaction_interval_ms)),
        *("--major-compaction-interval-ms", str(a.major_compaction_interval_ms)),
        *("--major-compaction-threshold", str(a.major_compaction_threshold)),
        *("--compaction-rate-bytes-per-s", str(a.compaction_rate_bytes_per_s)),
        *("--log-level", "INFO"),
    ]


async def drive(soak: Soak, uri: str) -> dict[str, Any]:
    a = soak.args
    churn = soak.churn
    per_ledger = a.entries * a.entry_size
    pace_s = per_ledger * a.writers / a.write_bytes_per_s
    stop = asyncio.Event()
    async with await aio.BookKeeper.connect(uri) as bk:
        until = time.monotonic() + a.duration_s
        tasks = [
            asyncio.create_task(soak.sampler(stop)),
            asyncio.create_task(soak.killer(stop)),
        ]
        deleting = asyncio.create_task(deleter(bk, churn, stop, everything_short=False))
        await asyncio.gather(*(writer(bk, churn, until, pace_s) for _ in range(a.writers)))
        stop.set()
        await asyncio.gather(*tasks, deleting)
        # The end: the short-lived ledgers still there go, then a final GC + compaction.
        await deleter(bk, churn, stop, everything_short=True)
        soak.sample("writes stopped")
        outcomes = await asyncio.to_thread(soak.force_gc_everywhere)
        final = soak.sample("final")
        entries_read = await read_back(bk, churn)
    return {"final": final, "gc": outcomes, "entries_read": entries_read}


def run_soak(a: argparse.Namespace, base_dir: Path) -> dict[str, Any]:
    """The soak in ``base_dir``; its summary (samples, the final one, the verdict)."""
    uri = embedded_metadata_uri(base_dir)
    with LocalCluster(
        uri, base_dir / "bookies", a.bookies - 1, http_port=0, extra_args=bookie_args(a)
    ) as cluster:
        # The last bookie will take what a fresh one takes (its reserved space, its
        # journal's first file) before it writes anything: the headroom counts from there.
        fraction, total = used_fraction(base_dir)
        fresh = allocated_bytes(cluster.bookies[0].home)
        near_full = min(0.999, fraction + (fresh + a.full_headroom_bytes) / total)
        cluster.start_new_bookie(["--disk-usage-threshold", f"{near_full:.6f}"])
        soak = Soak(a, cluster, Churn(a, random.Random(a.seed)))
        print(
            f"{a.bookies} bookies, entry logs of {a.entry_log_max_bytes / 2**20:.1f} MiB, "
            f"bookie {a.bookies - 1} read-only above {near_full:.6f} of its disk "
            f"({fraction:.6f} used + {a.full_headroom_bytes / 2**20:.0f} MiB headroom); "
            f"load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        outcome = asyncio.run(drive(soak, uri))
    final = outcome["final"]
    # While writes go on (the mass deletion at the end is left out): the bound between
    # garbage-collection and compaction rounds.
    during = [
        b["disk_bytes"] / soak.bound(b["live_bytes"])
        for row in soak.samples
        if row["label"] not in ("writes stopped", "final")
        for b in row["bookies"]
    ]
    worst = max(during, default=0.0)
    over = sum(1 for x in during if x > 1.0) / len(during) if during else 0.0
    summary = {
        "command": " ".join(sys.argv),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
        "bound": f"disk <= {BOUND_FACTOR} x live + {a.entry_log_max_bytes}",
        "disk_counts": "entry logs + index (allocated bytes); journal reported apart",
        "near_full_threshold": near_full,
        "ledgers_created": soak.churn.created,
        "ledgers_deleted": soak.churn.deleted,
        "ledgers_live": len(soak.churn.live),
        "live_ledgers": [
            {"ledger_id": lid, "confirmed": ledger.confirmed, "short": ledger.short}
            for lid, ledger in sorted(soak.churn.live.items())
        ],
        "failed_writes": soak.churn.failed_writes,
        "payload_written_bytes": soak.churn.written_bytes,
        "kills": soak.kills,
        "read_only_spells": soak.read_only_spells,
        "final_gc": outcome["gc"],
        "entries_read_back": outcome["entries_read"],
        "worst_disk_over_bound": round(worst, 3),
        "share_of_samples_over_bound": round(over, 3),
        "final": final,
        "final_within_bound": all(b["within_bound"] for b in final["bookies"]),
        "samples": soak.samples,
    }
    return summary


def plot(summary: dict[str, Any], path: Path) -> Path:
    from quorumlog.bench.plot import pyplot

    plt = pyplot()
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    samples = summary["samples"]
    log_bytes = summary["args"]["entry_log_max_bytes"]
    for i in range(len(samples[0]["bookies"])):
        t = [row["t_s"] for row in samples]
        disk = [row["bookies"][i]["disk_bytes"] / 2**20 for row in samples]
        live = [row["bookies"][i]["live_bytes"] / 2**20 for row in samples]
        bound = [(BOUND_FACTOR * lv * 2**20 + log_bytes) / 2**20 for lv in live]
        (line,) = top.plot(t, disk, label=f"bookie {i} disk")
        top.plot(t, live, linestyle=":", color=line.get_color(), label=f"bookie {i} live")
        bottom.plot(t, [d / b for d, b in zip(disk, bound, strict=True)], label=f"bookie {i}")
    opened: dict[int, float] = {}
    end_s = samples[-1]["t_s"]
    for spell in [
        *summary["read_only_spells"],
        *({"t_s": end_s, "bookie": b, "why": ""} for b in range(len(samples[0]["bookies"]))),
    ]:
        if spell["why"] and spell["bookie"] not in opened:
            opened[spell["bookie"]] = spell["t_s"]
        elif not spell["why"] and spell["bookie"] in opened:
            since = opened.pop(spell["bookie"])
            for axes in (top, bottom):
                axes.axvspan(since, spell["t_s"], color="grey", alpha=0.15)
    for kill in summary["kills"]:
        for axes in (top, bottom):
            axes.axvline(kill["t_s"], color="red", linewidth=0.8)
    bottom.axhline(1.0, color="black", linewidth=0.8)
    top.set_ylabel("MiB (entry logs + index; live payload dotted)")
    bottom.set_ylabel(f"disk / ({BOUND_FACTOR} x live + 1 entry log)")
    bottom.set_xlabel("seconds (red: kill -9 during compaction; grey: a bookie read-only)")
    top.legend(fontsize="x-small", ncol=2)
    bottom.legend(fontsize="x-small", ncol=4)
    figure.suptitle("Bookie disk use under churn")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--duration-s", type=float, default=240)
    p.add_argument("--bookies", type=int, default=4)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--ledgers", type=int, default=2000, help="most ledgers created")
    p.add_argument("--entries", type=int, default=100, help="entries per ledger")
    p.add_argument("--entry-size", type=int, default=4096, help="payload bytes per entry")
    p.add_argument("--write-bytes-per-s", type=float, default=1024 * 1024)
    p.add_argument("--short-life-s", type=float, default=60)
    p.add_argument("--long-life-s", type=float, default=60)
    p.add_argument("--long-deleted-fraction", type=float, default=0.25)
    p.add_argument("--kill-after-s", type=float, default=60)
    p.add_argument("--down-s", type=float, default=2)
    p.add_argument("--full-headroom-bytes", type=int, default=40 * 2**20)
    p.add_argument("--entry-log-max-bytes", type=int, default=2 * 2**20)
    p.add_argument("--journal-file-max-bytes", type=int, default=8 * 2**20)
    p.add_argument("--checkpoint-interval-ms", type=int, default=2000)
    p.add_argument("--gc-interval-ms", type=int, default=2000)
    p.add_argument("--minor-compaction-interval-ms", type=int, default=4000)
    p.add_argument("--major-compaction-interval-ms", type=int, default=10000)
    p.add_argument("--major-compaction-threshold", type=float, default=0.8)
    p.add_argument("--compaction-rate-bytes-per-s", type=int, default=2 * 2**20)
    p.add_argument("--sample-interval-s", type=float, default=3)
    p.add_argument("--final-timeout-s", type=float, default=120)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="JSON summary (default: results/)")
    p.add_argument("--plot", default=None, help="PNG path (default: beside the JSON; '': none)")
    return p


def main() -> int:
    a = parser().parse_args()
    with tempfile.TemporaryDirectory(prefix="disk-churn-") as tmp:
        summary = run_soak(a, Path(tmp))
    out = a.out or RESULTS_DIR / f"disk-churn-{time.strftime('%Y-%m-%d-%H%M')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"samples written to {out}")
    if a.plot != "":
        print(f"plot written to {plot(summary, Path(a.plot or out.with_suffix('.png')))}")
    final = summary["final"]["bookies"]
    print(
        f"{summary['ledgers_created']} ledgers created, {summary['ledgers_deleted']} deleted, "
        f"{summary['ledgers_live']} live; {len(summary['kills'])} kill -9 during compaction; "
        f"while writing, disk / bound at worst {summary['worst_disk_over_bound']:.2f}, over 1 "
        f"in {summary['share_of_samples_over_bound']:.0%} of samples; final: "
        + ", ".join(
            f"bookie {b['bookie']} {b['disk_bytes'] / 2**20:.1f} MiB for "
            f"{b['live_bytes'] / 2**20:.1f} MiB live"
            for b in final
        )
        + ("" if summary["final_within_bound"] else "  BOUND BROKEN")
    )
    return 0 if summary["final_within_bound"] else 1


if __name__ == "__main__":
    sys.exit(main())
