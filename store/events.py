"""A job's event: the one function that records one (store.jobs re-exports it; the pipeline
settling in store/pipelines.py, which store.jobs imports, uses it from here)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from store.models import Event, utcnow


def add_event(
    session: Session,
    job_id: str,
    type: str,
    message: str = "",
    level: str = "info",
    data: dict[str, Any] | None = None,
) -> Event:
    ev = Event(job_id=job_id, type=type, message=message, level=level, data=data, time=utcnow())
    session.add(ev)
    return ev
