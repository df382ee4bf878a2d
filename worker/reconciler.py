"""The reconciler: re-delivers what the broker lost and takes back jobs whose worker died.

It runs in every worker process (a daemon thread). Several reconcilers at once are safe:
a re-sent message for a job someone already claimed is skipped by the claim.
"""

from __future__ import annotations

import logging
import threading

from celery import Celery

from service.settings import Settings
from store.db import session_scope
from store.jobs import mark_dispatched, reconcile
from worker.celery_app import send_job

log = logging.getLogger("mathrl.reconciler")


def reconcile_once(settings: Settings, app: Celery) -> int:
    with session_scope(settings.database.url) as s:
        jobs = [(j.id, j.queue) for j in reconcile(s, settings.worker.redeliver_after_seconds)]
    for job_id, queue in jobs:
        task_id = send_job(app, job_id, queue)
        with session_scope(settings.database.url) as s:
            mark_dispatched(s, job_id, task_id)
        log.info("re-delivered job %s to %s", job_id, queue)
    return len(jobs)


def start(settings: Settings, app: Celery) -> threading.Event:
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(settings.worker.reconcile_seconds):
            try:
                reconcile_once(settings, app)
            except Exception as exc:  # database or broker down: try again next round
                log.warning("reconcile failed: %s", exc)

    threading.Thread(target=loop, name="mathrl-reconciler", daemon=True).start()
    return stop
