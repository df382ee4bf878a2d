"""api/parquet_footer.py (the API's parquet schema check without pyarrow) against pyarrow itself."""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from api.parquet_footer import ParquetError, parquet_columns

pytestmark = pytest.mark.quick


def write(path: Path, table: pa.Table, **kw: object) -> Path:
    pq.write_table(table, path, **kw)
    return path


TABLES = {
    "flat": pa.table({"question": ["1+1?"], "answer": ["2"], "id": [7]}),
    "nested": pa.table(
        {
            "meta": [{"source": "x", "tags": ["a", "b"], "inner": {"k": 1.5}}],
            "question": ["q"],
            "steps": [[{"text": "s", "ok": True}]],
            "kv": pa.array([[("a", 1)]], type=pa.map_(pa.string(), pa.int64())),
            "answer": ["a"],
        }
    ),
    "wide": pa.table({f"col_{i:03d}": [i] for i in range(300)}),
    "unicode": pa.table({"Frage": ["?"], "réponse": ["!"], "答案": ["3"]}),
    "empty": pa.table({"question": pa.array([], pa.string()), "answer": pa.array([], pa.string())}),
}


@pytest.mark.parametrize("name", sorted(TABLES))
@pytest.mark.parametrize("options", [{}, {"compression": "zstd", "row_group_size": 1}, {"version": "1.0"}])
def test_the_columns_are_pyarrows(tmp_path: Path, name: str, options: dict[str, object]) -> None:
    path = write(tmp_path / f"{name}.parquet", TABLES[name], **options)
    assert parquet_columns(path) == pq.read_schema(path).names


def test_a_file_with_key_value_metadata_and_statistics(tmp_path: Path) -> None:
    table = TABLES["flat"].replace_schema_metadata({"origin": "x" * 5000, "huggingface": '{"info": {}}'})
    path = write(tmp_path / "meta.parquet", table, write_statistics=True, compression="snappy")
    assert parquet_columns(path) == ["question", "answer", "id"]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "too short"),
        (b'{"question": "1+1"}\n' * 3, "does not start with PAR1"),
        (b"PAR1" + b"\0" * 20, "does not end with PAR1"),
        (b"PAR1" + b"\0" * 8 + struct.pack("<I", 10**9) + b"PAR1", "does not fit"),
        (b"PAR1" + b"\x19\xfc" + struct.pack("<I", 2) + b"PAR1", "ends early"),
    ],
)
def test_what_is_not_parquet_is_refused_with_why(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "bad.parquet"
    path.write_bytes(content)
    with pytest.raises(ParquetError, match=says):
        parquet_columns(path)


def test_a_truncated_or_corrupted_footer_raises_parquet_error_only(tmp_path: Path) -> None:
    """Every byte of a real footer flipped, one at a time: a name list or ParquetError, never
    another exception or a hang."""
    good = write(tmp_path / "good.parquet", TABLES["nested"]).read_bytes()
    (length,) = struct.unpack("<I", good[-8:-4])
    start = len(good) - 8 - length
    for i in range(start, len(good) - 8):
        bad = bytearray(good)
        bad[i] ^= 0xFF
        path = tmp_path / "flipped.parquet"
        path.write_bytes(bytes(bad))
        try:
            names = parquet_columns(path)
        except ParquetError:
            continue
        assert isinstance(names, list) and all(isinstance(n, str) for n in names)
