"""Jobs through the real thing: uvicorn API process, Redis broker, Celery worker processes,
PostgreSQL, and a job process per job."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from store.db import session_scope
from store.models import Job
from tests.helpers.jobs import eval_spec
from tests.helpers.processes import child_pid, pid_alive, wait_for
from tests.helpers.service import Service

pytestmark = pytest.mark.slow


def long_eval(model: str) -> dict[str, Any]:
    # ~1 s per batch of 2 on this CPU, 200 batches: long enough to act on while it runs
    return eval_spec(model, limit=400, batch_size=2, sampling={"max_new_tokens": 400})


def test_eval_job_end_to_end(service: Service, tiny_model: str) -> None:
    c = service.client()
    job = c.jobs.create(eval_spec(tiny_model, tags=["e2e"]))
    sent: list[str] = []
    c.http.event_hooks["request"].append(lambda r: sent.append(f"{r.method} {r.url.path}"))
    done = c.jobs.wait(job.id, timeout=180)
    assert done.status == "succeeded", done.error
    assert done.attempts == 1 and done.started_at and done.finished_at
    # the wait held the job's event stream open until the job ended, instead of polling each second
    assert sent == [f"GET /v1/jobs/{job.id}", f"GET /v1/jobs/{job.id}/events/stream", f"GET /v1/jobs/{job.id}"], sent
    c.http.event_hooks["request"].clear()
    types = [e.type for e in c.jobs.events(job.id)]
    for t in ("queued", "claimed", "started", "loading", "progress", "scored", "succeeded"):
        assert t in types, types
    scores = {s.metric: s for s in c.scores.list(job_id=job.id)}
    acc = scores["accuracy"]
    assert acc.benchmark == "gsm8k" and acc.n == 4 and acc.backend == "hf" and acc.model_ref == tiny_model
    assert acc.ci_low is not None and acc.ci_low <= acc.value <= acc.ci_high
    assert acc.sampling["max_new_tokens"] == 16 and acc.prompt_hash
    # the recipe it was made with: the benchmark's own, resolved (tests/unit/evaluator/test_recipes.py: the others)
    assert acc.recipe == "gsm8k-chat" and acc.recipe_config is not None
    assert acc.recipe_config["name"] == "gsm8k-chat" and acc.recipe_config["few_shot"] == 0
    samples = c.jobs.samples(job.id)
    assert len(samples) == 4 and all(s.data and "gold" in s.data and "correct" in s.data for s in samples)
    assert samples[0].data["gold"] == "18"  # GSM8K test #1 (Janet's ducks)
    assert any(cp.kind == "results" for cp in c.jobs.checkpoints(job.id))
    assert any(m.name == "eval/accuracy" for m in c.jobs.metrics(job.id))
    # the SSE stream replays the whole log and ends with the job
    streamed = [e.type for e in c.jobs.follow(job.id)]
    assert streamed == types


def test_eval_results_download(service: Service, tiny_model: str, pg_url: str, tmp_path: Path) -> None:
    import asyncio
    import json

    from typer.testing import CliRunner

    from mathrl.cli import app
    from mathrl.client import AsyncClient, MathRLError

    key = service.key()
    c = service.client(key)
    job = c.jobs.create(eval_spec(tiny_model, limit=3, batch_size=3, sampling={"max_new_tokens": 8}))
    assert c.jobs.wait(job.id, timeout=180).status == "succeeded"

    r = httpx.get(f"{service.url}/v1/jobs/{job.id}/results", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    items = c.jobs.results(job.id)
    assert items == [json.loads(line) for line in r.text.splitlines()]
    assert len(items) == 3 and items[0]["data"]["gold"] == "18"  # GSM8K test #1
    by_problem = {s.data["problem"]: s for s in c.jobs.samples(job.id)}
    for item in items:
        d, sample = item["data"], by_problem[item["data"]["problem"]]
        assert {"gold", "extracted", "correct"} <= set(d) and isinstance(d["correct"], bool)
        assert (item["prompt"], item["completion"], d) == (sample.prompt, sample.completion, sample.data)

    async def async_results() -> list[dict[str, Any]]:
        async with AsyncClient(service.url, api_key=key) as ac:
            return await ac.jobs.results(job.id)

    assert asyncio.run(async_results()) == items
    out = tmp_path / "items.jsonl"
    result = CliRunner().invoke(
        app, ["jobs", "results", job.id, "-o", str(out)], env={"MATHRL_URL": service.url, "MATHRL_API_KEY": key}
    )
    assert result.exit_code == 0, result.output
    assert [json.loads(line) for line in out.read_text().splitlines()] == items

    # another project's job, and a job with no results: 404 problems
    with pytest.raises(MathRLError) as exc:
        service.client().jobs.results(job.id)
    assert exc.value.status == 404 and exc.value.problem["detail"] == "No job with this id in your project."
    parked = c.jobs.create({"kind": "eval", "model": tiny_model, "limit": 1, "resources": {"pool": "results-parked"}})
    with pytest.raises(MathRLError) as exc:
        c.jobs.results(parked.id)
    assert exc.value.status == 404 and "no per-item results" in exc.value.detail
    result = CliRunner().invoke(
        app, ["jobs", "results", parked.id], env={"MATHRL_URL": service.url, "MATHRL_API_KEY": key}
    )
    assert result.exit_code == 1 and "no per-item results" in result.output

    # a results row naming a file outside the artifact dir (directly, or through a symlink in it) is refused
    from store.models import Checkpoint

    artifacts = Path(service.env["MATHRL_ARTIFACT_DIR"])
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"secret": true}\n')
    link = artifacts / "jobs" / parked.id / "items.jsonl"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(secret)
    with session_scope(pg_url) as s:
        row = Checkpoint(job_id=parked.id, step=0, kind="results", uri="")
        s.add(row)
        s.flush()
        row_id = row.id

    def point_at(uri: str) -> None:
        with session_scope(pg_url) as s:
            s.get(Checkpoint, row_id).uri = uri

    for uri in (str(secret), f"{artifacts}/jobs/../../{secret.parent.name}/secret.jsonl", f"file://{link}"):
        point_at(uri)
        r = httpx.get(f"{service.url}/v1/jobs/{parked.id}/results", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 404 and "secret" not in r.text, (uri, r.text)
        assert r.headers["content-type"] == "application/problem+json" and "MATHRL_ARTIFACT_DIR" in r.json()["detail"]
    # the same row pointing at a real file inside the artifact dir is served
    inside = artifacts / "jobs" / parked.id / "real.jsonl"
    inside.write_text('{"ok": 1}\n')
    point_at(str(inside))
    assert c.jobs.results(parked.id) == [{"ok": 1}]
    c.jobs.cancel(parked.id)


def test_job_this_worker_cannot_run_fails_fast_with_the_reason(service: Service) -> None:
    # A worker serving a GPU pool on a machine with no GPU (and no vLLM): the job must fail at
    # once with the reason, not hang or pretend. A pool of its own: other tests park GPU jobs in
    # 'gpu-1' (the reconciler re-sends them every few seconds), and this worker would have to
    # fail each of those first (CI: still queued after 120 s behind them).
    w = service.start_worker("nogpu-test", name="nogpu")
    try:
        c = service.client()
        job = c.jobs.create(
            {
                "kind": "grpo",
                "model": "org/m",
                "dataset": {"name": "gsm8k-train"},
                "resources": {"gpus": 1, "pool": "nogpu-test"},
            }
        )
        done = c.jobs.wait(job.id, timeout=120)
        assert done.status == "failed" and "GPU" in (done.error or "")
        assert any(e.type == "not_available" for e in c.jobs.events(job.id))
    finally:
        service.stop_worker(w)


def test_bad_model_path_fails_with_the_error_captured(service: Service, tmp_path: Path) -> None:
    c = service.client()
    job = c.jobs.create(eval_spec(str(tmp_path / "nonexistent" / "model-dir")))  # under an allowed root
    done = c.jobs.wait(job.id, timeout=120)
    assert done.status == "failed"
    assert "nonexistent" in (done.error or "")
    # issue 16.9: the log is named as the operator finds it, not by this server's absolute path
    assert f"(log: jobs/{job.id}/attempt-1/job.log in the artifact directory)" in (done.error or ""), done.error


def test_cancel_running_job_stops_its_process(service: Service, tiny_model: str) -> None:
    c = service.client()
    job = c.jobs.create(long_eval(tiny_model))
    pid = child_pid(c, job.id)
    assert pid_alive(pid)
    t0 = time.monotonic()
    assert c.jobs.cancel(job.id).cancel_requested
    done = c.jobs.wait(job.id, timeout=30, poll=0.2)
    assert done.status == "cancelled"
    grace = float(service.env["MATHRL_WORKER__CANCEL_GRACE_SECONDS"])
    assert time.monotonic() - t0 < grace + 5
    wait_for(lambda: not pid_alive(pid), 5, what="the job process to exit")


def test_crashing_job_process_fails_and_the_worker_keeps_serving(service: Service, tiny_model: str) -> None:
    c = service.client()
    job = c.jobs.create(long_eval(tiny_model))
    pid = child_pid(c, job.id)
    os.kill(pid, signal.SIGKILL)  # what the OOM killer does
    done = c.jobs.wait(job.id, timeout=60)
    assert done.status == "failed" and "SIGKILL" in (done.error or "")
    assert all(w.poll() is None for w in service.workers)
    after = c.jobs.create(eval_spec(tiny_model))
    assert c.jobs.wait(after.id, timeout=180).status == "succeeded"


def test_api_restart_mid_job_loses_nothing(service: Service, tiny_model: str) -> None:
    c = service.client()
    job = c.jobs.create(eval_spec(tiny_model, limit=60, batch_size=2, sampling={"max_new_tokens": 64}))
    child_pid(c, job.id)
    before = c.jobs.events(job.id)
    service.stop_api(signal.SIGKILL)
    with pytest.raises(httpx.TransportError):
        c.jobs.retrieve(job.id)
    time.sleep(2)  # the job keeps running without the API
    service.start_api()
    done = c.jobs.wait(job.id, timeout=240)
    assert done.status == "succeeded"
    after = c.jobs.events(job.id)
    assert [e.seq for e in after][: len(before)] == [e.seq for e in before]
    assert "scored" in [e.type for e in after]
    assert len(c.jobs.samples(job.id, limit=1000)) == 60


def test_cancel_of_queued_job_reaches_no_worker(service: Service, pg_url: str) -> None:
    c = service.client()
    job = c.jobs.create({"kind": "eval", "model": "org/m", "resources": {"gpus": 2}})
    assert job.queue == "gpu-2"
    assert c.jobs.cancel(job.id).status == "cancelled"
    with session_scope(pg_url) as s:
        row = s.scalar(select(Job).where(Job.id == job.id))
        assert row is not None and row.attempts == 0 and row.lease_owner is None
