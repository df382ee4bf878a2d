"""/v1/pipelines: several named job specs in one submission, run in dependency order.

A step refers to an earlier step's output as 'job:<step>' (or 'job:<step>@step-200'); the
API turns that into 'job:<job id>' in the stored job spec and records the dependency. Jobs
with nothing to wait for are queued at once; the others wait (store/pipelines.py moves them).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.deps import CallerDep, SessionDep, SettingsDep, owned, page_cursor
from api.idempotency import commit_or_replay, earlier, replayed, request_hash
from api.problems import PIPELINE_NOT_FOUND, Problem
from api.submit import admit, check_file_refs, check_job_refs, commit_and_dispatch, job_row
from kinds import HOMES, model_savers
from mathrl.schemas import Page, PipelineResponse
from mathrl.specs import PipelineSpec, model_refs, parse_spec, split_job_ref
from mathrl.status import TERMINAL
from store.ids import uuid7
from store.jobs import request_cancel
from store.models import Job, Pipeline
from store.pipelines import pipeline_status

router = APIRouter(prefix="/v1/pipelines", tags=["pipelines"])

NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": PIPELINE_NOT_FOUND}}


def _own_pipeline(session: Session, project_id: str, pipeline_id: str) -> Pipeline:
    return owned(session, Pipeline, project_id, pipeline_id, PIPELINE_NOT_FOUND)


def _set_path(data: dict[str, Any], path: str, value: str) -> None:
    keys = path.split("/")
    node: Any = data
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[keys[-1]] = value


def _order(deps: dict[str, list[str]]) -> list[str]:
    """Steps with every dependency before them (the spec is known to be acyclic)."""
    out: list[str] = []
    seen: set[str] = set()

    def visit(step: str) -> None:
        if step in seen:
            return
        seen.add(step)
        for d in deps[step]:
            visit(d)
        out.append(step)

    for step in deps:
        visit(step)
    return out


def view(pipeline: Pipeline, jobs: list[Job]) -> dict[str, Any]:
    by_id = {j.id: j.pipeline_step for j in jobs}
    statuses = [j.status for j in jobs]
    status = pipeline_status(statuses)
    finished = max((j.finished_at for j in jobs if j.finished_at), default=None) if status in TERMINAL else None
    return {
        "id": pipeline.id,
        "project_id": pipeline.project_id,
        "name": pipeline.name,
        "tags": pipeline.tags,
        "status": status,
        "spec": pipeline.spec,
        "created_at": pipeline.created_at,
        "finished_at": finished,
        "jobs": [
            {
                "step": j.pipeline_step,
                "job_id": j.id,
                "kind": j.kind,
                "status": j.status,
                "error": j.error,
                "depends_on": [by_id.get(d, d) for d in j.depends_on],
            }
            for j in jobs
        ],
    }


def _jobs_of(session: Session, pipeline_ids: list[str]) -> dict[str, list[Job]]:
    out: dict[str, list[Job]] = {pid: [] for pid in pipeline_ids}
    if pipeline_ids:
        for j in session.scalars(select(Job).where(Job.pipeline_id.in_(pipeline_ids)).order_by(Job.id)):
            out[str(j.pipeline_id)].append(j)
    return out


@router.post(
    "",
    status_code=201,
    response_model=PipelineResponse,
    responses={
        422: {
            "description": "A spec is invalid, a reference dangles, the steps form a cycle, a source is not allowed, "
            "or a step's memory plan does not fit its pool's GPUs."
        },
        429: {"description": "The pipeline's jobs would exceed the project's quota of active jobs or GPUs."},
        200: {
            "description": "A replay: this Idempotency-Key and body created this pipeline before.",
            "model": PipelineResponse,
        },
        409: {"description": "This Idempotency-Key was used with a different request body."},
    },
)
def create_pipeline(
    spec: Annotated[PipelineSpec, Body()],
    session: SessionDep,
    caller: CallerDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> dict[str, Any]:
    """Submit named job specs at once; a later step names an earlier one's output as 'job:<step>'.
    With an `Idempotency-Key`, resubmitting the same body returns the same pipeline (200)."""
    digest = request_hash(spec.model_dump(mode="json", exclude_unset=True))
    if (existing := earlier(session, Pipeline, caller.project_id, idempotency_key, digest)) is not None:
        replayed(response)
        return view(existing, _jobs_of(session, [existing.id])[existing.id])
    deps = spec.dependencies()
    order = _order(deps)
    ids = {step: uuid7() for step in order}
    finals: dict[str, Any] = {}
    for step in order:  # everything is checked before anything is stored
        job_spec = spec.jobs[step]
        body = job_spec.model_dump(mode="json")
        outside: dict[str, str] = {}  # references to jobs that exist already: checked like a job's
        for path, ref in model_refs(job_spec).items():
            target, suffix = split_job_ref(ref)
            if target in ids:
                made = spec.jobs[target].kind
                if not HOMES[made].saves_models:  # (accepted, then this step failed on the worker)
                    savers = model_savers()
                    detail = f"{ref!r}: step {target!r} is {made}: that kind saves no model: name one of {savers}"
                    raise Problem.at(f"/jobs/{step}/{path}", detail)
                _set_path(body, path, f"job:{ids[target]}{suffix}")
            elif target:
                outside[path] = ref
        check_job_refs(session, caller.project_id, outside, f"/jobs/{step}", " (or name a step of this pipeline)")
        check_file_refs(session, caller.project_id, job_spec, f"/jobs/{step}")
        try:
            finals[step] = parse_spec(body)
        except ValidationError as exc:  # a spec that held as sent and not once its references were filled in
            errors = [{**e, "loc": ("body", "jobs", step, *e["loc"])} for e in exc.errors(include_url=False)]
            raise RequestValidationError(errors) from None
    configs = admit(finals, settings)
    pipeline = Pipeline(
        id=uuid7(),
        project_id=caller.project_id,
        name=spec.name,
        tags=spec.tags,
        spec=spec.model_dump(mode="json", exclude_unset=True),
        idempotency_key=idempotency_key,
        request_hash=digest,
    )
    session.add(pipeline)
    stored, earlier_one = commit_or_replay(session, pipeline, response, session.flush)
    if earlier_one:  # a concurrent retry with the same key won the race
        return view(stored, _jobs_of(session, [stored.id])[stored.id])
    jobs: list[Job] = []
    for step in order:
        final = finals[step]
        job = job_row(
            caller.project_id,
            final,
            configs[step],
            settings,
            start=not deps[step],
            id=ids[step],
            name=final.name or f"{spec.name or 'pipeline'}/{step}",
            tags=list(dict.fromkeys([*spec.tags, *final.tags])),
            pipeline_id=pipeline.id,
            pipeline_step=step,
            depends_on=[ids[d] for d in deps[step]],
        )
        session.add(job)
        jobs.append(job)
    commit_and_dispatch(
        session,
        settings,
        caller.project_id,
        [
            (
                job,
                f"waiting for {', '.join(repr(d) for d in deps[job.pipeline_step or ''])}"
                if job.status == "waiting"
                else f"queued on '{job.queue}'",
            )
            for job in jobs
        ],
    )
    session.refresh(pipeline)
    return view(pipeline, sorted(jobs, key=lambda j: j.id))


@router.get("", response_model=Page[PipelineResponse])
def list_pipelines(
    session: SessionDep, caller: CallerDep, limit: int = Query(20, ge=1, le=200), cursor: str | None = None
) -> dict[str, Any]:
    """Pipelines newest first. Follow `next_cursor` for the next page."""
    q = select(Pipeline).where(Pipeline.project_id == caller.project_id)
    if page_cursor(cursor) is not None:
        q = q.where(Pipeline.id < cursor)
    rows = list(session.scalars(q.order_by(Pipeline.id.desc()).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    jobs = _jobs_of(session, [p.id for p in rows])
    return {"data": [view(p, jobs[p.id]) for p in rows], "next_cursor": rows[-1].id if more and rows else None}


@router.get("/{pipeline_id}", response_model=PipelineResponse, responses=NOT_FOUND)
def get_pipeline(pipeline_id: str, session: SessionDep, caller: CallerDep) -> dict[str, Any]:
    p = _own_pipeline(session, caller.project_id, pipeline_id)
    return view(p, _jobs_of(session, [p.id])[p.id])


@router.post("/{pipeline_id}/cancel", response_model=PipelineResponse, responses=NOT_FOUND)
def cancel_pipeline(pipeline_id: str, session: SessionDep, caller: CallerDep) -> dict[str, Any]:
    """Cancel every job of the pipeline that has not ended (running ones are stopped)."""
    p = _own_pipeline(session, caller.project_id, pipeline_id)
    for job in _jobs_of(session, [p.id])[p.id]:
        session.refresh(job)
        if job.status not in TERMINAL:
            request_cancel(session, job)
    return view(p, _jobs_of(session, [p.id])[p.id])
