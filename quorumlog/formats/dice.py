"""A dice record: the rolled value alone, 4 bytes, big-endian, signed (the tutorial's
``Ints.toByteArray``). It carries no term: a leader's epoch is the ledger it wrote.

>>> decode_value(encode_value(4))
4
>>> decode_value(b"x") is None
True
"""

from __future__ import annotations

import struct

__all__ = ["VALUE_SIZE_BYTES", "decode_value", "encode_value"]

_VALUE = struct.Struct(">i")
VALUE_SIZE_BYTES = _VALUE.size


def encode_value(value: int) -> bytes:
    """The record of rolled ``value``."""
    return _VALUE.pack(value)


def decode_value(data: bytes) -> int | None:
    """The rolled value a record holds, or None for bytes that are not one."""
    if len(data) != _VALUE.size:
        return None
    return int(_VALUE.unpack(data)[0])
