"""The job state machine. Every transition is one conditional UPDATE, so two workers, a
duplicate broker message or a second pod can never both win.

    waiting ──dependencies succeeded──> queued        (pipeline jobs; store/pipelines.py)
      └──a dependency failed / was cancelled──> failed | cancelled

    queued ──claim──> running ──finish──> succeeded | failed | cancelled
      │                  │
      │                  └─lease lapsed (reconciler)──> queued   (attempts < max_attempts)
      │                                            └──> failed   (attempts exhausted)
      └──cancel──> cancelled          running ──cancel requested──> (supervisor stops it) cancelled
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from store.models import Event, Job, utcnow
from store.pipelines import settle_all, settle_dependents

TRANSITIONS: dict[str, frozenset[str]] = {
    "waiting": frozenset({"queued", "cancelled", "failed"}),
    "queued": frozenset({"running", "cancelled", "failed"}),
    "running": frozenset({"succeeded", "failed", "cancelled", "queued"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}
TERMINAL = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)


def add_event(
    session: Session,
    job_id: str,
    type: str,
    message: str = "",
    level: str = "info",
    data: dict[str, Any] | None = None,
) -> Event:
    ev = Event(job_id=job_id, type=type, message=message, level=level, data=data, time=utcnow())
    session.add(ev)
    return ev


def claim(session: Session, job_id: str, owner: str, lease_seconds: float) -> Job | None:
    """Take a queued job. Returns None when someone else has it or it is no longer queued."""
    now = utcnow()
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == "queued", Job.cancel_requested.is_(False))
        .values(
            status="running",
            lease_owner=owner,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
            attempts=Job.attempts + 1,
            started_at=now,
            error=None,
            updated_at=now,
        )
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        session.rollback()
        return None
    job = session.get(Job, job_id, populate_existing=True)
    assert job is not None
    add_event(
        session, job_id, "claimed", f"claimed by {owner} (attempt {job.attempts} of {job.max_attempts})",
        data={"owner": owner, "attempt": job.attempts},
    )
    session.commit()
    return job


@dataclass
class Heartbeat:
    owned: bool  # False: the lease was lost (reconciled away); stop the job
    cancel_requested: bool


def renew_lease(session: Session, job_id: str, owner: str, lease_seconds: float) -> Heartbeat:
    now = utcnow()
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == "running", Job.lease_owner == owner)
        .values(lease_expires_at=now + timedelta(seconds=lease_seconds))
        .execution_options(synchronize_session=False)
    )
    owned = result.rowcount == 1  # type: ignore[attr-defined]
    cancel = bool(session.scalar(select(Job.cancel_requested).where(Job.id == job_id)))
    session.commit()
    return Heartbeat(owned=owned, cancel_requested=cancel)


def finish(
    session: Session, job_id: str, owner: str, status: str, error: str | None = None, message: str = ""
) -> bool:
    """Move an owned running job to a terminal status. False if the lease was lost."""
    assert status in TERMINAL, status
    now = utcnow()
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == "running", Job.lease_owner == owner)
        .values(status=status, error=error, finished_at=now, lease_owner=None, lease_expires_at=None, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        session.rollback()
        return False
    level = {"succeeded": "info", "cancelled": "warning", "failed": "error"}[status]
    add_event(session, job_id, status, message or (error or status), level=level)
    settle_dependents(session, job_id)
    session.commit()
    return True


def request_cancel(session: Session, job: Job) -> Job:
    """Cancel a waiting or queued job at once; ask the supervisor of a running job to stop it."""
    now = utcnow()
    if job.status in ("waiting", "queued"):
        was = job.status
        result = session.execute(
            update(Job)
            .where(Job.id == job.id, Job.status == was)
            .values(status="cancelled", cancel_requested=True, finished_at=now, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount == 1:  # type: ignore[attr-defined]
            add_event(session, job.id, "cancelled", f"cancelled while {was}", level="warning")
            settle_dependents(session, job.id)
            session.commit()
            session.refresh(job)
            return job
        session.rollback()
        session.refresh(job)  # it was claimed meanwhile: fall through to the running case
    if job.status == "running" and not job.cancel_requested:
        session.execute(
            update(Job).where(Job.id == job.id).values(cancel_requested=True, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        add_event(session, job.id, "cancel_requested", "cancel requested; stopping the job process", level="warning")
        session.commit()
        session.refresh(job)
    return job


def reconcile(session: Session, redeliver_after_seconds: float, take_lapsed: bool = True) -> list[Job]:
    """Find work the broker lost or a dead worker left behind; return the jobs to send again.

    - running with a lapsed lease: back to queued (or failed once attempts are used up),
      unless `take_lapsed` is False (the caller just saw the database down: leases lapsed
      during the outage because no heartbeat could renew them, not because workers died);
    - waiting pipeline jobs whose dependencies are decided: queued, failed or cancelled;
    - queued and not dispatched for `redeliver_after_seconds`: send again.
    """
    now = utcnow()
    lapsed = session.scalars(
        select(Job).where(Job.status == "running", Job.lease_expires_at < now).with_for_update(skip_locked=True)
    ).all() if take_lapsed else []
    for job in lapsed:
        if job.attempts >= job.max_attempts:
            job.status, job.finished_at = "failed", now
            job.error = f"worker lost {job.attempts} times (lease lapsed); giving up after max_attempts={job.max_attempts}"
            add_event(session, job.id, "failed", job.error, level="error")
            session.flush()
            settle_dependents(session, job.id)
        elif job.cancel_requested:
            job.status, job.finished_at = "cancelled", now
            add_event(session, job.id, "cancelled", "worker lost while cancelling", level="warning")
            session.flush()
            settle_dependents(session, job.id)
        else:
            job.status = "queued"
            job.dispatched_at = None
            add_event(
                session, job.id, "requeued",
                f"lease of {job.lease_owner} lapsed; re-queued (attempt {job.attempts} of {job.max_attempts} used)",
                level="warning",
            )
        job.lease_owner, job.lease_expires_at = None, None
    session.flush()
    settle_all(session)  # pipelines whose settling a dead worker never finished
    cutoff = now - timedelta(seconds=redeliver_after_seconds)
    stale = session.scalars(
        select(Job)
        .where(
            Job.status == "queued",
            Job.cancel_requested.is_(False),
            or_(Job.dispatched_at.is_(None), and_(Job.dispatched_at < cutoff)),
        )
        .with_for_update(skip_locked=True)
    ).all()
    for job in stale:
        job.dispatched_at = now
    session.commit()
    return list(stale)


def mark_dispatched(session: Session, job_id: str, task_id: str, when: datetime | None = None) -> None:
    session.execute(
        update(Job).where(Job.id == job_id).values(celery_task_id=task_id, dispatched_at=when or utcnow())
        .execution_options(synchronize_session=False)
    )
    session.commit()
