"""Ledger metadata: the record each ledger keeps in the metadata store.

Pure data and its serialisation (JSON, so that an operator can read it with
``quorumlog shell ledgermetadata`` or a ZooKeeper CLI). Changes are made with
``dataclasses.replace`` and written back with a compare-and-set on the store
version, never in place.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import itertools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from quorumlog.errors import InvalidArgumentError, MetadataError
from quorumlog.proto.entry import DigestType

METADATA_FORMAT_VERSION = 1


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    """What every client agrees on about one ledger.

    ``ensembles`` maps the first entry id of each fragment to the bookies
    (``host:port``) of that fragment, in ensemble order; it is sorted by first
    entry id and always starts at 0. ``password_digest`` lets a client refuse a
    wrong password before it touches any bookie (R10); it is a hash of the
    master key, never the password.
    """

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    digest_type: DigestType
    ensembles: tuple[tuple[int, tuple[str, ...]], ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    custom_metadata: Mapping[str, bytes] = field(default_factory=dict)
    creation_time_ms: int = 0
    password_digest: str = ""

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def last_ensemble(self) -> tuple[str, ...]:
        return self.ensembles[-1][1]

    @property
    def last_fragment_first_entry(self) -> int:
        return self.ensembles[-1][0]

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        """The ensemble of the fragment that holds ``entry_id``."""
        chosen = self.ensembles[0][1]
        for first, bookies in self.ensembles:
            if first > entry_id:
                break
            chosen = bookies
        return chosen

    def fragment_bounds(self) -> list[tuple[int, int | None, tuple[str, ...]]]:
        """(first entry, last entry or None if open-ended, ensemble) per fragment."""
        out: list[tuple[int, int | None, tuple[str, ...]]] = []
        for index, (first, bookies) in enumerate(self.ensembles):
            if index + 1 < len(self.ensembles):
                last: int | None = self.ensembles[index + 1][0] - 1
            elif self.is_closed:
                last = self.last_entry_id
            else:
                last = None
            out.append((first, last, bookies))
        return out

    def all_bookies(self) -> set[str]:
        return {b for _, bookies in self.ensembles for b in bookies}

    def with_new_fragment(self, first_entry_id: int, bookies: tuple[str, ...]) -> LedgerMetadata:
        """R5: a new fragment from ``first_entry_id``; replaces a fragment with the same start."""
        kept = tuple((f, b) for f, b in self.ensembles if f < first_entry_id)
        return dataclasses.replace(self, ensembles=(*kept, (first_entry_id, tuple(bookies))))

    def to_bytes(self) -> bytes:
        doc = {
            "format": METADATA_FORMAT_VERSION,
            "ledger_id": self.ledger_id,
            "state": self.state.value,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "digest_type": self.digest_type.name,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "ensembles": [[first, list(bookies)] for first, bookies in self.ensembles],
            "custom_metadata": {
                k: base64.b64encode(v).decode("ascii") for k, v in self.custom_metadata.items()
            },
            "creation_time_ms": self.creation_time_ms,
            "password_digest": self.password_digest,
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LedgerMetadata:
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise MetadataError(f"ledger metadata is not a JSON object: {type(doc).__name__}")
            if doc.get("format") != METADATA_FORMAT_VERSION:
                raise MetadataError(f"unsupported ledger metadata format {doc.get('format')!r}")
            metadata = cls(
                ledger_id=int(doc["ledger_id"]),
                state=LedgerState(doc["state"]),
                ensemble_size=int(doc["ensemble_size"]),
                write_quorum=int(doc["write_quorum"]),
                ack_quorum=int(doc["ack_quorum"]),
                digest_type=DigestType[doc["digest_type"]],
                last_entry_id=int(doc["last_entry_id"]),
                length=int(doc["length"]),
                ensembles=tuple(
                    (int(first), tuple(str(b) for b in bookies))
                    for first, bookies in doc["ensembles"]
                ),
                custom_metadata={
                    str(k): base64.b64decode(v) for k, v in doc["custom_metadata"].items()
                },
                creation_time_ms=int(doc["creation_time_ms"]),
                password_digest=str(doc.get("password_digest", "")),
            )
            _check_fragments(metadata)
            return metadata
        except MetadataError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MetadataError(f"ledger metadata does not decode: {exc!r}") from exc

    def to_display(self) -> dict[str, object]:
        """A JSON-friendly view for the shell and logs."""
        doc: dict[str, object] = json.loads(self.to_bytes())
        doc["custom_metadata"] = {
            k: v.decode("utf-8", "replace") for k, v in self.custom_metadata.items()
        }
        doc.pop("password_digest", None)
        return doc


def _check_fragments(metadata: LedgerMetadata) -> None:
    """Fragments must start at entry 0 and at strictly increasing entries."""
    firsts = [first for first, _ in metadata.ensembles]
    if not firsts or firsts[0] != 0 or any(a >= b for a, b in itertools.pairwise(firsts)):
        raise MetadataError(
            f"ledger {metadata.ledger_id}: fragments must start at 0 and increase, got {firsts}"
        )


def new_ledger_metadata(
    ledger_id: int,
    ensemble: tuple[str, ...],
    write_quorum: int,
    ack_quorum: int,
    digest_type: DigestType,
    password_digest: str,
    custom_metadata: Mapping[str, bytes] | None = None,
) -> LedgerMetadata:
    for key, value in (custom_metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, bytes | bytearray):
            raise InvalidArgumentError(
                f"custom metadata must map str to bytes, got {key!r}: {type(value).__name__}"
            )
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=len(ensemble),
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        digest_type=digest_type,
        ensembles=((0, tuple(ensemble)),),
        custom_metadata={k: bytes(v) for k, v in (custom_metadata or {}).items()},
        creation_time_ms=int(time.time() * 1000),
        password_digest=password_digest,
    )
