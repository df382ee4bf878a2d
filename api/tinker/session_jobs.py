"""A Tinker client's session job (api/routers/tinker.py): submitted through the one submit path
(`submit_session`: a training client, a sampling client, or one loaded from a save, whose LoRA
options `lora_fields` carries over), refused when another project's jobs carry its session id,
and cancelled when it ends before it serves (`cancel_session_job`)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import select

from api.problems import Problem
from api.submit import admit, check_job_refs, commit_and_dispatch, job_row
from config.settings import Settings
from mathrl.specs import SessionSpec, model_refs
from mathrl.status import TERMINAL
from store.db import get_sessionmaker
from store.jobs import request_cancel
from store.models import Job

TAG = "tinker"
SESSION_ELSEWHERE = "no session {!r} in this project: use the session_id that create_session gave this project's key"


def _held_elsewhere(s: Any, project_id: str, session_id: str | None) -> bool:
    """Whether another project's jobs carry this session id. A session is stored only as its jobs,
    so an id no job carries is anyone's to start; one another project's jobs carry is that project's:
    before, a job was made in the caller's project under the other project's session."""
    if not session_id:
        return False
    q = (
        select(Job.spec)
        .where(Job.kind == "session", Job.project_id != project_id, Job.name.like(f"{session_id}:%"))
        .limit(64)
    )
    return any((spec or {}).get("session") == session_id for spec in s.scalars(q))


def submit_session(settings: Settings, project_id: str, fields: dict[str, Any], what: str) -> str:
    fields.setdefault("heartbeat_timeout_seconds", settings.sessions.heartbeat_timeout_seconds)
    fields.setdefault("warm_engine", settings.sessions.warm_engine)
    try:
        spec = SessionSpec(tags=[TAG], **fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise Problem.at("/" + "/".join(str(p) for p in err["loc"]), err["msg"], status=400) from None
    with get_sessionmaker(settings.database.url)() as session:
        if _held_elsewhere(session, project_id, spec.session):
            raise Problem.at("/session_id", SESSION_ELSEWHERE.format(spec.session), status=404)
        # another job's output ('job:', 'ft:' names): one of the project's, before admit reads its config
        check_job_refs(session, project_id, model_refs(spec))
        config = admit({"": spec}, settings)[""]
        job = job_row(project_id, spec, config, settings)
        session.add(job)
        commit_and_dispatch(session, settings, project_id, [(job, f"queued on '{job.queue}' by POST /api/v1/{what}")])
        return str(job.id)


def lora_fields(spec: dict[str, Any]) -> dict[str, Any]:
    keys = ("lora_rank", "train_attn", "train_mlp", "train_unembed", "heartbeat_timeout_seconds", "dtype", "resources")
    return {k: spec[k] for k in keys if k in spec}


def cancel_session_job(settings: Settings, job_id: str) -> None:
    with get_sessionmaker(settings.database.url)() as s:
        job = s.get(Job, job_id)
        if job is not None and job.status not in TERMINAL:
            request_cancel(s, job)
