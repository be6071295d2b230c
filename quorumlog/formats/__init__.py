"""The formats of the records applications write into logs, beside the data: what a
writer (``quorumlog.apps``) and a reader that is no such application (a Spark pipeline)
both need to agree on. Pure: bytes in, values out; imports nothing of quorumlog."""
