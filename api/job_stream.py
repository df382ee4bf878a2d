"""A job's event stream (api/routers/jobs.py, GET /v1/jobs/{id}/events/stream) as Server-Sent
Events: `event_stream`, every event as it is written and, asked for, the metric points, read on
each wake-up (api/job_wakeups.py) or poll until the job ends; and `CountedStream`, the response
that gives the stream's count (api/streams.py) back however it ends."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from api.job_views import METRICS_PAGE_POINTS, events_after
from api.job_wakeups import KEEPALIVE_SECONDS, POLL_SECONDS, STREAM_READS, project_read, shared_read, waker
from mathrl.schemas import EventResponse
from mathrl.status import TERMINAL
from store.db import get_sessionmaker
from store.models import Job, Metric

log = logging.getLogger("mathrl.api")

STREAM_DB_ERROR = "the database did not answer: reconnect with after=<the last id you saw>"


def event_stream(
    request: Request,
    url: str,
    job_id: str,
    project_id: str,
    after: int | None,
    metrics: bool,
    metrics_after_step: int | None,
) -> Any:
    """The stream's lines: each poll takes a connection for one query and gives it back."""

    def poll(last: int | None, metric_id: int | None) -> tuple[list[dict[str, Any]], list[Metric], bool]:
        STREAM_READS.inc()
        with get_sessionmaker(url)() as s:
            rows = events_after(s, job_id, last, 500)
            points: list[Metric] = []
            if metrics:
                q = select(Metric).where(Metric.job_id == job_id)
                if metric_id is not None:
                    q = q.where(Metric.id > metric_id)
                elif metrics_after_step is not None:
                    q = q.where(Metric.step > metrics_after_step)
                points = list(s.scalars(q.order_by(Metric.id).limit(METRICS_PAGE_POINTS)))
            status = s.scalar(select(Job.status).where(Job.id == job_id))
            return [EventResponse.model_validate(r).model_dump(mode="json") for r in rows], points, status in TERMINAL

    wakeups = waker(url)  # PostgreSQL: woken by NOTIFY (api/job_wakeups.py); SQLite: polling

    async def gen() -> Any:
        last, metric_id = after, None
        waiter = wakeups.subscribe(job_id) if wakeups is not None else None
        quiet_since = time.monotonic()
        try:
            while True:
                try:
                    if waiter is not None and wakeups is not None:
                        waiter.clear()  # a write during the read below wakes the wait after it
                        # the streams of this job at the same cursors, woken by the same
                        # notification, share one read
                        gen = wakeups.generation(job_id)
                        key = (url, job_id, last, metric_id, metrics, metrics_after_step, gen)
                        rows, points, ended = await shared_read(key, partial(poll, last, metric_id), project_id)
                    else:
                        rows, points, ended = await project_read(project_id, partial(poll, last, metric_id))
                except SQLAlchemyError as exc:
                    # the 200 is sent: no problem response can follow. End the stream cleanly;
                    # the client reconnects with after=<the last seq it saw>.
                    log.warning("event stream of job %s ended by a database error: %s", job_id, type(exc).__name__)
                    yield f": {STREAM_DB_ERROR}\n\n"
                    return
                if points:
                    metric_id = points[-1].id
                    data = [{"name": m.name, "step": m.step, "value": m.value} for m in points]
                    yield f"event: metrics\ndata: {json.dumps({'data': data})}\n\n"
                for row in rows:
                    last = row["seq"]
                    yield f"id: {row['seq']}\nevent: {row['type']}\ndata: {json.dumps(row)}\n\n"
                if ended and not rows and not points:
                    return
                if await request.is_disconnected():
                    return
                if rows or points:
                    quiet_since = time.monotonic()
                    continue  # a full page may have more behind it
                if time.monotonic() - quiet_since >= KEEPALIVE_SECONDS:
                    quiet_since = time.monotonic()
                    yield ": keep-alive\n\n"
                if waiter is not None and wakeups is not None:
                    await waiter.wait(wakeups.interval())
                else:
                    await asyncio.sleep(POLL_SECONDS)
        finally:
            if waiter is not None and wakeups is not None:
                wakeups.unsubscribe(waiter)

    return gen()


class CountedStream(StreamingResponse):
    """An event stream that gives its count back (api/streams.py) however it ends. In the generator's
    `finally` it was never given back when the client went away before the stream began (the generator
    never started): a key's or project's streams then stayed at the limit until the process restarted."""

    def __init__(self, content: Any, release: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()
