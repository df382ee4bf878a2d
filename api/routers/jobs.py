"""/v1/jobs: submit, list, get, cancel; and each job's events, metrics, samples, checkpoints (what
they read off the store: api/job_views.py; the event stream: api/job_stream.py)."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse
from sqlalchemy import select

from api.deps import CallerDep, SessionDep, SettingsDep
from api.idempotency import earlier, replayed, request_hash
from api.job_control import pause_job, resume_job
from api.job_stream import CountedStream, event_stream
from api.job_views import (
    METRICS_PAGE_POINTS,
    events_after,
    job_page,
    metric_page,
    own_job,
    results_path,
    sample_page,
)
from api.problems import IDEMPOTENCY_CONFLICT, JOB_NOT_FOUND, NO_RESULTS
from api.streams import close_stream, open_stream
from api.submit import admit, check_file_refs, check_job_refs, job_row, submit_keyed
from mathrl.schemas import (
    CheckpointResponse,
    EventResponse,
    JobResponse,
    JobStatus,
    MetricSeries,
    Page,
    SampleResponse,
)
from mathrl.specs import AnySpec, model_refs
from mathrl.status import TERMINAL
from store.jobs import request_cancel
from store.models import Checkpoint, Job

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": JOB_NOT_FOUND}}

# The largest values the columns a query parameter is compared with can hold (store/models.py):
# event seqs and metric ids are bigint, steps integer. Past them PostgreSQL raises mid-query
# (in a stream: after its 200 was sent), so the parameters are bounded and FastAPI answers 422.
MAX_BIGINT = 2**63 - 1
MAX_INT = 2**31 - 1


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
    return job_page(session, caller.project_id, kind, status, tag, pipeline_id, limit, cursor)


@router.get("/{job_id}", response_model=JobResponse, responses=NOT_FOUND)
def get_job(job_id: str, session: SessionDep, caller: CallerDep) -> Job:
    return own_job(session, caller.project_id, job_id)


@router.post("/{job_id}/cancel", response_model=JobResponse, responses=NOT_FOUND)
def cancel_job(job_id: str, session: SessionDep, caller: CallerDep) -> Job:
    """Cancel: a queued job ends at once; a running one is stopped (SIGTERM, then SIGKILL)."""
    job = own_job(session, caller.project_id, job_id)
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
    return pause_job(session, own_job(session, caller.project_id, job_id))


@router.post(
    "/{job_id}/resume",
    response_model=JobResponse,
    responses={**NOT_FOUND, 409: {"description": "Not paused."}, 429: {"description": "Over the project's quotas."}},
)
def resume_paused(job_id: str, session: SessionDep, caller: CallerDep, settings: SettingsDep) -> Job:
    """Resume a paused job: queued again, it goes on from its newest checkpoint. It counts against
    the project's quotas again, as a new job would (429 past them)."""
    return resume_job(session, settings, own_job(session, caller.project_id, job_id))


@router.get("/{job_id}/events", response_model=Page[EventResponse], responses=NOT_FOUND)
def list_events(
    job_id: str,
    session: SessionDep,
    caller: CallerDep,
    after: int | None = Query(None, ge=0, le=MAX_BIGINT),
    limit: int = Query(500, ge=1, le=5000),
) -> dict[str, Any]:
    """The event log in order. Pass the last `seq` you saw as `after`."""
    own_job(session, caller.project_id, job_id)
    rows = events_after(session, job_id, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return {"data": rows, "next_cursor": str(rows[-1].seq) if more else None}


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
    own_job(session, caller.project_id, job_id)
    # The request's session would stay checked out (idle in a transaction) for the stream's whole
    # life: 30 open streams emptied the pool and stalled every other request. Each poll
    # (api/job_stream.py) takes a connection for one query and gives it back.
    session.close()
    url = settings.database.url
    holder = caller.key.id if caller.key is not None else "admin"
    project_id = caller.project_id
    open_stream(holder, settings.limits.max_streams_per_key, project_id, settings.limits.max_streams_per_project)
    lines = event_stream(request, url, job_id, project_id, after, metrics, metrics_after_step)
    return CountedStream(lines, partial(close_stream, holder, project_id))


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
    own_job(session, caller.project_id, job_id)
    return metric_page(session, job_id, name, after_step, limit)


@router.get("/{job_id}/samples", response_model=Page[SampleResponse], responses=NOT_FOUND)
def list_samples(
    job_id: str,
    session: SessionDep,
    caller: CallerDep,
    step: int | None = Query(None, ge=0, le=MAX_INT, description="Only the samples of this step."),
    limit: int = Query(100, ge=1, le=1000),
    cursor: str | None = None,
) -> dict[str, Any]:
    own_job(session, caller.project_id, job_id)
    return sample_page(session, job_id, step, limit, cursor)


@router.get("/{job_id}/checkpoints", response_model=Page[CheckpointResponse], responses=NOT_FOUND)
def list_checkpoints(job_id: str, session: SessionDep, caller: CallerDep) -> dict[str, Any]:
    own_job(session, caller.project_id, job_id)
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
    own_job(session, caller.project_id, job_id)
    path = results_path(session, settings, job_id)
    return FileResponse(path, media_type="application/x-ndjson", filename=f"{job_id}-items.jsonl")
