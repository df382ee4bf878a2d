"""The protobuf messages a training session reads and writes on Tinker's wire (docs/tinker-protocol.md,
section 6): a `ForwardBackwardRequest` in, a `ForwardBackwardOutput` and a `SampleResponse` out.

Our own reading of the protobuf wire format for these few messages (field numbers from the SDK's
`tinker_public.proto`), so the job process needs neither the SDK nor generated code: varints,
length-delimited fields, little-endian fixed64 doubles, maps as repeated key/value entries, and
repeated scalars packed or not. tests/unit/trainer/test_session_wire.py checks it against bytes the
SDK itself wrote."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evaluator.backends.token_sampler import Sampled
from mathrl.protobuf import read_varint
from trainer.session import Datum

# DType (tinker_public.proto)
FLOAT32, INT64, INT32, BFLOAT16 = 1, 2, 3, 4
_NUMPY = {FLOAT32: np.float32, INT64: np.int64, INT32: np.int32}
VARINT, FIXED64, BYTES, FIXED32 = 0, 1, 2, 5
STOP, LENGTH = 0, 1  # StopReason


@dataclass
class ForwardBackwardCall:
    """A decoded `ForwardBackwardRequest`."""

    model_id: str
    seq_id: int
    loss_fn: str
    data: list[Datum]
    config: dict[str, float | str] = field(default_factory=dict)
    forward_only: bool = False


# --- reading ---------------------------------------------------------------------------------


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field: an int for varints, bytes for the rest."""
    at = 0
    while at < len(buf):
        key, at = read_varint(buf, at)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == VARINT:
            value, at = read_varint(buf, at)
        elif wire == FIXED64:
            value, at = buf[at : at + 8], at + 8
        elif wire == FIXED32:
            value, at = buf[at : at + 4], at + 4
        elif wire == BYTES:
            size, at = read_varint(buf, at)
            value, at = buf[at : at + size], at + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} (field {number})")
        if at > len(buf):
            raise ValueError(f"truncated protobuf message (field {number} runs past the end)")
        yield number, wire, value


def _message(buf: bytes) -> dict[int, list[tuple[int, Any]]]:
    out: dict[int, list[tuple[int, Any]]] = {}
    for number, wire, value in _fields(buf):
        out.setdefault(number, []).append((wire, value))
    return out


def _one(msg: Mapping[int, list[tuple[int, Any]]], number: int, default: Any) -> Any:
    values = msg.get(number)
    return values[-1][1] if values else default  # the last one wins, as protobuf parsers do


def _ints(msg: Mapping[int, list[tuple[int, Any]]], number: int) -> list[int]:
    """A repeated int64 field, packed or not."""
    out: list[int] = []
    for wire, value in msg.get(number, []):
        if wire == VARINT:
            out.append(value)
            continue
        at = 0
        while at < len(value):
            item, at = read_varint(value, at)
            out.append(item)
    return [v - (1 << 64) if v >= 1 << 63 else v for v in out]


def _map(msg: Mapping[int, list[tuple[int, Any]]], number: int) -> dict[str, Any]:
    """A map<string, X> field: its entries' keys (decoded) and raw values (wire value of field 2)."""
    out: dict[str, Any] = {}
    for _, entry in msg.get(number, []):
        fields = _message(entry)
        out[bytes(_one(fields, 1, b"")).decode()] = _one(fields, 2, None)
    return out


def _tensor(raw: bytes, where: str) -> np.ndarray:
    msg = _message(raw)
    dtype = _one(msg, 3, 0)
    if dtype not in _NUMPY:
        raise ValueError(f"{where}: unsupported dtype {dtype} (send float32 or int64)")
    shape = _ints(msg, 4)
    sparse = _one(msg, 2, None)
    if sparse is None:
        flat = np.frombuffer(bytes(_one(msg, 1, b"")), dtype=_NUMPY[dtype])
        return flat.reshape(shape) if shape else flat
    csr = _message(sparse)  # SparseCsr: values, crow_indices, col_indices; absent entries are 0
    if len(shape) != 2:
        raise ValueError(f"{where}: a sparse tensor must be 2-D (shape {shape})")
    values = np.frombuffer(bytes(_one(csr, 1, b"")), dtype=_NUMPY[dtype])
    rows = np.frombuffer(bytes(_one(csr, 2, b"")), dtype=np.int64)
    cols = np.frombuffer(bytes(_one(csr, 3, b"")), dtype=np.int64)
    if len(rows) != shape[0] + 1 or len(cols) != len(values):
        raise ValueError(f"{where}: inconsistent sparse tensor ({len(rows)} row pointers, shape {shape})")
    dense = np.zeros(shape, dtype=_NUMPY[dtype])
    for r in range(shape[0]):
        dense[r, cols[rows[r] : rows[r + 1]]] = values[rows[r] : rows[r + 1]]
    return dense


def _datum(raw: bytes, index: int) -> Datum:
    msg = _message(raw)
    tokens: list[int] = []
    for _, chunk in msg.get(1, []):
        kinds = _message(chunk)
        if 1 not in kinds:
            raise ValueError(f"data[{index}].model_input: only encoded_text chunks are supported (no images)")
        text = _message(_one(kinds, 1, b""))
        tokens.extend(np.frombuffer(bytes(_one(text, 1, b"")), dtype="<i4").tolist())
    inputs = {name: _tensor(value, f"data[{index}].loss_fn_inputs.{name}") for name, value in _map(msg, 2).items()}
    return Datum(tokens, inputs)


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """A `ForwardBackwardRequest`'s bytes as a call; ValueError naming what cannot be read."""
    msg = _message(body)
    config: dict[str, float | str] = {k: struct.unpack("<d", v)[0] for k, v in _map(msg, 5).items()}
    for key, raw in _map(msg, 7).items():  # loss_fn_config_v2: a number or a text per key; it wins
        value = _message(raw or b"")
        if 2 in value:
            config[key] = bytes(_one(value, 2, b"")).decode()
        elif 1 in value:
            config[key] = struct.unpack("<d", _one(value, 1, b""))[0]
    seq = _one(msg, 2, 0)
    return ForwardBackwardCall(
        model_id=bytes(_one(msg, 1, b"")).decode(),
        seq_id=seq - (1 << 64) if seq >= 1 << 63 else seq,
        loss_fn=bytes(_one(msg, 4, b"")).decode(),
        data=[_datum(raw, i) for i, (_, raw) in enumerate(msg.get(3, []))],
        config=config,
        forward_only=bool(_one(msg, 6, 0)),
    )


# --- writing ---------------------------------------------------------------------------------


def _put_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _put(number: int, value: bytes | str | int) -> bytes:
    if isinstance(value, int):
        return _put_varint(number << 3 | VARINT) + _put_varint(value)
    raw = value.encode() if isinstance(value, str) else value
    return _put_varint(number << 3 | BYTES) + _put_varint(len(raw)) + raw


def _put_double(number: int, value: float) -> bytes:
    return _put_varint(number << 3 | FIXED64) + struct.pack("<d", value)


def _batched(per_datum: Sequence[Sequence[float]]) -> bytes:
    """A BatchedTensor of float32 arrays, one per datum: their bytes end to end and the byte offsets."""
    arrays = [np.asarray(a, dtype="<f4").ravel() for a in per_datum]
    offsets = np.zeros(len(arrays) + 1, dtype="<i8")
    np.cumsum([a.nbytes for a in arrays], out=offsets[1:])
    return _put(1, b"".join(a.tobytes() for a in arrays)) + _put(2, offsets.tobytes()) + _put(3, FLOAT32)


def encode_forward_backward(logprobs: Sequence[Sequence[float]], metrics: Mapping[str, float]) -> bytes:
    """A `ForwardBackwardOutput`: one ArrayRecord with each datum's `logprobs`, and the metrics."""
    entry = _put(1, "logprobs") + _put(2, _batched(logprobs))
    record = _put(2, entry) + _put(3, len(logprobs))
    out = _put(1, "ArrayRecord") + _put(2, record)
    for name, value in metrics.items():
        out += _put(3, _put(1, name) + _put_double(2, float(value)))
    return out


def encode_sample(sequences: Sequence[Sampled], prompt_logprobs: Sequence[float | None] | None = None) -> bytes:
    """A `SampleResponse`: the sequences, and the prompt's log-probabilities (None: NaN) when asked."""
    out = b""
    for s in sequences:
        reason = {"stop": STOP, "length": LENGTH}[s.stop_reason]
        seq = (_put(1, reason) if reason else b"") + _put(2, np.asarray(s.tokens, dtype="<i4").tobytes())
        if len(s.tokens):
            seq += _put(3, np.asarray(s.logprobs, dtype="<f4").tobytes())
        out += _put(1, seq)
    if prompt_logprobs is not None:
        values = [np.nan if v is None else v for v in prompt_logprobs]
        out += _put(2, np.asarray(values, dtype="<f4").tobytes())
    return out
