"""/v1/jobs: submit, list, get, cancel; and each job's events, metrics, samples, checkpoints."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import unquote, urlsplit

from fastapi import APIRouter, Body, Header, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from api.deps import CallerDep, SessionDep, SettingsDep, owned, page_cursor
from api.idempotency import earlier, replayed, request_hash
from api.job_control import pause_job, resume_job
from api.job_wakeups import KEEPALIVE_SECONDS, POLL_SECONDS, STREAM_READS, project_read, shared_read, waker
from api.problems import (
    IDEMPOTENCY_CONFLICT,
    JOB_NOT_FOUND,
    NO_RESULTS,
    RESULTS_UNAVAILABLE,
    Problem,
)
from api.streams import close_stream, open_stream
from api.submit import admit, check_file_refs, check_job_refs, job_row, submit_keyed
from mathrl.schemas import (
    CheckpointResponse,
    EventResponse,
    JobResponse,
    JobStatus,
    MetricPoint,
    MetricSeries,
    Page,
    SampleResponse,
)
from mathrl.specs import AnySpec, model_refs
from mathrl.status import TERMINAL
from store.db import get_sessionmaker
from store.jobs import has_tag, request_cancel
from store.models import Checkpoint, Event, Job, Metric, Sample

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
log = logging.getLogger("mathrl.api")

NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": JOB_NOT_FOUND}}

# The largest values the columns a query parameter is compared with can hold (store/models.py):
# event seqs and metric ids are bigint, steps integer. Past them PostgreSQL raises mid-query
# (in a stream: after its 200 was sent), so the parameters are bounded and FastAPI answers 422.
MAX_BIGINT = 2**63 - 1
MAX_INT = 2**31 - 1
STREAM_DB_ERROR = "the database did not answer: reconnect with after=<the last id you saw>"


def _own_job(session: Session, project_id: str, job_id: str) -> Job:
    return owned(session, Job, project_id, job_id, JOB_NOT_FOUND)


@router.post(
    "",
    status_code=201,
    response_model=JobResponse,
    responses={
        200: {"description": "A replay: this Idempotency-Key and body created this job before.", "model": JobResponse},
        409: {"description": IDEMPOTENCY_CONFLICT},
        422: {
            "description": "The spec is invalid, names a source outside the allowed roots, is over a limit, or its "
            "memory plan does not fit its pool's GPUs (the detail says what would)."
        },
        429: {"description": "Over the project's quota of active jobs or GPUs, or the key's rate limit."},
    },
)
def create_job(
    # the discriminator on Body itself: FastAPI 0.136 (vLLM 0.31 caps it below 0.137) drops the
    # one inside an Annotated JobSpec, and errors then point at every union member
    spec: Annotated[AnySpec, Body(discriminator="kind")],
    session: SessionDep,
    caller: CallerDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Job:
    """Submit a job. With an `Idempotency-Key`, resubmitting the same body returns the same job."""
    digest = request_hash(spec.model_dump(mode="json"))
    if (existing := earlier(session, Job, caller.project_id, idempotency_key, digest)) is not None:
        replayed(response)
        return existing
    check_job_refs(session, caller.project_id, model_refs(spec))  # another job's output: one of the project's
    check_file_refs(session, caller.project_id, spec)
    config = admit({"": spec}, settings)[""]
    job = job_row(caller.project_id, spec, config, settings, idempotency_key=idempotency_key, request_hash=digest)
    return submit_keyed(session, settings, caller.project_id, job, f"queued on '{job.queue}'", response)


@router.get("", response_model=Page[JobResponse])
def list_jobs(
    session: SessionDep,
    caller: CallerDep,
    kind: str | None = None,
    status: JobStatus | None = None,
    tag: str | None = Query(None, max_length=64),
    pipeline_id: str | None = Query(None, max_length=36, description="Only the jobs of this pipeline."),
    limit: int = Query(50, ge=1, le=500),
    cursor: str | None = None,
) -> dict[str, Any]:
    """Jobs newest first. Follow `next_cursor` for the next page."""
    q = select(Job).where(Job.project_id == caller.project_id)
    if pipeline_id:
        q = q.where(Job.pipeline_id == pipeline_id)
    if kind:
        q = q.where(Job.kind == kind)
    if status:
        q = q.where(Job.status == status)
    if tag:
        q = q.where(has_tag(session, tag))
    if (c := page_cursor(cursor)) is not None:
        q = q.where(Job.id < c)
    rows = list(session.scalars(q.order_by(Job.id.desc()).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return {"data": rows, "next_cursor": rows[-1].id if more and rows else None}


@router.get("/{job_id}", response_model=JobResponse, responses=NOT_FOUND)
def get_job(job_id: str, session: SessionDep, caller: CallerDep) -> Job:
    return _own_job(session, caller.project_id, job_id)


@router.post("/{job_id}/cancel", response_model=JobResponse, responses=NOT_FOUND)
def cancel_job(job_id: str, session: SessionDep, caller: CallerDep) -> Job:
    """Cancel: a queued job ends at once; a running one is stopped (SIGTERM, then SIGKILL)."""
    job = _own_job(session, caller.project_id, job_id)
    if job.status in TERMINAL:
        return job
    return request_cancel(session, job)


@router.post(
    "/{job_id}/pause",
    response_model=JobResponse,
    responses={**NOT_FOUND, 409: {"description": "The job is neither queued nor running."}},
)
def pause(job_id: str, session: SessionDep, caller: CallerDep) -> Job:
    """Pause: a queued job at once; a running one saves a checkpoint at its next step and stops
    (status paused when it has). A paused job holds no quota until it is resumed."""
    return pause_job(session, _own_job(session, caller.project_id, job_id))


@router.post(
    "/{job_id}/resume",
    response_model=JobResponse,
    responses={**NOT_FOUND, 409: {"description": "Not paused."}, 429: {"description": "Over the project's quotas."}},
)
def resume_paused(job_id: str, session: SessionDep, caller: CallerDep, settings: SettingsDep) -> Job:
    """Resume a paused job: queued again, it goes on from its newest checkpoint. It counts against
    the project's quotas again, as a new job would (429 past them)."""
    return resume_job(session, settings, _own_job(session, caller.project_id, job_id))


@router.get("/{job_id}/events", response_model=Page[EventResponse], responses=NOT_FOUND)
def list_events(
    job_id: str,
    session: SessionDep,
    caller: CallerDep,
    after: int | None = Query(None, ge=0, le=MAX_BIGINT),
    limit: int = Query(500, ge=1, le=5000),
) -> dict[str, Any]:
    """The event log in order. Pass the last `seq` you saw as `after`."""
    _own_job(session, caller.project_id, job_id)
    rows = _events_after(session, job_id, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return {"data": rows, "next_cursor": str(rows[-1].seq) if more else None}


def _events_after(session: Session, job_id: str, after: int | None, limit: int) -> list[Event]:
    q = select(Event).where(Event.job_id == job_id)
    if after is not None:
        q = q.where(Event.seq > after)
    return list(session.scalars(q.order_by(Event.seq).limit(limit)))


@router.get(
    "/{job_id}/events/stream",
    responses={**NOT_FOUND, 200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events"}},
)
def stream_events(
    job_id: str,
    request: Request,
    session: SessionDep,
    caller: CallerDep,
    settings: SettingsDep,
    after: int | None = Query(None, ge=0, le=MAX_BIGINT, description="Only events after this seq (the last you saw)."),
    metrics: bool = Query(False, description="Also send the job's metric points as they are written."),
    metrics_after_step: int | None = Query(
        None, ge=-1, le=MAX_INT, description="With metrics: only points after this step (the last you have)."
    ),
) -> StreamingResponse:
    """Server-Sent Events: every event as it is written (`event: <type>`, `id: <seq>`), and with
    `metrics=true` the metric points too (`event: metrics`, data `{"data": [{name, step,
    value}, ...]}`); the stream ends when the job does. Each open stream counts against the
    key's `limits.max_streams_per_key` and its project's `limits.max_streams_per_project` (a 429
    past either)."""
    _own_job(session, caller.project_id, job_id)
    # The request's session would stay checked out (idle in a transaction) for the stream's whole
    # life: 30 open streams emptied the pool and stalled every other request. Each poll below
    # takes a connection for one query and gives it back.
    session.close()
    url = settings.database.url
    holder = caller.key.id if caller.key is not None else "admin"
    project_id = caller.project_id
    open_stream(holder, settings.limits.max_streams_per_key, project_id, settings.limits.max_streams_per_project)

    def poll(last: int | None, metric_id: int | None) -> tuple[list[dict[str, Any]], list[Metric], bool]:
        STREAM_READS.inc()
        with get_sessionmaker(url)() as s:
            rows = _events_after(s, job_id, last, 500)
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

    return CountedStream(gen(), partial(close_stream, holder, project_id))


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


METRICS_PAGE_POINTS = 5000


@router.get("/{job_id}/metrics", response_model=Page[MetricSeries], responses=NOT_FOUND)
def get_metrics(
    job_id: str,
    session: SessionDep,
    caller: CallerDep,
    name: str | None = Query(None, max_length=128),
    after_step: int | None = Query(
        None, ge=-1, le=MAX_INT, description="Only points after this step (a page's next_cursor)."
    ),
    limit: int = Query(METRICS_PAGE_POINTS, ge=1, le=50_000, description="Points per page, cut at a whole step."),
) -> dict[str, Any]:
    """Series by name, ordered by step, at most `limit` points a page (default 5000), in whole
    steps: when more remain, `next_cursor` is the last step returned; pass it as `after_step`."""
    _own_job(session, caller.project_id, job_id)
    q = select(Metric).where(Metric.job_id == job_id)
    if name:
        q = q.where(Metric.name == name)
    if after_step is not None:
        q = q.where(Metric.step > after_step)
    rows = list(session.scalars(q.order_by(Metric.step, Metric.name).limit(limit + 1)))
    next_cursor = None
    if len(rows) > limit:
        cut = rows[limit].step  # the first step not wholly on this page
        rows = [m for m in rows[:limit] if m.step < cut]
        if not rows:  # one step alone holds more than `limit` points: that step, whole
            rows = list(session.scalars(q.where(Metric.step == cut).order_by(Metric.name)))
        next_cursor = str(rows[-1].step)
    series: dict[str, list[MetricPoint]] = defaultdict(list)
    for m in rows:
        series[m.name].append(MetricPoint(step=m.step, value=m.value, time=m.time))
    return {"data": [{"name": k, "points": series[k]} for k in sorted(series)], "next_cursor": next_cursor}


@router.get("/{job_id}/samples", response_model=Page[SampleResponse], responses=NOT_FOUND)
def list_samples(
    job_id: str,
    session: SessionDep,
    caller: CallerDep,
    step: int | None = Query(None, ge=0, le=MAX_INT, description="Only the samples of this step."),
    limit: int = Query(100, ge=1, le=1000),
    cursor: str | None = None,
) -> dict[str, Any]:
    _own_job(session, caller.project_id, job_id)
    q = select(Sample).where(Sample.job_id == job_id)
    if step is not None:
        q = q.where(Sample.step == step)
    if (c := page_cursor(cursor)) is not None:
        q = q.where(Sample.id > c)
    rows = list(session.scalars(q.order_by(Sample.id).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return {"data": rows, "next_cursor": rows[-1].id if more else None}


@router.get("/{job_id}/checkpoints", response_model=Page[CheckpointResponse], responses=NOT_FOUND)
def list_checkpoints(job_id: str, session: SessionDep, caller: CallerDep) -> dict[str, Any]:
    _own_job(session, caller.project_id, job_id)
    rows = list(session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)))
    return {"data": rows, "next_cursor": None}


@router.get(
    "/{job_id}/results",
    response_class=FileResponse,
    responses={
        404: {"description": f"{JOB_NOT_FOUND} Or: {NO_RESULTS}"},
        200: {
            "content": {"application/x-ndjson": {}},
            "description": "One JSON object a line: prompt, completion, data (gold, extracted, correct, ...).",
        },
    },
)
def get_results(job_id: str, session: SessionDep, caller: CallerDep, settings: SettingsDep) -> FileResponse:
    """An eval job's per-item results (items.jsonl), streamed as NDJSON."""
    _own_job(session, caller.project_id, job_id)
    row = session.scalar(
        select(Checkpoint)
        .where(Checkpoint.job_id == job_id, Checkpoint.kind == "results")
        .order_by(Checkpoint.created_at.desc(), Checkpoint.id.desc())
        .limit(1)
    )
    if row is None:
        raise Problem(404, "Not found", NO_RESULTS)
    # API and workers share the artifact dir; serve nothing a stored uri points at outside it
    root = Path(settings.artifact_dir).resolve()
    uri = unquote(urlsplit(row.uri).path) if row.uri.startswith("file://") else row.uri
    path = Path(uri).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        log.warning("job %s: results uri %r is not a file under %s", job_id, row.uri, root)
        raise Problem(404, "Not found", RESULTS_UNAVAILABLE)
    return FileResponse(path, media_type="application/x-ndjson", filename=f"{job_id}-items.jsonl")
