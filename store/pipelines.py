"""Pipelines: when a job ends, the jobs that wait on it move on.

A pipeline job is created `waiting` on the jobs whose output its spec refers to. When a job reaches
a terminal status, `settle_dependents` (in the same transaction, the pipeline row locked) moves its
pipeline's waiting jobs: to queued when every dependency succeeded, to failed (naming the upstream
job and its error) when one failed, to cancelled when one was cancelled; and repeats until nothing
changes. The reconciler also sweeps waiting jobs (`settle_all`). A pipeline's status is derived from
its jobs (`pipeline_status`), never stored twice. docs/using.md, "Pipelines"."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from mathrl.status import TERMINAL
from store.events import add_event
from store.models import Job, Pipeline, utcnow


def settle_pipeline(session: Session, pipeline_id: str) -> list[str]:
    """Move waiting jobs whose dependencies are decided. Returns the ids newly queued."""
    session.execute(select(Pipeline.id).where(Pipeline.id == pipeline_id).with_for_update())
    jobs = {
        j.id: j
        for j in session.scalars(
            select(Job).where(Job.pipeline_id == pipeline_id).execution_options(populate_existing=True)
        )
    }
    queued: list[str] = []
    changed = True
    while changed:
        changed = False
        for job in jobs.values():
            if job.status != "waiting":
                continue
            deps = [jobs[d] for d in job.depends_on if d in jobs]
            failed = next((d for d in deps if d.status == "failed"), None)
            cancelled = next((d for d in deps if d.status == "cancelled"), None)
            now = utcnow()
            if failed is not None:
                job.status, job.finished_at, job.updated_at = "failed", now, now
                job.error = f"upstream job '{failed.pipeline_step}' ({failed.id}) failed: {failed.error or 'failed'}"
                add_event(session, job.id, "failed", job.error, level="error")
            elif cancelled is not None:
                job.status, job.finished_at, job.updated_at = "cancelled", now, now
                job.error = f"upstream job '{cancelled.pipeline_step}' ({cancelled.id}) was cancelled"
                add_event(session, job.id, "cancelled", job.error, level="warning")
            elif all(d.status == "succeeded" for d in deps):
                job.status, job.dispatched_at, job.updated_at = "queued", None, now
                names = ", ".join(f"'{d.pipeline_step}'" for d in deps) or "none"
                add_event(
                    session,
                    job.id,
                    "queued",
                    f"dependencies succeeded ({names}); queued on '{job.queue}'",
                    level="info",
                )
                queued.append(job.id)
            else:
                continue
            changed = True
    session.flush()
    return queued


def settle_dependents(session: Session, job_id: str) -> list[str]:
    """Call after `job_id` reached a terminal status, in the same transaction."""
    pipeline_id = session.scalar(select(Job.pipeline_id).where(Job.id == job_id))
    return settle_pipeline(session, pipeline_id) if pipeline_id else []


def settle_all(session: Session) -> list[str]:
    """The reconciler's sweep: settle every pipeline that still has waiting jobs."""
    ids = session.scalars(select(Job.pipeline_id).where(Job.status == "waiting").distinct()).all()
    return [j for pid in ids if pid for j in settle_pipeline(session, pid)]


def pipeline_status(statuses: Iterable[str]) -> str:
    """running while anything can still run; then failed > cancelled > succeeded."""
    s = set(statuses)
    if "running" in s:
        return "running"
    if s - TERMINAL:  # waiting, queued or paused: it can still run
        return "queued" if not s & TERMINAL else "running"
    if "failed" in s:
        return "failed"
    if "cancelled" in s:
        return "cancelled"
    return "succeeded"
