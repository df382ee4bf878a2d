"""A parquet file's top-level column names, read from its footer alone, for the API's check of
a dataset's fields at submit (api/admission.py).

The API image carries no pyarrow (170 MB of its 590; the workers read the rows with it). The
footer is small and fully specified: the file ends with a Thrift-compact-encoded FileMetaData,
its length (4 bytes, little-endian) and the magic `PAR1`; FileMetaData's field 2 is the schema,
a depth-first list of SchemaElements whose first is the root (name, field 4; num_children,
field 5). https://github.com/apache/parquet-format (Thrift compact protocol:
https://github.com/apache/thrift/blob/master/doc/specs/thrift-compact-protocol.md).
tests/unit/api/test_parquet_footer.py compares it with pyarrow on nested, wide and damaged files."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

from runtime.errors import ParquetError as ParquetError  # raised here; its callers import it from here

MAGIC = b"PAR1"
MAX_FOOTER = 64 << 20  # bytes of metadata read at most (a footer this big is not a dataset we read)
MAX_DEPTH = 64  # nested structs skipped at most this deep

# Thrift compact types
STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise ParquetError("the footer ends early")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ParquetError("the footer ends early")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ParquetError("a varint runs past 64 bits")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def fields(self) -> Iterator[tuple[int, int]]:
        """(field id, type) of each field of the struct here, up to its STOP."""
        last = 0
        while True:
            head = self.byte()
            kind = head & 0x0F
            if kind == STOP:
                return
            delta = head >> 4
            last = last + delta if delta else self.zigzag()
            yield last, kind

    def list_header(self) -> tuple[int, int]:
        head = self.byte()
        size = head >> 4
        if size == 15:
            size = self.varint()
        if size > len(self.data) - self.pos:  # every element takes a byte at least
            raise ParquetError("a list is longer than the footer")
        return size, head & 0x0F

    def skip(self, kind: int, depth: int = 0) -> None:
        if depth > MAX_DEPTH:
            raise ParquetError("the footer nests too deep")
        if kind in (TRUE, FALSE):
            return
        if kind == BYTE:
            self.take(1)
        elif kind in (I16, I32, I64):
            self.varint()
        elif kind == DOUBLE:
            self.take(8)
        elif kind == BINARY:
            self.take(self.varint())
        elif kind in (LIST, SET):
            size, elem = self.list_header()
            for _ in range(size):
                if elem in (TRUE, FALSE):
                    self.take(1)  # booleans in a list are a byte each
                else:
                    self.skip(elem, depth + 1)
        elif kind == MAP:
            size = self.varint()
            if size:
                kv = self.byte()
                for _ in range(size):
                    self.skip(kv >> 4, depth + 1)
                    self.skip(kv & 0x0F, depth + 1)
        elif kind == STRUCT:
            for _, k in self.fields():
                self.skip(k, depth + 1)
        else:
            raise ParquetError(f"unknown Thrift type {kind}")


def _schema(r: _Reader) -> list[tuple[str, int]]:
    """FileMetaData's schema: (name, num_children) of each element, depth first."""
    for fid, kind in r.fields():
        if fid == 2 and kind == LIST:
            size, elem = r.list_header()
            if elem != STRUCT:
                raise ParquetError("the schema is not a list of elements")
            out = []
            for _ in range(size):
                name, children = None, 0
                for efid, ekind in r.fields():
                    if efid == 4 and ekind == BINARY:
                        name = r.take(r.varint()).decode("utf-8", "replace")
                    elif efid == 5 and ekind == I32:
                        children = r.zigzag()
                    else:
                        r.skip(ekind)
                if name is None or children < 0:
                    raise ParquetError("a schema element lacks its name")
                out.append((name, children))
            return out
        r.skip(kind)
    raise ParquetError("the footer has no schema")


def parquet_columns(path: Path) -> list[str]:
    """The top-level column names of the parquet file at `path` (ParquetError if it is not one)."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        if size < 12:
            raise ParquetError("too short to be parquet")
        f.seek(0)
        if f.read(4) != MAGIC:
            raise ParquetError("it does not start with PAR1")
        f.seek(size - 8)
        tail = f.read(8)
        if tail[4:] != MAGIC:
            raise ParquetError("it does not end with PAR1 (an encrypted footer, or not parquet)")
        (length,) = struct.unpack("<I", tail[:4])
        if length > min(size - 12, MAX_FOOTER):
            raise ParquetError(f"its footer length ({length} bytes) does not fit the file")
        f.seek(size - 8 - length)
        schema = _schema(_Reader(f.read(length)))
    if not schema:
        raise ParquetError("the schema is empty")
    names, i = [], 1
    for _ in range(schema[0][1]):  # the root's children, each followed by its own subtree
        if i >= len(schema):
            raise ParquetError("the schema ends inside its root")
        names.append(schema[i][0])
        pending = schema[i][1]
        i += 1
        while pending:  # skip the subtree
            if i >= len(schema):
                raise ParquetError("the schema ends inside a column")
            pending += schema[i][1] - 1
            i += 1
    return names
