"""Celery tasks: thin. A message carries a job id; the supervisor does the rest."""

from __future__ import annotations

import logging

from celery import Task
from celery.signals import worker_init, worker_ready, worker_shutting_down

from config.settings import get_settings
from worker import hub_access, reconciler, warm_engine, watch
from worker.celery_app import TASK_RUN_JOB, get_celery
from worker.job_handle import fork_server
from worker.supervisor import supervise, worker_identity

log = logging.getLogger("mathrl.worker")

_settings = get_settings()
app = get_celery(_settings.broker.url, _settings.broker.visibility_timeout)


@worker_init.connect
def _limit_the_hub_token(**_: object) -> None:
    """In the worker's process, before it takes a job: it resolves hub models for the vLLM servers it
    starts (at the worker's start, not at import: a process that imports this module is not a worker)."""
    hub_access.install(get_settings().sources.hub_token_repos)


@app.task(name=TASK_RUN_JOB, bind=True)
def run_job(self: Task, job_id: str) -> str:
    return supervise(get_settings(), job_id, worker_identity(self.request.id))


@worker_ready.connect
def _start_reconciler(**_: object) -> None:
    reconciler.start(get_settings(), app)
    log.info("reconciler started")
    fork_server(get_settings())  # its imports begin now, so the first jobs find it ready


@worker_shutting_down.connect
def _drain_on_shutdown(sig: str = "", how: str = "", **_: object) -> None:
    """SIGTERM (Kubernetes stopping the pod, a rolling update): Celery stops taking messages and
    waits for the running tasks; the supervisor of each one drains its job (checkpoint at the
    next step, back to the queue) instead of running it to the end or losing it."""
    log.warning("%s: %s shutdown; draining running jobs", sig, how)
    watch.shutting_down.set()
    warm_engine.stop_idle()
