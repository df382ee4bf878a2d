"""The lease of a claimed job is kept while the worker prepares its attempt (worker/lease.py), not
only from its process's start: loading a model's weights into a warm engine, or starting one on a
busy node, can take longer than `worker.lease_seconds`."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from config.settings import Settings
from mathrl.specs import parse_spec
from mathrl.specs.resolved import resolved
from store.db import session_scope
from store.jobs import claim, reconcile
from store.models import Job
from tests.helpers.store import store_with_jobs
from worker import supervisor
from worker.attempt import attempt_dir


def test_a_preparation_longer_than_the_lease_keeps_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's process starts 3 s after the claim, on a 1 s lease: a reconciler that runs meanwhile
    finds the lease alive. Before, nothing renewed it until the watch loop began, so the reconciler took
    the job from the worker that was starting it (a generate job, one attempt, failed "worker lost")."""
    spec = parse_spec({"kind": "sft", "model": "tiny:2x64", "dataset": {"path": "/x.jsonl"}})
    url, project, (job_id,) = store_with_jobs(tmp_path, {"spec": spec.model_dump(mode="json"), "max_attempts": 1})
    settings = Settings()
    settings.database.url = url
    settings.artifact_dir = str(tmp_path / "artifacts")
    settings.worker.lease_seconds, settings.worker.heartbeat_seconds = 1.0, 0.2
    with session_scope(url) as s:
        assert claim(s, job_id, "w", settings.worker.lease_seconds) is not None
    out = attempt_dir(settings.artifact_dir, job_id, 1)
    out.mkdir(parents=True)
    start_job = supervisor.start_job

    def slow_start(*args: object) -> object:  # the weights of a large model loaded into an engine, say
        time.sleep(3)
        return start_job(*args)

    monkeypatch.setattr(supervisor, "start_job", slow_start)
    cmd = [sys.executable, "-c", "pass"]
    claimed = supervisor.Claimed(settings, job_id, "w", 1, spec, cmd, resolved({"kind": "sft"}), project, out)
    ended: list[str] = []
    running = threading.Thread(target=lambda: ended.append(supervisor._run_attempt(claimed)))
    running.start()
    time.sleep(2.5)  # past the lease, before the process starts
    with session_scope(url) as s:
        reconcile(s, 60, take_lapsed=True)  # a reconciler's round: it takes lapsed leases
    with session_scope(url) as s:
        job = s.get(Job, job_id)
        assert job is not None and (job.status, job.lease_owner, job.error) == ("running", "w", None)
    running.join(timeout=60)
    assert ended == ["succeeded"]
