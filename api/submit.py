"""Submitting jobs: the one path for POST /v1/jobs (one job) and POST /v1/pipelines (a job per
step). Each spec is admitted and its config resolved once (api/admission.py), the whole
submission is checked against the project's quotas once, the rows carry the resolved config,
and after one commit the jobs that can start are sent to the broker (api/dispatch.py)."""

from __future__ import annotations

from typing import Any

from fastapi import Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.admission import QuotaProblem, admit_spec, check_project_quota, held_gpus
from api.dispatch import dispatch, new_task_id
from api.idempotency import commit_or_replay
from api.problems import Problem
from config.settings import Settings
from kinds import HOMES, model_savers
from mathrl.modelref import FINAL_DELETED_TAG
from mathrl.specs import ID_PATTERN, AnySpec, file_refs, split_job_ref
from mathrl.specs.resolved import ResolvedConfig
from mathrl.status import TERMINAL
from store.files import expired
from store.ids import uuid7
from store.models import Checkpoint, Event, Job, utcnow

JOB_REF_NOT_FOUND = "{ref!r}: no job with this id in your project"


def check_job_refs(session: Session, project_id: str, refs: dict[str, str], prefix: str = "", hint: str = "") -> None:
    """Every 'job:<id>' reference (field path -> ref, mathrl.specs.model_refs) names a job of the
    project, or the submission is a 422 at that field: the same answer whether the job does not
    exist or is another project's, so it tells nothing about other projects. `prefix` points
    into a pipeline's step ('/jobs/<step>'); `hint` ends the message."""
    for path, ref in refs.items():
        target, which = split_job_ref(ref)
        if not target:
            continue
        job = session.get(Job, target) if ID_PATTERN.match(target) else None
        if job is None or job.project_id != project_id:
            pointer = f"{prefix}/{path}"
            msg = JOB_REF_NOT_FOUND.format(ref=ref) + hint
            raise Problem.at(pointer, msg, "Invalid request")
        if which in ("", "@final") and FINAL_DELETED_TAG in (job.tags or []):  # DELETE /v1/models
            raise Problem.at(f"{prefix}/{path}", f"{ref!r}: that job's final model was deleted", "Invalid request")
        if job.kind in HOMES and not HOMES[job.kind].saves_models:  # accepted, then failed on the worker
            detail = f"{ref!r}: {job.kind} jobs save no model: name a job that trains one ({model_savers()})"
            raise Problem.at(f"{prefix}/{path}", detail, "Invalid request")
        if which.startswith("@step-") and job.status in TERMINAL:  # (a job under way may save it yet)
            step = int(which.removeprefix("@step-"))
            saved = select(Checkpoint.id).where(Checkpoint.job_id == job.id, Checkpoint.step == step)
            if session.scalar(saved.where(Checkpoint.kind.in_(("checkpoint", "final")))) is None:
                detail = f"{ref!r}: that job ({job.status}) saved no checkpoint at step {step}"
                raise Problem.at(f"{prefix}/{path}", detail, "Invalid request")


def check_file_refs(session: Session, project_id: str, spec: AnySpec, prefix: str = "") -> None:
    """A spec's uploaded files (every field typed FileRef: `dataset.file`, `eval.file`, a generate
    job's `batch.file`, mathrl.specs.file_refs) are the project's, or the submission is a 422 at that
    field (the same answer for another project's file: it tells nothing), and of the purpose the
    field asks for (a batch's: a file of requests, purpose 'batch')."""
    from store.models import File

    for where, use in file_refs(spec).items():
        row = session.get(File, use.file_id)
        if row is None or row.project_id != project_id or expired(row):
            msg = f"{use.file_id!r}: no file with this id in your project (POST /v1/files uploads one)"
            raise Problem.at(f"{prefix}/{where}", msg)
        if use.purpose is not None and row.purpose != use.purpose:
            msg = f"{use.file_id!r} is a {row.purpose!r} file: {where} reads a file of purpose {use.purpose!r}"
            raise Problem.at(f"{prefix}/{where}", msg)


def in_step(exc: Problem, step: str) -> Problem:
    """A job's admission problem, pointing into the pipeline (/model -> /jobs/<step>/model)."""
    errors = [{**e, "pointer": f"/jobs/{step}{e.get('pointer', '')}"} for e in exc.errors or []]
    return Problem(exc.status, exc.title, f"step '{step}': {exc.detail}", errors, exc.headers)


def admit(specs: dict[str, Any], settings: Settings) -> dict[str, ResolvedConfig]:
    """Admit a submission: `specs` by step name ("" for a single job). Returns each one's
    resolved config; raises the first Problem, pointing into its step. (The project's quotas are
    checked at the commit: commit_and_dispatch.)"""
    configs: dict[str, ResolvedConfig] = {}
    for key, spec in specs.items():
        try:
            configs[key] = admit_spec(spec, settings)
        except Problem as exc:
            raise (in_step(exc, key) if key else exc) from None
    return configs


def job_row(
    project_id: str, spec: AnySpec, config: ResolvedConfig, settings: Settings, start: bool = True, **fields: Any
) -> Job:
    """A job's row from its admitted spec and resolved config. `start`: queued and given a
    task id now (else waiting, for a pipeline step with dependencies); `fields` add to or
    override what comes from the spec (name, tags, ids of a pipeline step)."""
    row: dict[str, Any] = {
        "project_id": project_id,
        "kind": spec.kind,
        "name": spec.name,
        "tags": spec.tags,
        "spec": spec.model_dump(mode="json"),
        "resolved_config": config.record(),
        "queue": spec.resources.queue,
        "gpus": held_gpus(spec, settings),  # what it holds against the project's GPU quota while active
        "max_attempts": spec.max_attempts,
        "status": "queued" if start else "waiting",
        "celery_task_id": new_task_id() if start else None,
        "dispatched_at": utcnow() if start else None,
        "id": uuid7(),  # known before the insert: its first event goes in the same flush
    }
    return Job(**{**row, **fields})


def commit_and_dispatch(session: Session, settings: Settings, project_id: str, jobs: list[tuple[Job, str]]) -> None:
    """Insert the added jobs and give each its first event (`message`), check the
    submission against the project's quotas (a 429 rolls it all back), commit, then send the
    queued ones to the broker. The insert takes the project row's lock (its counters' trigger)
    and the commit right after releases it: submissions of one project queue only over that."""
    session.flush()  # the jobs (no ORM relationship orders them before their events)
    session.add_all([Event(job_id=job.id, type=job.status, message=message, level="info") for job, message in jobs])
    session.flush()
    try:
        check_project_quota(session, project_id, [(job.pipeline_step or "", job.gpus) for job, _ in jobs], settings)
    except QuotaProblem as exc:
        session.rollback()
        raise (in_step(exc, exc.key) if exc.key else exc) from None
    session.commit()
    for job, _ in jobs:
        if job.status == "queued":
            dispatch(session, settings, job.id, job.queue, job.celery_task_id or "")


def submit_keyed(
    session: Session, settings: Settings, project_id: str, job: Job, message: str, response: Response
) -> Job:
    """Insert and send one job (commit_and_dispatch) that carries its create's Idempotency-Key and
    request hash: where a concurrent create with the same key won the race (the key is unique per
    project), the job that one made, and the response says it is a replay (api/idempotency.py)."""
    session.add(job)
    stored, earlier_one = commit_or_replay(
        session, job, response, lambda: commit_and_dispatch(session, settings, project_id, [(job, message)])
    )
    if not earlier_one:
        session.refresh(stored)  # what the database set on insert (its counters' trigger, defaults)
    return stored
