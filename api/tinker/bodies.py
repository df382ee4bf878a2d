"""Fields of a Tinker call's body (api/routers/tinker.py), each a 400 naming the field when it is
not what the SDK sends: a counter (`counter`), an object (`object_field`), and a forward_backward
protobuf body's model id, read without decoding the rest (`proto_model_id`)."""

from __future__ import annotations

from typing import Any

from api.problems import Problem
from mathrl.protobuf import read_varint


def counter(data: dict[str, Any], field: str) -> int:
    value = data.get(field) or 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise Problem.at(f"/{field}", f"{value!r} is not a counter: give a whole number from 0", status=400)
    return value


def object_field(data: dict[str, Any], field: str) -> dict[str, Any]:
    value = data.get(field) or {}
    if not isinstance(value, dict):
        raise Problem.at(f"/{field}", "give an object", status=400)
    return value


def proto_model_id(body: bytes) -> str:
    """Field 1 (model_id) of a ForwardBackwardRequest, read without decoding the rest."""
    try:
        return _model_id_field(body)
    except ValueError:
        raise Problem(400, "Invalid request", "forward_backward: the protobuf body is malformed or cut short") from None


def _model_id_field(body: bytes) -> str:
    at = 0
    while at < len(body):
        key, at = read_varint(body, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, at = read_varint(body, at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            size, at = read_varint(body, at)
            if number == 1:
                try:
                    return body[at : at + size].decode()
                except UnicodeDecodeError:
                    break  # not a model id
            at += size
        else:
            break
    raise Problem(400, "Invalid request", "forward_backward: the protobuf body carries no model_id")
