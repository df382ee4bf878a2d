"""2-process CPU jobs (accelerate launch, torchrun, gloo DDP) through the real service (the
launch command itself: tests/unit/worker/test_launch.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from store.db import session_scope
from store.models import Metric
from tests.helpers.jobs import ARITH, assert_stored_once, grpo, sft
from tests.helpers.processes import wait_for
from tests.helpers.service import Service


def job_processes(job_id: str) -> list[int]:
    """Every process on this machine running a part of the job (launcher or rank)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                args = (d / "cmdline").read_bytes().split(b"\0")
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if job_id.encode() in args and state != "Z":
                pids.append(int(d.name))
    return pids


@pytest.mark.slow
def test_two_process_sft_and_grpo_jobs_train_once(service: Service, tiny_model: str, db_url: str) -> None:
    c = service.client()
    t0 = time.monotonic()
    job = c.jobs.create(sft(resources={"processes": 2}))
    done = c.jobs.wait(job.id, timeout=240)
    assert done.status == "succeeded", done.error
    sft_seconds = time.monotonic() - t0
    events = c.jobs.events(job.id)
    assert_stored_once(db_url, job.id, events)
    with session_scope(db_url) as s:
        steps = s.scalars(select(Metric.step).where(Metric.job_id == job.id, Metric.name == "loss")).all()
    assert sorted(steps) == list(range(2, 21, 2))
    assert not job_processes(job.id)

    t0 = time.monotonic()
    job = c.jobs.create(grpo(model=tiny_model, dataset={**ARITH, "limit": 200}, resources={"processes": 2}))
    done = c.jobs.wait(job.id, timeout=240)
    assert done.status == "succeeded", done.error
    events = c.jobs.events(job.id)
    assert_stored_once(db_url, job.id, events)
    print(f"2-process sft 20 steps: {sft_seconds:.1f}s, grpo 4 steps: {time.monotonic() - t0:.1f}s")


@pytest.mark.slow
def test_cancel_stops_every_rank(service: Service) -> None:
    c = service.client()
    job = c.jobs.create(sft(max_steps=100_000, logging_steps=1000, save_steps=100_000, resources={"processes": 2}))
    wait_for(lambda: any(e.type == "training" for e in c.jobs.events(job.id)), 180, 0.5, "training to start")
    running = job_processes(job.id)
    assert len(running) >= 3, running  # the launcher and two ranks
    assert c.jobs.cancel(job.id).cancel_requested
    done = c.jobs.wait(job.id, timeout=60, poll=0.2)
    assert done.status == "cancelled", done.error
    wait_for(lambda: not job_processes(job.id), 10, what="every process of the job to exit")
    # the ranks stopped together between steps (not killed after the grace period): rank 0 said so
    exit_code = Path(service.env["MATHRL_ARTIFACT_DIR"]) / "jobs" / job.id / "attempt-1" / "exit-code"
    assert exit_code.read_text() == "2"
