"""The reconciler: re-delivers what the broker lost, takes back jobs whose worker died, and deletes
uploaded files past their expires_at (store.files.delete_expired). It runs in every worker process,
a daemon thread (`start`, `reconcile_once`); several at once are safe, since the claim skips a
re-sent message for a job someone already claimed.

A database outage longer than a lease lets every lease lapse while the workers live, so a reconciler
takes lapsed leases only once it has reached the database without a failure for a whole lease period
(`Reachability`). This needs `lease_seconds` > `reconcile_seconds` + `heartbeat_seconds`.
RELIABILITY.md, "Drills"."""

from __future__ import annotations

import logging
import threading
import time

from celery import Celery

from config.settings import Settings
from store.db import session_scope
from store.files import delete_expired
from store.jobs import mark_dispatched, reconcile
from worker.celery_app import send_job

log = logging.getLogger("mathrl.reconciler")


def reconcile_once(settings: Settings, app: Celery, take_lapsed: bool = False) -> int:
    """One round. `take_lapsed`: also take back running jobs whose lease lapsed; only the
    loop below, which knows whether the database was reachable long enough, passes True."""
    with session_scope(settings.database.url) as s:
        found = reconcile(s, settings.worker.redeliver_after_seconds, take_lapsed)
    # A message that waits in its queue (no worker for the pool yet, or all busy) is not lost:
    # sending it again every round piled up copies. Re-send a queue's jobs only when the
    # broker holds fewer messages than jobs were sent to it (or cannot say how many it holds).
    intact = {
        queue
        for queue in {d.queue for d in found.due if d.sent_before}
        if (waiting := broker_backlog(app, queue)) is not None and waiting >= found.sent.get(queue, 0)
    }
    jobs = [(d.job_id, d.queue) for d in found.due if not (d.sent_before and d.queue in intact)]
    sent = 0
    for job_id, queue in jobs:
        try:
            task_id = send_job(app, job_id, queue)
        except Exception as exc:  # the broker refused this one (down, or a key of its queue's name that is not
            # a queue): the next round tries again, and the jobs after it in this round are sent regardless
            log.warning("could not re-deliver job %s to %s: %s", job_id, queue, exc)
            continue
        with session_scope(settings.database.url) as s:
            mark_dispatched(s, job_id, task_id)
        log.info("re-delivered job %s to %s", job_id, queue)
        sent += 1
    return sent


def broker_backlog(app: Celery, queue: str) -> int | None:
    """Messages waiting in `queue` and not yet taken by a worker; None when the broker cannot
    be asked. (kombu's passive declare: Redis, RabbitMQ and the SQLAlchemy transport count.)"""
    try:
        with app.connection_for_read() as conn:
            try:
                return int(conn.default_channel.queue_declare(queue=queue, passive=True).message_count)
            except conn.channel_errors:  # no such queue (Redis drops an empty list): nothing waits
                return 0
    except Exception as exc:
        log.warning("could not count the messages in %s: %s", queue, exc)
        return None


class Reachability:
    """Whether the database has answered without a failure for at least `period` seconds
    (counted from the first success after the last failure, or after start)."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.since: float | None = None

    def settled(self, now: float) -> bool:
        return self.since is not None and now - self.since >= self.period

    def succeeded(self, now: float) -> None:
        if self.since is None:
            self.since = now

    def failed(self) -> None:
        self.since = None


def start(settings: Settings, app: Celery) -> threading.Event:
    stop = threading.Event()
    db = Reachability(settings.worker.lease_seconds)

    def loop() -> None:
        while not stop.wait(settings.worker.reconcile_seconds):
            now = time.monotonic()
            try:
                reconcile_once(settings, app, take_lapsed=db.settled(now))
                db.succeeded(now)
            except Exception as exc:  # the database down (a broker's refusal is per job, above): next round
                log.warning("reconcile failed: %s", exc)
                db.failed()
                continue
            try:  # apart: a file that cannot be deleted never holds back taking lapsed leases
                with session_scope(settings.database.url) as s:
                    if gone := delete_expired(s):
                        log.info("deleted %d expired file(s): %s", len(gone), ", ".join(gone))
            except Exception as exc:  # tried again next round
                log.warning("deleting expired files failed: %s", exc)

    threading.Thread(target=loop, name="mathrl-reconciler", daemon=True).start()
    return stop
