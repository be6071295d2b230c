"""Recovery with a bookie gone for good (R8): with Qa = Qw, every recovery add needs
every bookie of its write set, so the recovery replaces the dead one with an ensemble
change, as BookKeeper's recovery adds do, and the ledger can still be closed. Real
bookie processes, killed with SIGKILL and never restarted; both metadata drivers."""

from __future__ import annotations

from writer_process import payload

from quorumlog import BookKeeper, ClientConfig

# The writer never sends an explicit LAC: the bookies know LAC 8 after ten adds (entry 9
# carried it), so entry 9 is the recovery's to find and to write back.
NO_EXPLICIT_LAC = ClientConfig(explicit_lac_delay_ms=600_000)


def test_r8_recovery_replaces_a_bookie_killed_for_good_when_qa_equals_qw(cluster3):
    with BookKeeper(cluster3.metadata_uri, config=NO_EXPLICIT_LAC) as bk:
        lh = bk.create_ledger(2, 2, 2, password=b"pw")
        for i in range(10):
            lh.add_entry(payload(i))
        first_ensemble = tuple(lh.ensemble)
        victim = next(b for b in cluster3.bookies if b.address == first_ensemble[1])
        spare = next(b.address for b in cluster3.bookies if b.address not in first_ensemble)
        cluster3.kill(victim.index)  # gone for good; the writer is abandoned, unclosed

        with BookKeeper(cluster3.metadata_uri) as other:
            # The recovery reads entry 9 from the live bookie and must write it to both
            # bookies of its write set, the dead one among them.
            rh = other.open_ledger(lh.ledger_id, b"pw")
            assert [e.data for e in rh.read_entries(0, 9)] == [payload(i) for i in range(10)]
            md = other.ledger_metadata(lh.ledger_id)
            assert md.is_closed and md.last_entry_id == 9, md
            # The replacement takes the dead bookie's slot from the entry recovered on.
            assert md.ensembles[0] == (0, first_ensemble)
            assert md.ensembles[-1] == (9, (first_ensemble[0], spare)), md.ensembles
