"""Who owns a ledger, and whether its owner still refers to it: pure decisions.

Ledgers that quorumlog creates for its own use carry their owner in their custom
metadata (as BookKeeper users tag theirs: Pulsar's ``application``/``component``):

- ``application=quorumlog`` and ``component`` one of ``log`` (a log stream's ledger:
  the writer's, or a database's log), ``dbsnapshot`` (a database snapshot) or
  ``spark-sink`` (a Spark task's staged ledger);
- the owner's name, under the key the owner always used: ``log`` (the log's name, for
  log and sink ledgers), ``dbsnapshot`` (the database's log name), and ``spark.write``
  (the write's staging token) for a sink's ledger.

A ledger without ``application=quorumlog`` is a user's (created with the raw API) and
is never an orphan here, whatever else its tags say.

Every deletion path records its intent before it deletes a ledger: the referring node
is changed first (a log's node deleted, its list truncated, a snapshot dropped from the
database's list, a staged ledger's registration deleted), the ledgers after. A crash
between the two leaves ledgers nothing refers to, never a reference to a ledger that is
gone (a database's snapshot list also names the snapshots it dropped until they are
deleted). :func:`decide` tells those ledgers from live ones, from what the referring node
says (:class:`OwnerView`, read by the caller after a ``sync``, R18).

A ledger that its owner may still be about to refer to is not an orphan until it is
older than ``min_age_ms``: a log writer's new ledger (created open, not yet appended:
its id lies above every listed one, or the log node was deleted and may be created
again under the same name), a snapshot being written (created, recorded only once
closed). A log ledger that its log does not list and that is closed, or lies below the
newest listed one, can never be appended (a writer appends only the open ledger it
has just created, and a list's ids only grow); a sink ledger neither listed nor
registered belongs to a write that ended, and one whose write's staging shows no life
for as long as the sink's own sweep waits belongs to a write whose driver died: those
are orphans whatever their age.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

TAG_APPLICATION = "application"
TAG_COMPONENT = "component"
APPLICATION = b"quorumlog"

LOG = "log"
DB_SNAPSHOT = "dbsnapshot"
SPARK_SINK = "spark-sink"
COMPONENTS = (LOG, DB_SNAPSHOT, SPARK_SINK)

# The key that names the owner, per component (kept from before the component tag).
_NAME_KEY = {LOG: "log", DB_SNAPSHOT: "dbsnapshot", SPARK_SINK: "log"}
TAG_SPARK_WRITE = "spark.write"
_WRITE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*")


def ownership_tags(component: str, name: str) -> dict[str, bytes]:
    """The custom metadata that says ``component`` ``name`` owns a ledger."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown owner component {component!r}: expected one of {COMPONENTS}")
    return {
        TAG_APPLICATION: APPLICATION,
        TAG_COMPONENT: component.encode(),
        _NAME_KEY[component]: name.encode(),
    }


@dataclass(frozen=True, slots=True)
class Owner:
    """What a ledger's tags say owns it: a component and its name (the log's, or the
    database's log), and for a sink's ledger the write (staging token) it was staged by."""

    component: str
    name: str
    write: str | None = None

    def __str__(self) -> str:
        if self.write is not None:
            return f"{self.component} {self.name} (write {self.write})"
        return f"{self.component} {self.name}"


def owner_of(custom_metadata: Mapping[str, bytes]) -> Owner | None:
    """The owner a ledger's tags name; None for a user's ledger (or tags that do not
    make sense: such a ledger is left alone)."""
    if custom_metadata.get(TAG_APPLICATION) != APPLICATION:
        return None
    try:
        component = custom_metadata[TAG_COMPONENT].decode()
        if component not in COMPONENTS:
            return None
        name = custom_metadata[_NAME_KEY[component]].decode()
        write = None
        if component == SPARK_SINK:
            write = custom_metadata[TAG_SPARK_WRITE].decode()
    except (KeyError, UnicodeDecodeError):
        return None
    if not name or (component == SPARK_SINK and not _WRITE.fullmatch(write or "")):
        return None  # a staging token is one path component of letters, digits, '.', '-'
    return Owner(component, name, write)


@dataclass(frozen=True, slots=True)
class OwnerView:
    """What the owner's node says, read after the ledger's metadata (and a ``sync``).

    ``exists``: the referring node is there (a log's node; a database's snapshot list,
    absent until its first snapshot, counts as an empty one). ``listed``: the ledgers it
    refers to (a log's list, the database's snapshots). ``dropped``: the ledgers it
    names as dropped, to be deleted (the database's snapshots that a crash may have
    left undeleted). ``registered``: for a sink's ledger, whether its registration is
    still in its write's staging, and ``abandoned``, whether that staging showed no
    life for as long as the sink's own sweep waits (its driver died).
    """

    exists: bool
    listed: frozenset[int] = frozenset()
    dropped: frozenset[int] = frozenset()
    registered: bool = False
    abandoned: bool = False


@dataclass(frozen=True, slots=True)
class Verdict:
    orphan: bool
    why: str


def decide(
    ledger_id: int,
    owner: Owner,
    view: OwnerView,
    *,
    closed: bool,
    age_ms: int,
    min_age_ms: int,
) -> Verdict:
    """Whether ``ledger_id``, owned by ``owner``, is an orphan given ``view``.

    ``closed``: the ledger's metadata says CLOSED. ``age_ms``: how long ago the ledger
    was created (its metadata's creation time).
    """
    old = age_ms >= min_age_ms
    young = f"created {age_ms} ms ago (under {min_age_ms} ms): it may still be added"
    if owner.component == SPARK_SINK:
        if ledger_id in view.listed:
            return Verdict(False, f"in log {owner.name}")
        if view.registered and view.abandoned:
            return Verdict(
                True, f"staged by write {owner.write}, whose staging shows no life (abandoned)"
            )
        if view.registered:
            return Verdict(False, f"staged by write {owner.write} (still registered)")
        return Verdict(True, f"write {owner.write} ended and log {owner.name} does not list it")
    if owner.component == DB_SNAPSHOT:
        if ledger_id in view.listed:
            return Verdict(False, f"a snapshot of database {owner.name}")
        if ledger_id in view.dropped:
            return Verdict(True, f"a snapshot database {owner.name} dropped")
        if not old:
            return Verdict(False, f"not a recorded snapshot of {owner.name}, but {young}")
        return Verdict(True, f"not a recorded snapshot of database {owner.name}")
    # A log's ledger.
    if not view.exists:
        if closed:
            return Verdict(True, f"log {owner.name} does not exist, and the ledger is closed")
        if not old:
            return Verdict(False, f"log {owner.name} does not exist, but the ledger was {young}")
        return Verdict(True, f"log {owner.name} does not exist")
    if ledger_id in view.listed:
        return Verdict(False, f"in log {owner.name}")
    newest = max(view.listed, default=None)
    if newest is not None and ledger_id < newest:
        return Verdict(
            True, f"not in log {owner.name}, and below its ledger {newest}: never appended"
        )
    if closed:
        return Verdict(True, f"not in log {owner.name}, and closed: never appended")
    if not old:
        return Verdict(False, f"not in log {owner.name} yet, {young}")
    return Verdict(True, f"not in log {owner.name}, and {age_ms} ms old")
