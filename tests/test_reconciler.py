"""The reconciler's rule for lapsed leases (drill 4 in RELIABILITY.md exercises it for real):
a lease that lapsed while the database was down is not taken until the database has been
reachable for a whole lease period, so live workers' heartbeats renew first."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from store.db import session_scope
from store.jobs import claim, reconcile
from store.migrate import upgrade
from store.models import Job, Project, utcnow
from worker.reconciler import Reachability

pytestmark = pytest.mark.quick


def test_lapsed_leases_are_taken_only_when_asked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    upgrade(url)
    with session_scope(url) as s:
        proj = Project(name="p")
        s.add(proj)
        s.flush()
        job = Job(project_id=proj.id, kind="eval", spec={}, tags=[], status="queued", max_attempts=3)
        s.add(job)
        s.commit()
        job_id = job.id
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
