"""Idempotency-Key on the routes that create things (POST /v1/jobs, /v1/pipelines,
/v1/fine_tuning/jobs, /v1/files): the openai SDK, and any careful client, retries a create with
the same key. The same key and the same request give back the object the first one created (200,
`Idempotent-Replayed: true`); the same key with another request is 409. Keys are per project,
stored on the created row (a unique (project_id, idempotency_key) per table), so a race between
two retries leaves one row."""

from __future__ import annotations

import hashlib
import json
from typing import Any, TypeVar

from fastapi import Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.problems import IDEMPOTENCY_CONFLICT, Problem

Row = TypeVar("Row")


def request_hash(body: Any) -> str:
    """The hash a replay must match: the request's JSON (keys sorted) or bytes."""
    data = body if isinstance(body, bytes) else json.dumps(body, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()


def earlier(session: Session, model: type[Row], project_id: str, key: str | None, digest: str) -> Row | None:
    """The row this key created before in the project (same request), None if the key is new or
    absent; 409 if the key was used with another request; 422 if it is empty (it would be stored as a
    key, and a second empty one could never be told from a retry). `model`: Job, Pipeline or File."""
    if key == "":
        raise Problem.at("header:/idempotency-key", "is empty: send a unique key (a UUID), or leave the header out")
    if key is None:
        return None
    table: Any = model
    row: Any = session.scalar(select(table).where(table.project_id == project_id, table.idempotency_key == key))
    if row is not None and row.request_hash != digest:
        raise Problem(409, "Conflict", IDEMPOTENCY_CONFLICT)
    return row  # type: ignore[no-any-return]


def replayed(response: Response, status: int = 200) -> None:
    """Mark a response as a replay of an earlier create."""
    response.status_code = status
    response.headers["Idempotent-Replayed"] = "true"
