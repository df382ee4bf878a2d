"""The reconciler's rule for lapsed leases (drill 4 in RELIABILITY.md exercises it for real):
a lease that lapsed while the database was down is not taken until the database has been
reachable for a whole lease period, so live workers' heartbeats renew first."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from store.db import session_scope
from store.jobs import claim, hand_back, reconcile
from store.models import Job, utcnow
from tests.helpers.store import store_with_jobs
from worker.reconciler import Reachability

pytestmark = pytest.mark.quick


def queued_jobs(tmp_path: Path, n: int, max_attempts: int) -> tuple[str, list[str]]:
    """A migrated SQLite database with n queued jobs of one project: its URL and the job ids."""
    url, _, ids = store_with_jobs(tmp_path, *[{"max_attempts": max_attempts}] * n)
    return url, ids


def test_lapsed_leases_are_taken_only_when_asked(tmp_path: Path) -> None:
    url, (job_id,) = queued_jobs(tmp_path, 1, max_attempts=3)
    with session_scope(url) as s:
        assert claim(s, job_id, "w1", 30) is not None
    with session_scope(url) as s:  # the heartbeat could not renew it: the lease lapsed
        s.get(Job, job_id).lease_expires_at = utcnow() - timedelta(seconds=1)  # type: ignore[union-attr]
    with session_scope(url) as s:
        reconcile(s, 60, take_lapsed=False)
    with session_scope(url) as s:
        j = s.get(Job, job_id)
        assert j is not None and j.status == "running" and j.lease_owner == "w1"
    with session_scope(url) as s:
        reconcile(s, 60, take_lapsed=True)
    with session_scope(url) as s:
        j = s.get(Job, job_id)
        assert j is not None and j.status == "queued" and j.lease_owner is None and j.attempts == 1


def test_a_drained_attempt_does_not_count_against_max_attempts(tmp_path: Path) -> None:
    """A worker shutting down hands its job back (store.jobs.hand_back; drill 7 runs it for
    real): the job is queued again with `drains` counted, and a later lost worker still gets
    the job's whole max_attempts; a cancel that arrived during the drain wins."""
    url, (job_id, other_id) = queued_jobs(tmp_path, 2, max_attempts=2)
    with session_scope(url) as s:
        assert claim(s, job_id, "w1", 30) is not None
        assert hand_back(s, job_id, "w2", "not mine") is None  # only the lease owner hands back
        assert hand_back(s, job_id, "w1", "drained at step 3", {"checkpoint_step": 3}) == "queued"
    with session_scope(url) as s:
        j = s.get(Job, job_id)
        assert j is not None and (j.status, j.attempts, j.drains, j.lease_owner) == ("queued", 1, 1, None)
        assert j.dispatched_at is None  # the reconciler sends it again at once
    with session_scope(url) as s:
        assert claim(s, job_id, "w3", 30) is not None  # attempt 2 of max_attempts=2, one drained
        s.get(Job, job_id).lease_expires_at = utcnow() - timedelta(seconds=1)  # type: ignore[union-attr]
    with session_scope(url) as s:
        reconcile(s, 60, take_lapsed=True)
    with session_scope(url) as s:
        j = s.get(Job, job_id)
        assert j is not None and j.status == "queued", j.error  # one of its two attempts lost, not two
    with session_scope(url) as s:
        assert claim(s, job_id, "w4", 30) is not None
        s.get(Job, job_id).lease_expires_at = utcnow() - timedelta(seconds=1)  # type: ignore[union-attr]
    with session_scope(url) as s:
        reconcile(s, 60, take_lapsed=True)
    with session_scope(url) as s:
        j = s.get(Job, job_id)
        assert j is not None and j.status == "failed" and "worker lost 2 times" in (j.error or ""), j.error
    with session_scope(url) as s:  # cancelled while draining: cancelled, not queued
        assert claim(s, other_id, "w1", 30) is not None
        s.get(Job, other_id).cancel_requested = True  # type: ignore[union-attr]
        s.commit()
        assert hand_back(s, other_id, "w1", "drained") == "cancelled"
    with session_scope(url) as s:
        j = s.get(Job, other_id)
        assert j is not None and j.status == "cancelled" and j.drains == 0 and j.finished_at is not None


def test_reachability_needs_a_whole_period_without_failure() -> None:
    db = Reachability(period=4.0)
    assert not db.settled(0.0)  # just started: it cannot know what happened before
    db.succeeded(0.0)
    assert not db.settled(3.9)
    db.succeeded(3.9)
    assert db.settled(4.0)
    db.failed()  # the database went away
    assert not db.settled(10.0)
    db.succeeded(10.0)
    db.succeeded(12.0)
    assert not db.settled(13.0) and db.settled(14.0)


@pytest.mark.parametrize("broker", ["redis", "sqlalchemy"])
def test_a_waiting_message_is_not_sent_again_a_lost_one_is(
    broker: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Issue 16.3: a queued job whose message still waited in the broker (no worker for its
    queue) was sent again every round: 4 copies after 4 minutes, growing without bound."""
    import uuid

    from config.settings import Settings
    from worker.celery_app import make_celery
    from worker.reconciler import broker_backlog, reconcile_once

    queue = f"parked-{uuid.uuid4().hex[:8]}"  # no worker consumes it
    url, _, _ = store_with_jobs(tmp_path, {"kind": "eval", "queue": queue})
    broker_url = (
        str(request.getfixturevalue("redis_url")) if broker == "redis" else f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    )
    settings = Settings(
        database={"url": url},
        broker={"url": broker_url},  # type: ignore[arg-type]
        worker={"redeliver_after_seconds": 0},
    )  # every queued job is due every round
    app = make_celery(broker_url)
    assert reconcile_once(settings, app) == 1  # never sent: sent now
    for _ in range(3):
        assert reconcile_once(settings, app) == 0  # its message waits: nothing sent
    assert broker_backlog(app, queue) == 1
    with app.connection_for_write() as conn:  # the broker loses it (flushed, failed over)
        conn.default_channel.queue_purge(queue)
    assert broker_backlog(app, queue) == 0
    assert reconcile_once(settings, app) == 1  # lost: sent again
    assert broker_backlog(app, queue) == 1


def test_a_job_the_broker_refuses_does_not_stop_the_others_of_the_round(tmp_path: Path, redis_url: str) -> None:
    """A queue whose name the broker holds as another type of key (a job in a pool named 'unacked'
    met kombu's hash, before pools were checked at submit) made LPUSH fail; the round stopped
    there, and the jobs of other projects after it were never re-sent."""
    import uuid

    import redis

    from config.settings import Settings
    from worker.celery_app import make_celery
    from worker.reconciler import broker_backlog, reconcile_once

    bad, good = f"hash-{uuid.uuid4().hex[:8]}", f"parked-{uuid.uuid4().hex[:8]}"
    url, _, _ = store_with_jobs(tmp_path, *[{"kind": "eval", "queue": q} for q in (bad, good)])  # the refused one first
    settings = Settings(database={"url": url}, broker={"url": redis_url}, worker={"redeliver_after_seconds": 0})  # type: ignore[arg-type]
    app = make_celery(redis_url)
    r = redis.Redis.from_url(redis_url)
    r.hset(bad, "k", "v")
    try:
        assert reconcile_once(settings, app) == 1
        assert broker_backlog(app, good) == 1
    finally:
        r.delete(bad, good)
