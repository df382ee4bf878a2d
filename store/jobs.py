"""The job state machine. The statuses and the moves between them are defined once, in
mathrl/status.py (the diagram is there); here every move is made, each one conditional UPDATE
(`move`), so two workers, a duplicate broker message or a second pod can never both win, and
a move mathrl.status does not allow is refused before it reaches the database."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Update, and_, case, cast, exists, func, literal, or_, select, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from mathrl.status import NOT_STARTED, TERMINAL, check_move
from store.errors import NotPausable as NotPausable  # raised here; its callers import it from here
from store.events import add_event as add_event  # every module that records an event imports it from here
from store.models import Job, Pipeline, utcnow
from store.pipelines import settle_all, settle_dependents


def move(before: tuple[str, ...] | str, after: str) -> Update:
    """The one way a bulk UPDATE changes a job's status: `update(Job)` restricted to jobs in
    `before`, setting `after`, refused at once (IllegalTransition) unless mathrl.status allows
    every one of those moves. (ORM attribute sets are checked by Job's status validator.)"""
    froms = (before,) if isinstance(before, str) else before
    for f in froms:
        check_move(f, after)
    return update(Job).where(Job.status.in_(froms)).values(status=after)


def claim(session: Session, job_id: str, owner: str, lease_seconds: float) -> Job | None:
    """Take a queued job. Returns None when someone else has it or it is no longer queued."""
    now = utcnow()
    result = session.execute(
        move("queued", "running")
        .where(Job.id == job_id, Job.cancel_requested.is_(False))
        .values(
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
        session,
        job_id,
        "claimed",
        f"claimed by {owner} (attempt {job.attempts} of {job.max_attempts}"
        + (f", not counting {job.drains} drained" if job.drains else "")
        + ")",
        data={"owner": owner, "attempt": job.attempts},
    )
    session.commit()
    return job


@dataclass
class Heartbeat:
    owned: bool  # False: the lease was lost (reconciled away); stop the job
    cancel_requested: bool
    pause_requested: bool = False  # drain it to a checkpoint; it is handed back as paused


def renew_lease(session: Session, job_id: str, owner: str, lease_seconds: float) -> Heartbeat:
    now = utcnow()
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == "running", Job.lease_owner == owner)
        .values(lease_expires_at=now + timedelta(seconds=lease_seconds))
        .execution_options(synchronize_session=False)
    )
    owned = result.rowcount == 1  # type: ignore[attr-defined]
    flags = session.execute(select(Job.cancel_requested, Job.pause_requested).where(Job.id == job_id)).one_or_none()
    session.commit()
    cancel, pause = (bool(flags[0]), bool(flags[1])) if flags is not None else (False, False)
    return Heartbeat(owned=owned, cancel_requested=cancel, pause_requested=pause)


def holds_lease(session: Session, job_id: str, owner: str, attempt: int) -> bool:
    """The fence of a job process's writes: True if attempt `attempt` under `owner` still runs
    the job, and then nobody can take the job from it until this transaction ends (PostgreSQL:
    a share lock on the job row, which the reconciler's re-queue and a new claim wait for;
    SQLite: the database's write lock, taken by a no-op UPDATE). The attempt number is the
    fencing token: every claim increments it, so a process that lost its lease, to a lapsed
    lease and a re-queue, can never write as the job's owner again."""
    owned = and_(Job.id == job_id, Job.status == "running", Job.lease_owner == owner, Job.attempts == attempt)
    if session.get_bind().dialect.name == "postgresql":
        return session.scalar(select(Job.id).where(owned).with_for_update(read=True)) is not None
    result = session.execute(
        update(Job).where(owned).values(lease_owner=Job.lease_owner).execution_options(synchronize_session=False)
    )
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def lock_pipeline_of(session: Session, job_id: str) -> None:
    """Take the lock of the job's pipeline row, if it has one. The one lock order: the pipeline
    first, then job rows. Finishing or cancelling a pipeline job settles its pipeline, which
    updates the other jobs of it: job-then-pipeline in one transaction against
    pipeline-then-job in another deadlocked."""
    pipeline_id = session.scalar(select(Job.pipeline_id).where(Job.id == job_id))  # never changes
    if pipeline_id is not None:
        session.execute(select(Pipeline.id).where(Pipeline.id == pipeline_id).with_for_update())


def finish(session: Session, job_id: str, owner: str, status: str, error: str | None = None, message: str = "") -> bool:
    """Move an owned running job to a terminal status. False if the lease was lost."""
    assert status in TERMINAL, status
    now = utcnow()
    lock_pipeline_of(session, job_id)
    result = session.execute(
        move("running", status)
        .where(Job.id == job_id, Job.lease_owner == owner)
        .values(error=error, finished_at=now, lease_owner=None, lease_expires_at=None, updated_at=now)
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


def hand_back(
    session: Session, job_id: str, owner: str, message: str, data: dict[str, Any] | None = None
) -> str | None:
    """A drain: the worker running the job is shutting down (SIGTERM: a pod evicted, a node
    drained, a rolling update), has stopped the job at a checkpoint, and gives it back to the
    queue for another worker to resume. Not a failure: `drains` goes up and the attempt does
    not count against max_attempts. A cancel that arrived meanwhile wins (the job ends
    cancelled). Returns the job's new status, or None if this owner no longer held it."""
    now = utcnow()
    lock_pipeline_of(session, job_id)
    job = session.scalar(
        select(Job)
        .where(Job.id == job_id, Job.status == "running", Job.lease_owner == owner)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    if job is None:
        session.rollback()
        return None
    if job.cancel_requested:
        job.status, job.finished_at = "cancelled", now
        add_event(session, job_id, "cancelled", "cancelled while its worker was shutting down", level="warning")
    elif job.pause_requested:  # a pause, not a shutdown: it waits until it is resumed
        job.status, job.dispatched_at = "paused", None
        job.drains += 1
        add_event(session, job_id, "paused", message.replace("re-queued", "paused"), data=data)
    else:
        job.status, job.dispatched_at = "queued", None
        job.drains += 1
        add_event(session, job_id, "drained", message, level="warning", data=data)
    job.lease_owner, job.lease_expires_at, job.updated_at = None, None, now
    session.flush()
    if job.status == "cancelled":
        settle_dependents(session, job_id)
    session.commit()
    return job.status


def _locked(session: Session, job_id: str) -> Job:
    """The job's row, read again and locked until the transaction ends."""
    row = session.scalar(
        select(Job).where(Job.id == job_id).with_for_update().execution_options(populate_existing=True)
    )
    assert row is not None
    return row


def request_pause(session: Session, job: Job) -> Job:
    """Pause a job: a queued one at once (nothing claims it while paused); a running one is
    asked to stop at a checkpoint (its supervisor drains it and hands it back as paused). A
    paused one stays paused; another status raises NotPausable."""
    lock_pipeline_of(session, job.id)
    row = _locked(session, job.id)
    now = utcnow()
    if row.status == "queued":
        row.status, row.dispatched_at, row.updated_at = "paused", None, now
        add_event(session, row.id, "paused", "paused before it started: resume it to queue it again")
    elif row.status == "running" and not row.pause_requested:
        row.pause_requested, row.updated_at = True, now
        add_event(session, row.id, "pause_requested", "pause requested: the job saves a checkpoint and stops")
    elif row.status not in ("running", "paused"):
        session.rollback()
        raise NotPausable(f"a {row.status} job cannot be paused: only a queued or running one")
    session.commit()
    session.refresh(row)
    return row


def resume(session: Session, job: Job, task_id: str, admit: Callable[[Session, Job], None] | None = None) -> Job:
    """Queue a paused job again (with `task_id` for its broker message, sent after the commit);
    it resumes from its newest checkpoint. A job paused only as asked (still running) has its
    request withdrawn. Another status raises NotPausable. A paused job holds none of its project's
    quota (mathrl.status.ACTIVE), so it takes it again here: `admit` runs once the queued row is
    flushed (the project's counters raised) and before the commit; what it raises rolls back."""
    row = _locked(session, job.id)
    now = utcnow()
    if row.status == "paused":
        row.status, row.pause_requested, row.updated_at = "queued", False, now
        row.celery_task_id, row.dispatched_at = task_id, now
        add_event(session, row.id, "resumed", "resumed: queued, to go on from its newest checkpoint")
        if admit is not None:
            session.flush()
            try:
                admit(session, row)
            except BaseException:
                session.rollback()
                raise
    elif row.status == "running" and row.pause_requested:
        row.pause_requested, row.updated_at = False, now
        add_event(session, row.id, "resumed", "resumed before it had stopped: the pause request is withdrawn")
    else:
        session.rollback()
        raise NotPausable(f"a {row.status} job cannot be resumed: only a paused one")
    session.commit()
    session.refresh(row)
    return row


def request_cancel(session: Session, job: Job) -> Job:
    """Cancel a job in whatever state it is now (not the state it was read in): one conditional
    UPDATE cancels a waiting or queued job at once and asks the supervisor of a running job to
    stop it; an ended job is left as it is. (Two statements raced: a job that went from waiting
    to queued meanwhile kept running, and a running job re-queued meanwhile was left queued with
    cancel_requested set, which nothing claims or sends: queued for ever.)"""
    idle = (*NOT_STARTED, "paused")  # ended at once: nothing runs them
    for s in idle:  # the moves the CASE below makes
        check_move(s, "cancelled")
    now = utcnow()
    lock_pipeline_of(session, job.id)
    not_started = Job.status.in_(idle)
    before = session.execute(select(Job.status, Job.cancel_requested).where(Job.id == job.id).with_for_update()).one()
    session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status.in_((*idle, "running")))
        .values(
            cancel_requested=True,
            updated_at=now,
            status=case((not_started, "cancelled"), else_=Job.status),
            finished_at=case((not_started, now), else_=Job.finished_at),
        )
        .execution_options(synchronize_session=False)
    )
    if before.status in idle:
        add_event(session, job.id, "cancelled", f"cancelled while {before.status}", level="warning")
        settle_dependents(session, job.id)
    elif before.status == "running" and not before.cancel_requested:
        add_event(session, job.id, "cancel_requested", "cancel requested; stopping the job process", level="warning")
    session.commit()
    session.refresh(job)
    return job


def has_tag(session: Session, tag: str) -> ColumnElement[bool]:
    """A WHERE clause: the job's JSON `tags` list holds `tag` (PostgreSQL: jsonb containment;
    SQLite: json_each), so that pages are cut in SQL after the filter."""
    if session.get_bind().dialect.name == "postgresql":
        return cast(Job.tags, JSONB).contains([tag])
    each = func.json_each(Job.tags).table_valued("value")
    return exists(select(literal(1)).select_from(each).where(each.c.value == tag))


@dataclass
class Due:
    """A queued job the reconciler must look at: `sent_before` False means no message of it is
    out (re-queued after a lost lease, or never sent): send one; True means one was sent over
    `redeliver_after_seconds` ago and may be lost or still waiting for a worker."""

    job_id: str
    queue: str
    sent_before: bool


@dataclass
class Reconciled:
    due: list[Due]
    sent: dict[str, int]  # queue -> queued jobs with a message out, when the round started


def reconcile(session: Session, redeliver_after_seconds: float, take_lapsed: bool = True) -> Reconciled:
    """Find work the broker lost or a dead worker left behind; return the queued jobs to check.

    - running with a lapsed lease: back to queued (or failed once attempts are used up),
      unless `take_lapsed` is False (the caller just saw the database down: leases lapsed
      during the outage because no heartbeat could renew them, not because workers died);
    - waiting pipeline jobs whose dependencies are decided: queued, failed or cancelled;
    - queued and not dispatched for `redeliver_after_seconds`: due (worker/reconciler.py
      sends again only what the broker lost). Their dispatched_at is set to now, so that
      several reconcilers do not check the same job in the same round.
    """
    now = utcnow()
    lapsed_ids = (
        session.scalars(select(Job.id).where(Job.status == "running", Job.lease_expires_at < now)).all()
        if take_lapsed
        else []
    )
    session.commit()
    for job_id in lapsed_ids:  # one transaction each, pipeline lock first (see lock_pipeline_of)
        lock_pipeline_of(session, job_id)
        job = session.scalar(
            select(Job)
            .where(Job.id == job_id, Job.status == "running", Job.lease_expires_at < now)
            .with_for_update(skip_locked=True)
            .execution_options(populate_existing=True)
        )
        if job is None:  # renewed, finished or taken by another reconciler meanwhile
            session.commit()
            continue
        if job.attempts - job.drains >= job.max_attempts:  # drained attempts were handed back, not lost
            job.status, job.finished_at = "failed", now
            job.error = (
                f"worker lost {job.attempts - job.drains} times (lease lapsed); giving up after "
                f"max_attempts={job.max_attempts}"
            )
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
                session,
                job.id,
                "requeued",
                f"lease of {job.lease_owner} lapsed; re-queued (attempt {job.attempts - job.drains} of "
                f"{job.max_attempts} used)",
                level="warning",
            )
        job.lease_owner, job.lease_expires_at = None, None
        session.commit()
    session.flush()
    settle_all(session)  # pipelines whose settling a dead worker never finished
    cutoff = now - timedelta(seconds=redeliver_after_seconds)
    sent: dict[str, int] = {
        queue: count
        for queue, count in session.execute(
            select(Job.queue, func.count())
            .where(Job.status == "queued", Job.dispatched_at.is_not(None))
            .group_by(Job.queue)
        )
    }
    stale = session.scalars(
        select(Job)
        .where(
            Job.status == "queued",
            Job.cancel_requested.is_(False),
            or_(Job.dispatched_at.is_(None), and_(Job.dispatched_at < cutoff)),
        )
        .with_for_update(skip_locked=True)
    ).all()
    due = [Due(job.id, job.queue, job.dispatched_at is not None) for job in stale]
    for job in stale:
        job.dispatched_at = now
    session.commit()
    return Reconciled(due, sent)


def mark_dispatched(session: Session, job_id: str, task_id: str, when: datetime | None = None) -> None:
    session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(celery_task_id=task_id, dispatched_at=when or utcnow())
        .execution_options(synchronize_session=False)
    )
    session.commit()


def readers_of(session: Session, project_id: str, ref: str) -> list[str]:
    """The project's jobs that may still read `ref` (a file's id, or 'job:<id>' for a job's models),
    named anywhere in their specs: not ended, and not on their way out. A job whose cancel was
    requested is never retried or resumed (OpenAI's cancel answers `cancelled` at once), so it reads
    nothing again: a script that cancels, then deletes the job's file, is not refused for it."""
    q = select(Job.id, Job.spec).where(
        Job.project_id == project_id, Job.status.not_in(TERMINAL), Job.cancel_requested.is_not(True)
    )
    return [str(job_id) for job_id, spec in session.execute(q) if ref in json.dumps(spec)]


FILE_ID = re.compile(r"file-[0-9a-f]{32}")  # an upload's id (store.models.File.id)


def files_read(session: Session, project_ids: Collection[str]) -> set[str]:
    """The ids of the files that the jobs of these projects may still read (as `readers_of` counts
    readers): one read of their unended jobs, for a sweep over many files."""
    if not project_ids:
        return set()
    q = select(Job.spec).where(
        Job.project_id.in_(project_ids), Job.status.not_in(TERMINAL), Job.cancel_requested.is_not(True)
    )
    return {ref for spec in session.scalars(q) for ref in FILE_ID.findall(json.dumps(spec))}
