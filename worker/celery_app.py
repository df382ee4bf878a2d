"""The Celery app. Light on purpose: the API imports it to send messages (no torch here).

A message carries only a job id; the job row holds all state. Queues are per resource
class: 'cpu', 'gpu-1', 'gpu-8', ... (a job's `resources.gpus` picks one).
"""

from __future__ import annotations

from functools import lru_cache

from celery import Celery

TASK_RUN_JOB = "mathrl.run_job"


def make_celery(broker_url: str, visibility_timeout: int = 3600) -> Celery:
    app = Celery("mathrl", broker=broker_url, include=["worker.tasks"])
    app.conf.update(
        task_acks_late=True,  # a worker that dies mid-job leaves its message to be redelivered
        worker_prefetch_multiplier=1,  # one long job at a time per process
        task_reject_on_worker_lost=False,  # no requeue loops; the reconciler re-delivers from the DB
        task_ignore_result=True,  # state lives in the database, not a result backend
        task_default_queue="cpu",
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport_options=(
            {"visibility_timeout": visibility_timeout} if broker_url.startswith(("redis", "rediss")) else {}
        ),
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    return app


@lru_cache(maxsize=4)
def get_celery(broker_url: str, visibility_timeout: int = 3600) -> Celery:
    return make_celery(broker_url, visibility_timeout)


def send_job(app: Celery, job_id: str, queue: str, task_id: str | None = None) -> str:
    """Deliver a job id to its queue; returns the Celery task id."""
    result = app.send_task(
        TASK_RUN_JOB,
        args=[job_id],
        queue=queue,
        task_id=task_id,
        retry=True,
        retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.5, "interval_max": 1},
    )
    return str(result.id)
