"""A create future's answer (api/routers/tinker.py `retrieve_future` on a `<job id>:create` request
id), read off the store while the client's session job starts: its model id once the job serves,
an error once it ended (`create_status`), or how it still waits (`queue_state`)."""

from __future__ import annotations

from typing import Any

from api.tinker.common import sessions_of
from config.settings import Settings
from mathrl.status import WAIT_ENDS
from store.db import get_sessionmaker
from store.models import Endpoint, Job


def create_status(settings: Settings, project_id: str, job_id: str) -> dict[str, Any] | None:
    """A create future's result: the model id once its job serves, an error once it ended, else None."""
    with get_sessionmaker(settings.database.url)() as s:
        job = s.get(Job, job_id)
        if job is None or job.project_id != project_id:
            return {"error": f"no request {job_id}:create in this project", "category": "user"}
        if s.get(Endpoint, job_id) is not None:
            return {"model_id": job.name}
        if job.status in WAIT_ENDS:
            return {
                "error": f"the session job {job_id} {job.status}: {job.error or 'no error recorded'}",
                "category": "server",
            }
        return None


def queue_state(settings: Settings, project_id: str, job_id: str) -> dict[str, str]:
    """How a create future still waits, as the SDK's try_again reads it: `active` while its job's
    process starts, `paused_capacity` with the reason while the job waits for a worker. A client
    that ends without finishing its session holds its worker until its heartbeat lapses: the
    project's own sessions that hold a worker of the same queue are named."""
    with get_sessionmaker(settings.database.url)() as s:
        job = s.get(Job, job_id)
        if job is None or job.status != "queued":
            return {"queue_state": "active"}
        q = sessions_of(project_id).where(Job.status == "running", Job.queue == job.queue, Job.id != job_id)
        holding = list(s.scalars(q.order_by(Job.created_at)))
    reason = f"the session job {job_id} waits for a worker of queue '{job.queue}'"
    if holding:
        names = ", ".join(
            f"{j.name} (heartbeat timeout {(j.spec or {}).get('heartbeat_timeout_seconds', '?')} s)"
            for j in holding[:5]
        )
        reason += (
            f"; your project's sessions hold workers there: {names}. A client that ends without finishing its "
            "session holds its worker until that timeout passes"
        )
    return {"queue_state": "paused_capacity", "queue_state_reason": reason}
