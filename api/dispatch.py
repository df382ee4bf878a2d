"""Handing a job to the broker. Failures here lose nothing: the reconciler re-sends any
queued job that was not dispatched."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from service.settings import Settings
from store.jobs import mark_dispatched
from worker.celery_app import get_celery, send_job

log = logging.getLogger("mathrl.api")


def dispatch(session: Session, settings: Settings, job_id: str, queue: str) -> None:
    try:
        app = get_celery(settings.broker.url, settings.broker.visibility_timeout)
        task_id = send_job(app, job_id, queue)
    except Exception as exc:  # broker down: the job stays queued and the reconciler sends it
        log.warning("could not send job %s to the broker (%s); the reconciler will retry", job_id, exc)
        return
    mark_dispatched(session, job_id, task_id)
