"""A worker's GPUs, each lent to one running job at a time (worker/gpu_slots.py): a pod running
several jobs at once (a pool's concurrency over 1) gives each its own devices."""

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
from store.models import Job
from tests.helpers.store import store_with_jobs
from worker import supervisor
from worker.attempt import attempt_dir
from worker.gpu_slots import GPUSlots


@pytest.mark.quick
def test_each_job_gets_devices_no_other_holds() -> None:
    slots, visible = GPUSlots(), ["0", "1", "2", "3"]
    first = slots.take(2, visible, lambda: True, 0.01)
    second = slots.take(2, visible, lambda: True, 0.01)
    assert first == ["0", "1"] and second == ["2", "3"]
    got: list[list[str] | None] = []
    waiter = threading.Thread(target=lambda: got.append(slots.take(1, visible, lambda: True, 0.01)))
    waiter.start()
    time.sleep(0.2)
    assert got == []  # every device is lent: it waits
    slots.give(second)
    waiter.join(timeout=5)
    assert got == [["2"]]
    assert slots.take(1, visible, lambda: True, 0.01) == ["3"]  # the one device no job holds
    assert slots.take(2, visible, lambda: False, 0.01) is None  # lost or cancelled while it waited


def test_two_jobs_at_once_on_one_worker_run_on_different_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: every job of a worker pod started on its first devices (CUDA_VISIBLE_DEVICES as the
    pod's), so two projects' jobs in a pool with concurrency 2 shared GPU 0 while GPU 1 sat idle.
    The job processes here are real processes that write the devices they were given."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    spec = parse_spec({"kind": "sft", "model": "tiny:2x64", "dataset": {"path": "/x.jsonl"}, "resources": {"gpus": 1}})
    running = {"status": "running", "lease_owner": "w", "attempts": 1, "spec": spec.model_dump(mode="json")}
    url, project, ids = store_with_jobs(tmp_path, running, running)
    settings = Settings()
    settings.database.url = url
    settings.artifact_dir = str(tmp_path / "artifacts")
    seen = tmp_path / "seen"
    seen.mkdir()

    def run(job_id: str) -> None:
        out = attempt_dir(settings.artifact_dir, job_id, 1)
        out.mkdir(parents=True, exist_ok=True)
        devices = "os.environ['CUDA_VISIBLE_DEVICES']"
        write = f"import os, time; open({str(seen / job_id)!r}, 'w').write({devices}); time.sleep(1)"
        config = resolved({"kind": "sft"})
        cmd = [sys.executable, "-c", write]
        supervisor._run_attempt(supervisor.Claimed(settings, job_id, "w", 1, spec, cmd, config, project, out))

    threads = [threading.Thread(target=run, args=(job_id,)) for job_id in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted((seen / job_id).read_text() for job_id in ids) == ["0", "1"]
    with session_scope(url) as s:
        assert [s.get(Job, job_id).status for job_id in ids] == ["succeeded", "succeeded"]
