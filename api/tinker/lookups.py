"""The session jobs a Tinker call names (api/routers/tinker.py), found in the caller's project only:
a training client's job by its model id (`job_named`, `model_job`), a job by its id or by a request
or sampler id that starts with it (`job_with_id`, `id_job`), and a session's jobs (`session_jobs`)."""

from __future__ import annotations

from fastapi.concurrency import run_in_threadpool

from api.deps import Caller
from api.problems import Problem
from api.tinker.common import Located, located, sessions_of
from config.settings import Settings
from store.db import get_sessionmaker
from store.models import Job


def job_named(settings: Settings, project_id: str, name: str) -> Located | None:
    with get_sessionmaker(settings.database.url)() as s:
        q = sessions_of(project_id).where(Job.name == name).order_by(Job.created_at.desc()).limit(1)
        return next(iter(located(s, q)), None)


def job_with_id(settings: Settings, project_id: str, job_id: str) -> Located | None:
    with get_sessionmaker(settings.database.url)() as s:
        return next(iter(located(s, sessions_of(project_id).where(Job.id == job_id))), None)


def session_jobs(settings: Settings, project_id: str, session_id: str) -> list[Located]:
    with get_sessionmaker(settings.database.url)() as s:
        q = sessions_of(project_id).where(Job.name.like(f"{session_id}:%"))
        return [at for at in located(s, q) if (at.job.spec or {}).get("session") == session_id]


async def model_job(settings: Settings, caller: Caller, model_id: str) -> Located:
    job = await run_in_threadpool(job_named, settings, caller.project_id, str(model_id))
    if job is None:
        raise Problem(404, "Not found", f"model_id: no training client {model_id!r} in this project")
    return job


def _job_of_id(value: str) -> str:
    """The job id a request or sampler id starts with ('<job id>:...')."""
    return value.split(":", 1)[0]


async def id_job(settings: Settings, caller: Caller, value: str, what: str) -> Located:
    job = await run_in_threadpool(job_with_id, settings, caller.project_id, _job_of_id(value))
    if job is None:
        raise Problem(404, "Not found", f"{what}: no {value!r} in this project")
    return job
