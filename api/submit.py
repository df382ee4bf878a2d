"""Submitting jobs: the one path for POST /v1/jobs (one job) and POST /v1/pipelines (a job per
step). Each spec is admitted and its config resolved once (api/admission.py), the whole
submission is checked against the project's quotas once, the rows carry the resolved config,
and after one commit the jobs that can start are sent to the broker (api/dispatch.py)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from api.admission import QuotaProblem, admit_spec, check_project_quota
from api.dispatch import dispatch, new_task_id
from api.problems import Problem
from service.settings import Settings
from store.models import Event, Job, utcnow


def in_step(exc: Problem, step: str) -> Problem:
    """A job's admission problem, pointing into the pipeline (/model -> /jobs/<step>/model)."""
    errors = [{**e, "pointer": f"/jobs/{step}{e.get('pointer', '')}"} for e in exc.errors or []]
    return Problem(exc.status, exc.title, f"step '{step}': {exc.detail}", errors, exc.headers)


def admit(session: Session, project_id: str, specs: dict[str, Any], settings: Settings) -> dict[str, dict[str, Any]]:
    """Admit a submission: `specs` by step name ("" for a single job), in the order their rows
    will be added. Returns each one's resolved config; raises the first Problem, pointing into
    its step."""
    configs: dict[str, dict[str, Any]] = {}
    for key, spec in specs.items():
        try:
            configs[key] = admit_spec(spec, settings)
        except Problem as exc:
            raise (in_step(exc, key) if key else exc) from None
    try:
        check_project_quota(session, project_id, specs, settings)
    except QuotaProblem as exc:
        raise (in_step(exc, exc.key) if exc.key else exc) from None
    return configs


def job_row(project_id: str, spec: Any, config: dict[str, Any], start: bool = True, **fields: Any) -> Job:
    """A job's row from its admitted spec and resolved config. `start`: queued and given a
    task id now (else waiting, for a pipeline step with dependencies); `fields` add to or
    override what comes from the spec (name, tags, ids of a pipeline step)."""
    row: dict[str, Any] = {
        "project_id": project_id,
        "kind": spec.kind,
        "name": spec.name,
        "tags": spec.tags,
        "spec": spec.model_dump(mode="json"),
        "resolved_config": config,
        "queue": spec.resources.queue,
        "max_attempts": spec.max_attempts,
        "status": "queued" if start else "waiting",
        "celery_task_id": new_task_id() if start else None,
        "dispatched_at": utcnow() if start else None,
    }
    return Job(**{**row, **fields})


def commit_and_dispatch(session: Session, settings: Settings, jobs: list[tuple[Job, str]]) -> None:
    """Give each added (and flushed) job its first event (`message`), commit them all, then
    send the queued ones to the broker."""
    for job, message in jobs:
        session.add(Event(job_id=job.id, type=job.status, message=message, level="info"))
    session.commit()
    for job, _ in jobs:
        if job.status == "queued":
            dispatch(session, settings, job.id, job.queue, job.celery_task_id or "")
