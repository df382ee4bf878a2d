"""The protobuf wire format's varint, read once for the whole service: the Tinker routes read a
request's model id with it (api/tinker/bodies.py) and the session job decodes Tinker's messages
with it (trainer/session_wire.py). Here, on the ground floor, it needs neither torch nor numpy,
which the API's image lacks."""

from __future__ import annotations


def read_varint(buf: bytes, at: int) -> tuple[int, int]:
    """The varint starting at `at` and the offset after it; ValueError for one cut short or longer
    than 10 bytes (a 64-bit value's most)."""
    value = shift = 0
    while True:
        if at >= len(buf):
            raise ValueError("truncated protobuf message (a varint runs past the end)")
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ValueError("malformed protobuf message (a varint longer than 10 bytes)")
