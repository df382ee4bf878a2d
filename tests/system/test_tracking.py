"""Runs mirrored to MLflow (worker/tracking.py), against a real `mlflow server` on a SQLite store,
started here from .venv-mlflow (scripts/setup-mlflow; scripts/test runs it), and real workers."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from config.settings import Settings
from store.db import session_scope
from store.jobs import add_event
from store.migrate import upgrade
from store.models import BenchmarkScore, Job, Metric, Project
from tests.helpers.env import ROOT, die_with_parent, free_port
from tests.helpers.processes import wait_for
from tests.helpers.service import Service
from worker.tracking import (
    CURSOR_TAG,
    JOB_ID_TAG,
    Mirror,
    mlflow_key,
)

MLFLOW = ROOT / ".venv-mlflow" / "bin" / "mlflow"


# ---- params and names, without a server --------------------------------------------------


# ---- a real MLflow server -----------------------------------------------------------------


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mlflow server` on a SQLite store in a temporary directory, for this module."""
    if not MLFLOW.exists():
        pytest.fail("the MLflow server is not installed: run scripts/setup-mlflow (scripts/test does)")
    home = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = home / "server.log"
    proc = subprocess.Popen(
        [
            str(MLFLOW),
            "server",
            "--backend-store-uri",
            f"sqlite:///{home / 'mlflow.db'}",
            "--default-artifact-root",
            str(home / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        cwd=home,
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, 180, 0.5, "the MLflow server")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def mlflow_client(url: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=url)


def run_of(client: Any, experiment: str, job_id: str) -> Any:
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r}"
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`{JOB_ID_TAG}` = '{job_id}'")
    assert len(runs) == 1, runs
    return runs[0]


def history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def store_metrics(url: str, job_id: str) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    with session_scope(url) as s:
        for name, step, value in s.query(Metric.name, Metric.step, Metric.value).filter(Metric.job_id == job_id):
            out.setdefault(name, []).append((int(step), float(value)))
    return {k: sorted(v) for k, v in out.items()}


def same(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
    return len(a) == len(b) and all(
        sa == sb and (va == vb or (math.isnan(va) and math.isnan(vb))) for (sa, va), (sb, vb) in zip(a, b, strict=True)
    )


# ---- one job's mirror, attempt after attempt (no worker) -----------------------------------


def test_a_resumed_job_goes_on_in_the_same_run_and_the_run_ends_as_the_job(mlflow_server: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    project = f"mirror-{uuid.uuid4().hex[:6]}"
    with session_scope(url) as s:
        proj = Project(name=project)
        s.add(proj)
        s.flush()
        job = Job(
            project_id=proj.id,
            kind="sft",
            name="resumed",
            spec={},
            resolved_config={"kind": "sft", "learning_rate": 0.001, "resources": {"gpus": 0}},
            tags=["t1"],
            status="running",
            queue="parked",
        )
        s.add(job)
        s.flush()
        job_id = job.id

    def log_steps(steps: range) -> None:
        with session_scope(url) as s:
            s.add_all(Metric(job_id=job_id, name="loss", step=i, value=1.0 / (i + 1)) for i in steps)
            s.add_all(Metric(job_id=job_id, name="eval/accuracy/level=3", step=i, value=i / 10) for i in steps)

    settings = Settings(
        database={"url": url},  # type: ignore[arg-type]
        tracking={  # type: ignore[arg-type]
            "mlflow_uri": mlflow_server,
            "mathrl_url": "https://mathrl.example.com",
            "request_timeout_seconds": 30,  # a fresh server's first answers are slow on a busy machine
        },
    )
    client = mlflow_client(mlflow_server)
    log_steps(range(0, 5))
    first = Mirror(settings, job_id)
    assert first.flush() and first.errors == 0
    log_steps(range(5, 8))
    assert first.flush()
    first.close("drained")  # handed back to the queue: the run stays open for the next attempt
    run = run_of(client, f"mathrl/{project}", job_id)
    assert run.info.status == "RUNNING" and run.info.run_name == "resumed"
    assert run.data.params == {"kind": "sft", "learning_rate": "0.001", "resources.gpus": "0"}
    tags = run.data.tags
    assert tags["mathrl.job_url"] == f"https://mathrl.example.com/ui/jobs/{job_id}" and tags["mathrl.tags"] == "t1"
    assert tags["mathrl.project"] == project and int(tags[CURSOR_TAG]) > 0

    # the second attempt: the same run (found through the job's 'tracking' event), on from the cursor
    log_steps(range(8, 10))
    with session_scope(url) as s:
        s.add(
            BenchmarkScore(
                project_id=proj.id,
                job_id=job_id,
                model_ref=f"job:{job_id}",
                benchmark="arith",
                benchmark_version="1",
                metric="accuracy",
                value=0.75,
                n=8,
                sampling={},
                backend="hf",
                backend_version="x",
            )
        )
    second = Mirror(settings, job_id)
    assert second.flush() and second.run_id == run.info.run_id and second.copied == 4  # 2 steps x 2 names
    second.close("succeeded")
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED"
    assert same(history(client, run.info.run_id, "loss"), store_metrics(url, job_id)["loss"])
    assert history(client, run.info.run_id, "eval/accuracy/level_3") == [(i, i / 10) for i in range(10)]
    assert run.data.metrics["score/arith/accuracy"] == 0.75
    with session_scope(url) as s:
        from store.models import Event

        events = s.query(Event).filter(Event.job_id == job_id, Event.type == "tracking").all()
    (event,) = events  # one link, recorded by the attempt that made the run
    assert event.data["run_id"] == run.info.run_id and event.level == "info"
    assert event.data["url"] == f"{mlflow_server}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"

    # a job re-run after it ended (its worker was lost after the end): the run runs again, then fails
    with session_scope(url) as s:
        add_event(s, job_id, "note", "re-run")
    third = Mirror(settings, job_id)
    assert third.flush() and client.get_run(run.info.run_id).info.status == "RUNNING"
    third.close("failed")
    assert client.get_run(run.info.run_id).info.status == "FAILED"
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_a_backfill_mirrors_the_ended_jobs_mlflow_missed_once(mlflow_server: str, tmp_path: Path) -> None:
    """Jobs that ended while MLflow was down (or before it was set): `python -m worker.tracking
    backfill` mirrors them, and a second run leaves them alone (issue 45)."""
    import sys

    from store.models import Event
    from worker.tracking import backfill

    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    project = f"backfill-{uuid.uuid4().hex[:6]}"
    ids: dict[str, str] = {}
    with session_scope(url) as s:
        proj = Project(name=project)
        s.add(proj)
        s.flush()
        for status in ("succeeded", "failed", "running"):
            job = Job(project_id=proj.id, kind="sft", name=status, spec={}, resolved_config={"kind": "sft"},
                      status=status, queue="parked")  # fmt: skip
            s.add(job)
            s.flush()
            ids[status] = job.id
            s.add_all(Metric(job_id=job.id, name="loss", step=i, value=1.0 / (i + 1)) for i in range(6))
    settings = Settings(
        database={"url": url},  # type: ignore[arg-type]
        tracking={"mlflow_uri": mlflow_server, "request_timeout_seconds": 30},  # type: ignore[arg-type]
    )
    out = backfill(settings, project=project)
    assert sorted(out["mirrored"]) == sorted([ids["succeeded"], ids["failed"]]) and not out["failed"]
    client = mlflow_client(mlflow_server)
    for status, run_status in (("succeeded", "FINISHED"), ("failed", "FAILED")):
        run = run_of(client, f"mathrl/{project}", ids[status])
        assert run.info.status == run_status
        assert history(client, run.info.run_id, "loss") == store_metrics(url, ids[status])["loss"]
    experiment = client.get_experiment_by_name(f"mathrl/{project}").experiment_id
    assert len(client.search_runs([experiment])) == 2  # the running job is its worker's to mirror

    # again, as an operator runs it: nothing to do
    env = {**os.environ, "MATHRL_DATABASE__URL": url, "MATHRL_TRACKING__MLFLOW_URI": mlflow_server,
           "MATHRL_TRACKING__REQUEST_TIMEOUT_SECONDS": "30", "PYTHONPATH": str(ROOT)}  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "worker.tracking", "backfill", "--project", project],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "mirrored: 0" in proc.stdout and "complete: 2" in proc.stdout, proc.stdout
    # a metric the store got later (a lost worker's last flush): only that job is copied again
    with session_scope(url) as s:
        s.add(Metric(job_id=ids["failed"], name="loss", step=6, value=0.1))
    out = backfill(settings, project=project)
    assert out == {"mirrored": [ids["failed"]], "complete": [ids["succeeded"]], "failed": []}
    assert len(history(client, run_of(client, f"mathrl/{project}", ids["failed"]).info.run_id, "loss")) == 7
    assert len(client.search_runs([experiment])) == 2
    with session_scope(url) as s:
        for status in ("succeeded", "failed"):
            links = s.query(Event).filter(Event.job_id == ids[status], Event.type == "tracking").count()
            assert links == 1  # one link each, however often it ran


# ---- real jobs through the service --------------------------------------------------------


def sft(pool: str, steps: int) -> dict[str, Any]:
    return {
        "kind": "sft",
        "model": "tiny:2x64",
        "dataset": {"name": "arith-train", "limit": 200},
        "max_steps": steps,
        "learning_rate": 1e-3,
        "per_device_train_batch_size": 16,
        "max_length": 32,
        "logging_steps": 1,
        "save_steps": steps,
        "resources": {"pool": pool},
    }


@pytest.fixture(scope="module")
def tracked(service: Service, mlflow_server: str) -> Iterator[tuple[Service, str, str]]:
    """Workers of the test service with runs mirrored: one to the MLflow server (queue returned
    first), one to a port nothing listens on (second)."""
    up, down = "mlflow-up", "mlflow-down"  # pools the test service runs (tests/helpers/service.py)
    env = {"MATHRL_TRACKING__MATHRL_URL": service.url, "MATHRL_TRACKING__FLUSH_SECONDS": "1"}
    workers = [
        service.start_worker(up, name=up, env={**env, "MATHRL_TRACKING__MLFLOW_URI": mlflow_server}),
        service.start_worker(
            down, name=down, env={**env, "MATHRL_TRACKING__MLFLOW_URI": f"http://127.0.0.1:{free_port()}"}
        ),
    ]
    yield service, up, down
    for w in workers:
        service.stop_worker(w)


@pytest.mark.slow
def test_a_job_is_mirrored_to_mlflow_with_links_both_ways(
    tracked: tuple[Service, str, str], mlflow_server: str, db_url: str
) -> None:
    service, up, _ = tracked
    project = f"tracked-{uuid.uuid4().hex[:6]}"
    c = service.client(service.key(project))
    job = c.jobs.create(sft(up, steps=6))
    done = c.jobs.wait(job.id, timeout=240)
    assert done.status == "succeeded", done.error
    ev = c.jobs.create(
        {
            "kind": "eval",
            "model": f"job:{job.id}",
            "benchmark": "arith",
            "limit": 8,
            "batch_size": 8,
            "sampling": {"max_new_tokens": 4},
            "resources": {"pool": up},
        }
    )
    assert c.jobs.wait(ev.id, timeout=240).status == "succeeded"

    client = mlflow_client(mlflow_server)

    def ended(job_id: str) -> Any:  # the worker ends a run just after it records the job's end, never before
        found = run_of(client, f"mathrl/{project}", job_id)
        return found if found.info.status != "RUNNING" else None

    run = wait_for(lambda: ended(job.id), 30, 0.2, "the job's run to end")
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert float(params["learning_rate"]) == 1e-3 and params["max_steps"] == "6" and params["resources.pool"] == up
    assert params["dataset.name"] == "arith-train" and params["kind"] == "sft"
    # every metric of the job, step by step, as the store holds it
    stored = store_metrics(db_url, job.id)
    assert "loss" in stored and len(stored["loss"]) == 6, stored.keys()
    assert set(run.data.metrics) == {mlflow_key(n) for n in stored}
    for name, points in stored.items():
        assert same(history(client, run.info.run_id, mlflow_key(name)), points), name
    # links both ways: the run names the job and its page, the job's events the run and its page
    assert run.data.tags[JOB_ID_TAG] == job.id and run.data.tags["mathrl.job_url"] == f"{service.url}/ui/jobs/{job.id}"
    # (one link; a call that timed out on this busy machine would add a warning, and is retried)
    (link,) = [e for e in c.jobs.events(job.id) if e.type == "tracking" and e.level == "info"]
    assert link.data is not None and link.data["run_id"] == run.info.run_id
    assert link.data["url"] == f"{mlflow_server}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    assert link.data["url"] in link.message
    # the eval's scores, in its own run of the same experiment
    ev_run = wait_for(lambda: ended(ev.id), 30, 0.2, "the eval's run to end")
    (score,) = [s for s in c.scores.list(job_id=ev.id) if s.metric == "accuracy"]
    assert ev_run.info.status == "FINISHED" and ev_run.data.metrics["score/arith/accuracy"] == score.value
    assert ev_run.data.params["model"] == f"job:{job.id}"


@pytest.mark.slow
def test_a_tracker_that_is_down_fails_no_job_and_is_counted(tracked: tuple[Service, str, str], db_url: str) -> None:
    service, _, down = tracked
    c = service.client()
    t0 = time.monotonic()
    job = c.jobs.create(sft(down, steps=4))
    done = c.jobs.wait(job.id, timeout=240)
    assert done.status == "succeeded", done.error
    # the supervisor ends the mirror after it records the job's end: its summary comes just after
    wait_for(
        lambda: any(e.type == "tracking" and "unaffected" in e.message for e in c.jobs.events(job.id)),
        30,
        what="the mirror's summary event",
    )
    events = [e for e in c.jobs.events(job.id) if e.type == "tracking"]
    assert events and all(e.level == "warning" for e in events), events
    first, summary = events[0], events[-1]
    assert "failed" in first.message and "the job goes on" in first.message
    assert summary.data is not None and summary.data["errors"] >= 1 and summary.data["copied"] == 0
    assert summary.data["pending"] == sum(len(v) for v in store_metrics(db_url, job.id).values()) > 0
    assert f"{summary.data['errors']} call(s) to MLflow" in summary.message and "unaffected" in summary.message
    # the job's end came first: the supervisor ended the mirror after recording it
    succeeded = next(e for e in c.jobs.events(job.id) if e.type == "succeeded")
    assert succeeded.seq < summary.seq
    assert time.monotonic() - t0 < 200
