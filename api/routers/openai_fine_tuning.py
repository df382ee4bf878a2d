"""OpenAI's fine-tuning jobs, for code written against the `openai` SDK
(`client.fine_tuning.jobs.create(...)`): a view over mathrl's jobs, not a second system. A
reinforcement job is a GRPO job and a supervised one an SFT job, on an uploaded file
(`dataset: {file, format: messages}`), in the one job store and state machine; they also show in
/v1/jobs and the status pages, tagged 'openai:fine_tuning'. The OpenAI request and how each of
its hyperparameters was mapped are stored with the job (resolved_config.openai): the request is
checked and mapped in api/openai/fine_tuning_requests.py, the objects read off the jobs in
api/openai/fine_tuning_views.py. docs/openai-rft.md has the mapping table and what differs."""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from sqlalchemy import select

from api.deps import CallerDep, SessionDep, SettingsDep
from api.idempotency import earlier, replayed, request_hash
from api.job_control import pause_job, resume_job
from api.openai.fine_tuning_requests import JobCreateParams, file_lines, to_spec
from api.openai.fine_tuning_views import (
    FT_JOBS,
    NOT_FOUND,
    checkpoint_object,
    event_object,
    job_object,
    trained_tokens,
)
from api.openai.records import FineTuningRecord
from api.openai.resource import listed
from api.problems import Problem
from api.submit import admit, check_job_refs, job_row, submit_keyed
from mathrl.modelref import OPENAI_METRICS
from mathrl.specs import model_refs
from store.jobs import request_cancel
from store.models import Checkpoint, Event, Job, Metric

router = APIRouter(prefix="/v1/fine_tuning/jobs", tags=["openai: fine-tuning"])

METADATA_SCAN = 10_000  # jobs one metadata-filtered list request reads at most (the rest: its next page)
# metadata keys the database filters by (a JSON path of them binds safely on PostgreSQL and SQLite); a
# filter on another key reads the jobs here, METADATA_SCAN at most a request
SQL_METADATA_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@router.post(
    "",
    responses={
        404: {"description": "A file is not in your project."},
        409: {"description": "This Idempotency-Key was used with a different request."},
        422: {"description": "The request is invalid (the detail names the field)."},
        429: {"description": "Over the project's quota of active jobs."},
    },
)
def create(
    body: JobCreateParams,
    caller: CallerDep,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    x_stainless_retry_count: Annotated[str | None, Header(max_length=8, include_in_schema=False)] = None,
) -> dict[str, Any]:
    """Start a fine-tuning job: a GRPO job (reinforcement) or an SFT job (supervised) on the file.
    A retry with the same Idempotency-Key, or the openai SDK's own retry of this request (which
    sends no key), returns the same job (api/idempotency.py)."""
    digest = request_hash(body.model_dump(mode="json", exclude_none=True))
    retry = x_stainless_retry_count
    if (existing := earlier(session, Job, caller.project_id, idempotency_key, digest, retry)) is not None:
        replayed(response)
        return job_object(session, existing)
    if body.integrations:
        raise Problem.at("/integrations", "integrations (Weights & Biases) are not supported here: leave it out")
    lines, validation_lines = file_lines(session, caller.project_id, body)
    aliases = settings.fine_tuning.model_aliases
    spec, mapping = to_spec(body, lines, settings.fine_tuning.generation_backend, validation_lines, aliases)
    check_job_refs(session, caller.project_id, model_refs(spec))
    config = admit({"": spec}, settings)[""]
    config.openai = FineTuningRecord(
        request=body.model_dump(mode="json", exclude_none=True), mapping=mapping
    ).model_dump(mode="json")
    job = job_row(caller.project_id, spec, config, settings, idempotency_key=idempotency_key, request_hash=digest)
    message = f"queued on '{job.queue}' by POST /v1/fine_tuning/jobs"
    return job_object(session, submit_keyed(session, settings, caller.project_id, job, message, response))


def metadata_filter(request: Request) -> dict[str, str]:
    """The `metadata[key]=value` query parameters, as a dict (a 400 naming one that is not)."""
    wanted: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name.startswith("metadata"):
            key = name.removeprefix("metadata[").removesuffix("]")
            if not name.startswith("metadata[") or not name.endswith("]") or not key or len(key) > 64:
                raise Problem.at(f"query:/{name}", "filter by metadata as metadata[key]=value", status=400)
            wanted[key] = value
    return wanted


def _metadata(job: Job) -> dict[str, Any]:
    return dict(FineTuningRecord.of(job).request.get("metadata") or {})


@router.get("", responses={400: {"description": "`after` is not a fine-tuning job id."}})
def list_jobs(
    request: Request,
    caller: CallerDep,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    """The project's fine-tuning jobs, newest first; `after` a job id of the previous page;
    `metadata[key]=value` (what the SDK's `metadata={...}` sends): only jobs created with those."""
    wanted = metadata_filter(request)
    q = FT_JOBS.newest_first(session, caller.project_id, after)
    # filtered by the database, no scan ('null' would be SQL's NULL in PostgreSQL's path array)
    for key in [k for k in wanted if SQL_METADATA_KEY.fullmatch(k) and k.lower() != "null"]:
        stored = Job.resolved_config[("openai", "request", "metadata", key)].as_string()
        q = q.where(stored == wanted.pop(key))
    capped = False
    if wanted:  # the request's metadata is in the stored config: read in batches until the page is full,
        # by the id (OFFSET read every skipped row again) and at most METADATA_SCAN rows a request
        rows, batch, scanned, last = [], 500, 0, None
        while True:
            chunk = list(session.scalars((q if last is None else q.where(Job.id < last)).limit(batch)))
            rows += [j for j in chunk if wanted.items() <= _metadata(j).items()]
            scanned, last = scanned + len(chunk), chunk[-1].id if chunk else last
            if len(rows) > limit or len(chunk) < batch:
                break
            if scanned >= METADATA_SCAN:  # the page so far, and has_more: the next page reads on from it
                capped = True
                break
    else:
        rows = list(session.scalars(q.limit(limit + 1)))
    page = rows[:limit]
    tokens = trained_tokens(session, page)
    return listed([job_object(session, j, tokens) for j in page], len(rows) > limit or capped, cursors=False)


@router.get("/{fine_tuning_job_id}", responses={404: {"description": NOT_FOUND}})
def retrieve(fine_tuning_job_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    return job_object(session, FT_JOBS.own(session, caller.project_id, fine_tuning_job_id))


@router.post("/{fine_tuning_job_id}/cancel", responses={404: {"description": NOT_FOUND}})
def cancel(fine_tuning_job_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    """Cancel it: at once if it has not started; a running one is `cancelled` from now on, as OpenAI
    answers, and its worker starts no further step (the step under way ends, then it stops)."""
    return job_object(session, request_cancel(session, FT_JOBS.own(session, caller.project_id, fine_tuning_job_id)))


@router.post(
    "/{fine_tuning_job_id}/pause",
    responses={404: {"description": NOT_FOUND}, 409: {"description": "Neither queued nor running."}},
)
def pause(fine_tuning_job_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    """Pause it: a queued job at once; a running one is `paused` from now on, as OpenAI answers, and
    saves a checkpoint at the end of the step under way and stops (no further step starts)."""
    return job_object(session, pause_job(session, FT_JOBS.own(session, caller.project_id, fine_tuning_job_id)))


@router.post(
    "/{fine_tuning_job_id}/resume",
    responses={
        404: {"description": NOT_FOUND},
        409: {"description": "Not paused."},
        429: {"description": "Over the project's quotas."},
    },
)
def resume_paused(fine_tuning_job_id: str, caller: CallerDep, session: SessionDep, settings: SettingsDep) -> Any:
    """Resume it: queued again, it goes on from its newest checkpoint."""
    job = FT_JOBS.own(session, caller.project_id, fine_tuning_job_id)
    return job_object(session, resume_job(session, settings, job))


@router.get("/{fine_tuning_job_id}/events", responses={404: {"description": NOT_FOUND}})
def events(
    fine_tuning_job_id: str,
    caller: CallerDep,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> dict[str, Any]:
    """The job's events, newest first (OpenAI's order); `after` an event id of the previous page."""
    job = FT_JOBS.own(session, caller.project_id, fine_tuning_job_id)
    q = select(Event).where(Event.job_id == job.id)
    if after is not None:
        m = re.match(r"^ftevent-(\d{1,18})$", after)
        if m is None:
            raise Problem(400, "Bad cursor", "query:/after: an event id from a previous page")
        q = q.where(Event.seq < int(m.group(1)))
    rows = list(session.scalars(q.order_by(Event.seq.desc()).limit(limit + 1)))
    data = [event_object(e) for e in rows[:limit]]
    return listed(data, len(rows) > limit, cursors=False)


@router.get("/{fine_tuning_job_id}/checkpoints", responses={404: {"description": NOT_FOUND}})
def checkpoints(
    fine_tuning_job_id: str,
    caller: CallerDep,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
) -> dict[str, Any]:
    """The job's checkpoints, newest first, each with the training metrics at its step."""
    job = FT_JOBS.own(session, caller.project_id, fine_tuning_job_id)
    q = select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.kind == "checkpoint")
    if after is not None:
        m = re.match(r"^ftckpt-([0-9a-f]{32})$", after)
        if m is None:
            raise Problem(400, "Bad cursor", "query:/after: a checkpoint id from a previous page")
        mark_id = str(uuid.UUID(m.group(1)))
        mark = session.get(Checkpoint, mark_id)
        if mark is not None and mark.job_id == job.id:
            q = q.where(Checkpoint.step < mark.step)
        else:
            # the cursor's checkpoint was deleted since (models.delete while paging: the SDK's iterator goes
            # on from the page's last id): ids are uuid7s, made in the order the job saved its checkpoints,
            # so the older ones are those with smaller ids. An id of no checkpoint of this job ends no page early.
            q = q.where(Checkpoint.id < mark_id)
    rows = list(session.scalars(q.order_by(Checkpoint.step.desc()).limit(limit + 1)))
    steps = [c.step for c in rows[:limit]]
    values: dict[int, dict[str, float]] = {s: {} for s in steps}
    if steps:
        q_metrics = select(Metric.step, Metric.name, Metric.value).where(
            Metric.job_id == job.id, Metric.step.in_(steps), Metric.name.in_(OPENAI_METRICS)
        )
        for step, name, value in session.execute(q_metrics).all():
            values[step][name] = value
    data = [checkpoint_object(job, c, values[c.step]) for c in rows[:limit]]
    return listed(data, len(rows) > limit, cursors=False)
