"""Idempotency-Key on the routes that create things (POST /v1/jobs, /v1/pipelines,
/v1/fine_tuning/jobs, /v1/files): the same key and the same request give back the object the first
one created (200, `Idempotent-Replayed: true`); the same key with another request is 409. Keys are
per project, stored on the created row (`commit_or_replay`, `replayed`).

The openai SDK sends no key, but says a retry's count in `x-stainless-retry-count`: on its routes a
retry without a key gives back the project's newest keyless row of the same request (`request_hash`)
from the last RETRY_WINDOW_SECONDS (`earlier`). docs/using.md, "API"; docs/openai-rft.md, "What each
route is here"."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from fastapi import Response
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.problems import IDEMPOTENCY_CONFLICT, Problem
from store.models import utcnow

Row = TypeVar("Row")
RETRY_WINDOW_SECONDS = 660.0  # the SDK's default read timeout (600 s), then its backoff


def request_hash(body: Any) -> str:
    """The hash a replay must match: the request's JSON (keys sorted) or bytes."""
    data = body if isinstance(body, bytes) else json.dumps(body, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()


def earlier(
    session: Session, model: type[Row], project_id: str, key: str | None, digest: str, retry: str | None = None
) -> Row | None:
    """The row this key created before in the project (same request), None if the key is new or
    absent; 409 if the key was used with another request; 422 if it is empty (it would be stored as a
    key, and a second empty one could never be told from a retry). `model`: Job, Pipeline or File.
    `retry`: the openai SDK's x-stainless-retry-count, for a create without a key (above)."""
    if key == "":
        raise Problem.at("header:/idempotency-key", "is empty: send a unique key (a UUID), or leave the header out")
    table: Any = model
    if key is None:
        if not (retry or "").isdecimal() or not (retry or "").isascii() or int(retry or 0) < 1:
            return None
        since = utcnow() - timedelta(seconds=RETRY_WINDOW_SECONDS)
        mine = (table.project_id == project_id, table.request_hash == digest, table.created_at >= since)
        keyless = table.idempotency_key.is_(None)  # a keyed create is replayed by its key only
        return session.scalar(select(table).where(*mine, keyless).order_by(table.created_at.desc()).limit(1))
    row: Any = session.scalar(select(table).where(table.project_id == project_id, table.idempotency_key == key))
    if row is not None and row.request_hash != digest:
        raise Problem(409, "Conflict", IDEMPOTENCY_CONFLICT)
    return row  # type: ignore[no-any-return]


def replayed(response: Response, status: int = 200) -> None:
    """Mark a response as a replay of an earlier create."""
    response.status_code = status
    response.headers["Idempotent-Replayed"] = "true"


def commit_or_replay(
    session: Session, row: Row, response: Response, commit: Callable[[], object] | None = None
) -> tuple[Row, bool]:
    """Store a created row (added to `session`) that carries its create's Idempotency-Key and request
    hash, by `commit` (session.commit by default). Where a concurrent create with the same key stored
    first (the key is unique per project and table), the row that one made, and the response says it is
    a replay. Returns the row and whether it is the earlier one."""
    held: Any = row
    project_id, key, digest = held.project_id, held.idempotency_key, held.request_hash or ""
    try:
        (commit or session.commit)()
    except IntegrityError:
        session.rollback()
        if (existing := earlier(session, type(row), project_id, key, digest)) is None:
            raise
        replayed(response)
        return existing, True
    return row, False
