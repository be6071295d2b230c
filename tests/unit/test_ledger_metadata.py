"""LedgerMetadata: JSON round trip, fragments (R5), and refusal of bad bytes."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.errors import InvalidArgumentError, MetadataError
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState, new_ledger_metadata
from quorumlog.proto.entry import DigestType

ENSEMBLE = ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")


def sample() -> LedgerMetadata:
    return new_ledger_metadata(
        7, ENSEMBLE, 2, 2, DigestType.CRC32C, "abc123", {"application": b"\x00\xffbinary"}
    )


def test_round_trip_keeps_every_field():
    md = dataclasses.replace(
        sample().with_new_fragment(10, ("10.0.0.4:3181", *ENSEMBLE[1:])),
        state=LedgerState.CLOSED,
        last_entry_id=15,
        length=4096,
    )
    assert LedgerMetadata.from_bytes(md.to_bytes()) == md


def test_json_is_readable_and_has_no_password():
    doc = json.loads(sample().to_bytes())
    assert doc["format"] == 1 and doc["ledger_id"] == 7 and doc["state"] == "OPEN"
    assert doc["ensembles"] == [[0, list(ENSEMBLE)]]
    assert "password" not in json.dumps(sample().to_display())


@given(
    ledger_id=st.integers(0, 2**63 - 1),
    last_entry=st.integers(-1, 2**40),
    custom=st.dictionaries(st.text(max_size=8), st.binary(max_size=16), max_size=3),
)
def test_round_trip_property(ledger_id, last_entry, custom):
    md = dataclasses.replace(
        new_ledger_metadata(ledger_id, ENSEMBLE, 3, 2, DigestType.CRC32, "", custom),
        last_entry_id=last_entry,
    )
    assert LedgerMetadata.from_bytes(md.to_bytes()) == md


def test_r5_ensemble_for_picks_the_fragment_holding_the_entry():
    replaced = ("10.0.0.9:3181", *ENSEMBLE[1:])
    md = sample().with_new_fragment(100, replaced)
    assert md.ensemble_for(0) == ENSEMBLE
    assert md.ensemble_for(99) == ENSEMBLE
    assert md.ensemble_for(100) == replaced
    assert md.ensemble_for(10**9) == replaced
    assert md.last_ensemble == replaced and md.last_fragment_first_entry == 100
    assert md.all_bookies() == {*ENSEMBLE, "10.0.0.9:3181"}


def test_r5_new_fragment_at_the_same_start_replaces_it():
    first_change = sample().with_new_fragment(5, ("a:1", "b:1", "c:1"))
    second_change = first_change.with_new_fragment(5, ("a:1", "d:1", "c:1"))
    assert second_change.ensembles == ((0, ENSEMBLE), (5, ("a:1", "d:1", "c:1")))
    assert sample().ensembles == ((0, ENSEMBLE),)  # frozen: the original is untouched


def test_fragment_bounds_of_open_and_closed_ledgers():
    md = sample().with_new_fragment(5, ("a:1", "b:1", "c:1"))
    assert md.fragment_bounds() == [(0, 4, ENSEMBLE), (5, None, ("a:1", "b:1", "c:1"))]
    closed = dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=8)
    assert closed.fragment_bounds()[-1] == (5, 8, ("a:1", "b:1", "c:1"))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[]",
        b"{}",
        b'{"format": 99}',
        b"\xff\xfe\x00",
        json.dumps({**json.loads(sample().to_bytes()), "state": "HALF_OPEN"}).encode(),
        json.dumps({**json.loads(sample().to_bytes()), "digest_type": "MD5"}).encode(),
        json.dumps({**json.loads(sample().to_bytes()), "ensembles": 3}).encode(),
        json.dumps({**json.loads(sample().to_bytes()), "ledger_id": "seven"}).encode(),
    ],
)
def test_bad_bytes_raise_metadata_error(data):
    with pytest.raises(MetadataError):
        LedgerMetadata.from_bytes(data)


def test_custom_metadata_must_be_bytes():
    with pytest.raises(InvalidArgumentError, match="custom metadata"):
        new_ledger_metadata(1, ENSEMBLE, 2, 2, DigestType.CRC32C, "", {"k": "text"})  # type: ignore[dict-item]
