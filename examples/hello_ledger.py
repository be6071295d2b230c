"""The smallest quorumlog program: write a ledger, recover-open it, read it back.

Run it against a local cluster (``quorumlog localbookie 3``); the metadata URI comes
from $QUORUMLOG_METADATA, else ./.quorumlog/metadata.db.
"""

from quorumlog import BookKeeper, DigestType


def main() -> None:
    with BookKeeper() as bk:
        print("bookies:", ", ".join(bk.list_bookies()))
        writer = bk.create_ledger(
            ensemble=3, write_quorum=3, ack_quorum=2, digest_type=DigestType.MAC, password=b"pw"
        )
        for word in (b"hello", b"replicated", b"world"):
            entry_id = writer.add_entry(word)
            print(f"ledger {writer.ledger_id}: entry {entry_id} confirmed")
        futures = [writer.add_entry_async(b"pipelined-%d" % i) for i in range(1000)]
        print("pipelined adds confirmed up to entry", futures[-1].result())
        writer.close()

        reader = bk.open_ledger(writer.ledger_id, password=b"pw")
        entries = reader.read_entries(0, 2)
        print("read back:", [e.data.decode() for e in entries])
        print("last entry:", reader.last_add_confirmed, "closed:", reader.is_closed)
        bk.delete_ledger(writer.ledger_id, password=b"pw")


if __name__ == "__main__":
    main()
