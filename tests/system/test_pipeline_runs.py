"""Pipelines run by real workers: dependency order with a checkpoint reference, a failing upstream
job, cancel of a running pipeline (admission and validation: tests/unit/api/test_pipelines.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers.jobs import eval_step, sft_step
from tests.helpers.service import Service


@pytest.mark.slow
def test_pipeline_runs_in_dependency_order_with_a_checkpoint_reference(service: Service) -> None:
    c = service.client()
    p = c.pipelines.create(
        {
            "name": "order",
            "jobs": {
                "train": sft_step(steps=20, save_steps=10),
                "mid": eval_step("job:train@step-10"),
                "final": eval_step("job:train"),
            },
        }
    )
    done = c.pipelines.wait(p.id, timeout=300)
    assert done.status == "succeeded", [(j.step, j.status, j.error) for j in done.jobs]
    jobs = {j.step: c.jobs.retrieve(j.job_id) for j in done.jobs}
    for step in ("mid", "final"):
        assert jobs[step].started_at >= jobs["train"].finished_at, step
    mid = {s.metric: s for s in c.scores.list(job_id=jobs["mid"].id)}["accuracy"]
    final = {s.metric: s for s in c.scores.list(job_id=jobs["final"].id)}["accuracy"]
    assert mid.checkpoint == f"{jobs['train'].id}@step-10"
    assert final.checkpoint == f"{jobs['train'].id}@final"


@pytest.mark.slow
def test_failing_upstream_job_fails_its_dependents_with_the_reason(service: Service, tmp_path: Path) -> None:
    c = service.client()
    p = c.pipelines.create(
        {
            "jobs": {  # a model dir under an allowed root that does not exist: fails in the worker
                # (training steps: a step that saves no model, an eval, cannot be a later step's model)
                "bad": {**sft_step(), "model": str(tmp_path / "no-such-model")},
                "after": {**sft_step(), "model": "job:bad"},
                "last": eval_step("job:after"),
                "ok": eval_step("org/none"),
            }
        }
    )
    done = c.pipelines.wait(p.id, timeout=120)
    st = {j.step: j for j in done.jobs}
    assert st["bad"].status == "failed"
    assert st["after"].status == "failed" and "upstream job 'bad'" in (st["after"].error or "")
    assert st["last"].status == "failed" and "upstream job 'after'" in (st["last"].error or "")
    assert done.status == "failed"
    events = [e.type for e in c.jobs.events(st["after"].job_id)]
    assert events == ["waiting", "failed"]  # never claimed, never run


@pytest.mark.slow
def test_cancel_of_a_running_pipeline_stops_the_job_and_cancels_the_rest(service: Service) -> None:
    c = service.client()
    p = c.pipelines.create(
        {"jobs": {"train": sft_step(steps=100000, save_steps=100000), "after": eval_step("job:train")}}
    )
    train_id = next(j.job_id for j in p.jobs if j.step == "train")
    deadline = time.monotonic() + 120
    while c.jobs.retrieve(train_id).status != "running":
        assert time.monotonic() < deadline, "train never started"
        time.sleep(0.3)
    c.pipelines.cancel(p.id)
    done = c.pipelines.wait(p.id, timeout=60)
    assert {j.step: j.status for j in done.jobs} == {"train": "cancelled", "after": "cancelled"}
    assert done.status == "cancelled"
