"""Handing a job to the broker. The job row records the dispatch (task id, time) in the same
transaction that creates it; if the broker cannot take the message, the row is marked
undispatched and the reconciler sends it later. Nothing is lost either way."""

from __future__ import annotations

import logging
import uuid

from sqlalchemy import update
from sqlalchemy.orm import Session

from config.settings import Settings
from store.models import Job
from worker.celery_app import get_celery, send_job

log = logging.getLogger("mathrl.api")


def new_task_id() -> str:
    return str(uuid.uuid4())


def dispatch(session: Session, settings: Settings, job_id: str, queue: str, task_id: str) -> None:
    """Send a committed job whose row already holds `task_id` and `dispatched_at`."""
    try:
        app = get_celery(settings.broker.url, settings.broker.visibility_timeout)
        send_job(app, job_id, queue, task_id)
    except Exception as exc:  # broker down: the reconciler sends queued, undispatched jobs
        log.warning("could not send job %s to the broker (%s); the reconciler will retry", job_id, exc)
        session.execute(update(Job).where(Job.id == job_id).values(dispatched_at=None))
        session.commit()
