"""Where each ledger's metadata node lives: the flat and the hierarchical layouts.

The flat layout keeps every ledger at ``/ledgers/<id>`` (decimal, no leading zero).
ZooKeeper answers a listing in one packet of at most 1 MB (``jute.maxbuffer``), so a
flat ``/ledgers`` stops being listable at about 80,000 ledgers, and every GC round,
audit and ``listledgers`` lists it whole.

The hierarchical layout (BookKeeper's ``LongHierarchicalLedgerManager``) splits the
zero-padded id into levels of ``level_digits`` digits; ledger 1 with the default 3::

    /ledgers/000/000/000/000/000/000/L001

so no node has more than ``10 ** level_digits`` children (1,000 by default). Ids are
63-bit: at most 19 decimal digits (9,223,372,036,854,775,807). They are padded to the
smallest multiple of ``level_digits`` that is at least 20 digits (21 for 3 digits:
seven levels; 20 for 4: five), at least one digit more than they need, so the first
level is always ``000`` to ``009``. That wasted digit buys something: a first-level
name always begins with a zero, which a flat ledger's name never does (``0`` itself is
one digit, shorter than any level), so the two layouts can share ``/ledgers`` while a
cluster moves from one to the other, and no name can be taken for the other kind. The leaf carries
BookKeeper's ``L`` prefix so a ledger node never looks like a directory. BookKeeper's
own split is 3+4+4+4+4 digits, which ``level_digits=4`` matches but for the leading
``0``. The default is 3: ZooKeeper answers a listing of 10,000 names in about 10 ms,
during which the requests behind it on the server wait, so a scan of 4-digit levels
held a writer's p99 at 3.8x its idle one at 100,000 ledgers, 1,000-name levels at
1.7x (2.35x at a million: docs/PERFORMANCE.md).

``/ledgers/LAYOUT`` (JSON) says which layout new ledgers go to, and the level width.
A store without it whose ``/ledgers`` exists is a flat cluster from before layouts
(served as such); a store without ``/ledgers`` at all is new and gets the marker of
:data:`DEFAULT_LAYOUT` with its first ledger. Reads never trust the marker alone: a
ledger is looked up in both places (:class:`~quorumlog.meta.ledgers.LedgerManager`),
since moves go from flat to hierarchical only, while clients run.

Other names under ``/ledgers`` (the marker, anything an operator left there) match
neither pattern and are skipped; this project's counters, cookies, bookie lists and
under-replication marks live outside ``/ledgers`` (``/counters``, ``/bookies``,
``/underreplication``).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace

from quorumlog.errors import MetadataError, NoSuchLedgerError

LEDGERS_PATH = "/ledgers"
LAYOUT_NAME = "LAYOUT"
LAYOUT_PATH = f"{LEDGERS_PATH}/{LAYOUT_NAME}"

FLAT = "flat"
HIERARCHICAL = "hierarchical"

# 63-bit ids need 19 digits; one more keeps first-level names apart from flat names.
ID_DIGITS_MIN = 20
LEVEL_DIGITS_DEFAULT = 3
LEAF_PREFIX = "L"
LEDGER_ID_MAX = (1 << 63) - 1

# Metadata reads per second of a walk (listings and per-ledger reads) of GC, audits
# and migrations: BookKeeper's BP-66 throttles these background reads so a full scan of
# a million ledgers takes minutes of the store's spare capacity, never its headroom.
WALK_READS_PER_S_DEFAULT = 1000.0


@dataclass(frozen=True, slots=True)
class Layout:
    """A ledger layout: ``kind`` (:data:`FLAT` or :data:`HIERARCHICAL`) and, for the
    hierarchical one, the digits per level (2 to 9: fan-out 100 to 10**9).

    Example::

        layout = Layout.hierarchical()
        layout.path(1)         # '/ledgers/000/000/000/000/000/000/L001'
        layout.path(10_001)    # '/ledgers/000/000/000/000/000/010/L001'
    """

    kind: str = HIERARCHICAL
    level_digits: int = LEVEL_DIGITS_DEFAULT
    marked: bool = True  # False: a flat cluster from before layouts (no marker)
    # False only in a marker made with /ledgers itself: no ledger was ever created in
    # the flat layout there, so a create need not look for one first. Absent (markers
    # set on a cluster that held ledgers, and older markers): True.
    flat_ledgers: bool = True

    def __post_init__(self) -> None:
        if self.kind not in (FLAT, HIERARCHICAL):
            raise MetadataError(f"unknown ledger layout {self.kind!r}")
        if not 2 <= self.level_digits <= 9:
            raise MetadataError(
                f"ledger layout: level_digits must be 2 to 9, got {self.level_digits}"
            )

    @classmethod
    def hierarchical(cls, level_digits: int = LEVEL_DIGITS_DEFAULT) -> Layout:
        return cls(HIERARCHICAL, level_digits)

    @classmethod
    def flat(cls, *, marked: bool = True) -> Layout:
        return cls(FLAT, LEVEL_DIGITS_DEFAULT, marked)

    @property
    def is_hierarchical(self) -> bool:
        return self.kind == HIERARCHICAL

    @property
    def fan_out(self) -> int:
        """The most children a hierarchical level can have."""
        fan_out: int = 10**self.level_digits
        return fan_out

    @property
    def id_digits(self) -> int:
        return -(-ID_DIGITS_MIN // self.level_digits) * self.level_digits

    @property
    def levels(self) -> int:
        return self.id_digits // self.level_digits

    def path(self, ledger_id: int) -> str:
        """Where ledger ``ledger_id`` is created in this layout."""
        return flat_path(ledger_id) if self.kind == FLAT else self.hierarchical_path(ledger_id)

    def hierarchical_path(self, ledger_id: int) -> str:
        check_ledger_id(ledger_id)
        digits = f"{ledger_id:0{self.id_digits}d}"
        width = self.level_digits
        parts = [digits[i : i + width] for i in range(0, len(digits), width)]
        parts[-1] = LEAF_PREFIX + parts[-1]
        return LEDGERS_PATH + "/" + "/".join(parts)

    def is_level_name(self, name: str, depth: int) -> bool:
        """Whether ``name`` is a directory of level ``depth`` (0: right under /ledgers)."""
        if len(name) != self.level_digits or not (name.isascii() and name.isdigit()):
            return False
        return depth > 0 or name[0] == "0"

    def leaf_digits(self, name: str) -> str | None:
        """The last digits of a ledger id if ``name`` is a leaf (``L0001``), else None."""
        digits = name[len(LEAF_PREFIX) :]
        if (
            name.startswith(LEAF_PREFIX)
            and len(digits) == self.level_digits
            and digits.isascii()
            and digits.isdigit()
        ):
            return digits
        return None

    def born_with_ledgers_path(self) -> Layout:
        """This layout as the marker of a store whose /ledgers is created with it."""
        return replace(self, flat_ledgers=False)

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "layout": self.kind,
                "level_digits": self.level_digits,
                "flat_ledgers": self.flat_ledgers,
            }
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Layout:
        try:
            obj = json.loads(data)
            return cls(
                str(obj["layout"]),
                int(obj.get("level_digits", LEVEL_DIGITS_DEFAULT)),
                flat_ledgers=bool(obj.get("flat_ledgers", True)),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MetadataError(f"{LAYOUT_PATH} holds no ledger layout: {data[:80]!r}") from exc


DEFAULT_LAYOUT = Layout.hierarchical()


def check_ledger_id(ledger_id: int) -> int:
    if ledger_id < 0:
        raise NoSuchLedgerError(f"ledger {ledger_id}: ledger ids are not negative")
    if ledger_id > LEDGER_ID_MAX:
        raise NoSuchLedgerError(f"ledger {ledger_id}: ledger ids fit in 63 bits")
    return ledger_id


def flat_path(ledger_id: int) -> str:
    """The path of a ledger in the flat layout."""
    return f"{LEDGERS_PATH}/{check_ledger_id(ledger_id)}"


def flat_ledger_id(name: str) -> int | None:
    """The id a name under ``/ledgers`` stands for in the flat layout, else None
    (a decimal number without a leading zero: never a hierarchical level's name)."""
    if not (name.isascii() and name.isdigit()) or (name[0] == "0" and name != "0"):
        return None
    ledger_id = int(name)
    return ledger_id if ledger_id <= LEDGER_ID_MAX else None


# A listing costs the store (and the lister, which decodes it) about as much as one read
# of a ledger's metadata per this many names it returns: a 10,000-name level is 100
# reads, not one, so that a paced walk of a million ledgers leaves the store idle
# between its listings instead of sending them back to back.
NAMES_PER_READ = 100


class ReadPacer:
    """Spaces metadata reads ``1 / reads_per_s`` apart (None: no limit); a listing
    of many names is charged as the reads it is worth (:data:`NAMES_PER_READ`).

    Example::

        pacer = ReadPacer(1000.0)
        await pacer.wait()      # before each read
        names = await store.children(path)
        pacer.listed(len(names))
    """

    def __init__(self, reads_per_s: float | None) -> None:
        if reads_per_s is not None and reads_per_s <= 0:
            raise MetadataError(f"reads_per_s must be positive or None, got {reads_per_s}")
        self.interval_s = 0.0 if reads_per_s is None else 1.0 / reads_per_s
        self._next_s: float | None = None

    async def wait(self) -> None:
        if not self.interval_s:
            return
        now = asyncio.get_running_loop().time()
        if self._next_s is None or self._next_s < now:
            self._next_s = now
        delay_s = self._next_s - now
        self._next_s += self.interval_s
        if delay_s > 0:
            await asyncio.sleep(delay_s)

    def listed(self, names: int) -> None:
        """After a listing (already paid one read by :meth:`wait`): the next read
        waits as long as the reads the rest of its names are worth."""
        if self.interval_s and self._next_s is not None and names > NAMES_PER_READ:
            self._next_s += (names / NAMES_PER_READ - 1) * self.interval_s
