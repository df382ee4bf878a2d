"""Pausing and resuming a job, for both API surfaces (/v1/jobs and OpenAI's
/v1/fine_tuning/jobs): the store's moves (store.jobs.request_pause, resume), a 409 for a job
in a status they do not apply to, and the broker message of a resumed job."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.admission import check_project_quota
from api.dispatch import dispatch, new_task_id
from api.problems import Problem
from config.settings import Settings
from store.jobs import NotPausable, request_pause, resume
from store.models import Job


def pause_job(session: Session, job: Job) -> Job:
    try:
        return request_pause(session, job)
    except NotPausable as e:
        raise Problem(409, "Not pausable", str(e)) from None


def resume_job(session: Session, settings: Settings, job: Job) -> Job:
    """A resumed job counts against its project's quotas again (a 429 past them), as a new one
    would: pausing queued jobs and resuming them got past the quotas, any number of times."""
    task_id = new_task_id()

    def admit(session: Session, row: Job) -> None:
        check_project_quota(session, row.project_id, [("", row.gpus)], settings)

    try:
        row = resume(session, job, task_id, admit)
    except NotPausable as e:
        raise Problem(409, "Not paused", str(e)) from None
    if row.status == "queued" and row.celery_task_id == task_id:
        dispatch(session, settings, row.id, row.queue, task_id)
    return row
