"""Resolving model references: 'job:<id>[@step-N|@final]' becomes a checkpoint path."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from mathrl.errors import RefError as RefError  # raised here; its callers import it from here
from mathrl.modelref import split_job_ref
from store.models import Checkpoint, Job


def resolve_model_ref(session: Session, project_id: str, ref: str) -> tuple[str, str | None]:
    """Return (path or hub id to load, checkpoint label or None)."""
    job_id, suffix = split_job_ref(ref)
    if not job_id:
        return ref, None
    which = suffix.removeprefix("@")
    job = session.get(Job, job_id)
    if job is None or job.project_id != project_id:
        raise RefError(f"{ref}: no job {job_id} in this project")
    q = select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.kind.in_(("checkpoint", "final")))
    if which.startswith("step-"):
        step = int(which[5:])
        ckpt = session.scalar(q.where(Checkpoint.step == step))
        if ckpt is None:
            raise RefError(f"{ref}: job {job_id} has no checkpoint at step {step}")
    elif which in ("", "final", "latest"):
        if which in ("", "final"):
            ckpt = session.scalar(q.where(Checkpoint.kind == "final"))
            if ckpt is None and job.status != "succeeded" and which == "final":
                raise RefError(f"{ref}: job {job_id} is {job.status} and has no final model yet")
        else:
            ckpt = None
        if ckpt is None:
            ckpt = session.scalar(q.order_by(Checkpoint.step.desc()))
        if ckpt is None:
            raise RefError(f"{ref}: job {job_id} ({job.kind}, {job.status}) has saved no model")
    else:
        raise RefError(f"{ref}: write 'job:<id>', 'job:<id>@step-N' or 'job:<id>@final'")
    return ckpt.uri, f"{job_id}@{'final' if ckpt.kind == 'final' else f'step-{ckpt.step}'}"
