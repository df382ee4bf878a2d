"""Pipelines: named job specs in one submission, run in dependency order.

Quick tests use the in-process API and the store; slow ones run real jobs on the worker.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from mathrl.specs import PipelineSpec
from store.db import session_scope
from store.jobs import claim, finish
from store.migrate import upgrade
from store.models import Event, Job, Pipeline, Project
from tests.conftest import Service, admin_key

ARITH = {"name": "arith-train"}


def sft(steps: int = 30, save_steps: int = 10) -> dict[str, Any]:
    return {
        "kind": "sft",
        "model": "tiny:2x64",
        "dataset": {**ARITH, "limit": 2000},
        "max_steps": steps,
        "per_device_train_batch_size": 16,
        "learning_rate": 1e-3,
        "logging_steps": 5,
        "save_steps": save_steps,
    }


def ev(model: str) -> dict[str, Any]:
    return {
        "kind": "eval",
        "model": model,
        "benchmark": "arith",
        "limit": 8,
        "batch_size": 8,
        "sampling": {"max_new_tokens": 4},
    }


# ---- validation ------------------------------------------------------------------------


@pytest.mark.quick
@pytest.mark.parametrize(
    ("jobs", "pointer", "words"),
    [
        ({"a": ev("job:b"), "b": ev("job:a")}, "/jobs", "cycle: a -> b -> a"),
        ({"a": ev("job:c"), "b": ev("job:a"), "c": ev("job:b")}, "/jobs", "cycle"),
        ({"a": ev("job:a")}, "/jobs/a/model", "its own output"),
        ({"train": sft(), "after": ev("job:trian")}, "/jobs/after/model", "use one of after, train"),
        ({"train": sft(), "after": {**ev("job:train"), "limit": 0}}, "/jobs/after/limit", "greater than"),
        ({"Bad Name": sft()}, "/jobs/Bad Name", "pattern"),
        ({}, "/jobs", "at least 1"),
    ],
)
def test_bad_pipelines_are_422_naming_the_place(app_client: Any, jobs: dict, pointer: str, words: str) -> None:
    r = app_client.post("/v1/pipelines", json={"jobs": jobs}, headers=admin_key(app_client))
    assert r.status_code == 422, r.text
    body = r.json()
    assert r.headers["content-type"].startswith("application/problem+json")
    assert any(e["pointer"].startswith(pointer) and words in e["detail"] for e in body["errors"]), body


@pytest.mark.quick
def test_reference_to_another_projects_job_is_422_and_stores_nothing(app_client: Any) -> None:
    other = admin_key(app_client)
    foreign = app_client.post("/v1/jobs", json=ev("org/m"), headers=other).json()["id"]
    mine = admin_key(app_client)
    r = app_client.post("/v1/pipelines", json={"jobs": {"e": ev(f"job:{foreign}")}}, headers=mine)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/jobs/e/model", r.text
    assert app_client.get("/v1/pipelines", headers=mine).json()["data"] == []
    assert app_client.get("/v1/jobs", headers=mine).json()["data"] == []


@pytest.mark.quick
def test_submit_stores_waiting_jobs_with_rewritten_references(app_client: Any) -> None:
    h = admin_key(app_client)
    spec = {
        "name": "demo",
        "tags": ["t1"],
        "jobs": {
            "after": ev("job:train@step-10"),
            "train": sft(),
            "before": ev("org/m"),
        },
    }
    r = app_client.post("/v1/pipelines", json=spec, headers=h)
    assert r.status_code == 201, r.text
    p = r.json()
    steps = {j["step"]: j for j in p["jobs"]}
    assert steps["train"]["status"] == "queued" and steps["before"]["status"] == "queued"
    assert steps["after"]["status"] == "waiting" and steps["after"]["depends_on"] == ["train"]
    after = app_client.get(f"/v1/jobs/{steps['after']['job_id']}", headers=h).json()
    assert after["spec"]["model"] == f"job:{steps['train']['job_id']}@step-10"
    assert after["pipeline_id"] == p["id"] and after["pipeline_step"] == "after" and "t1" in after["tags"]
    assert after["depends_on"] == [steps["train"]["job_id"]]
    assert p["spec"]["jobs"]["after"]["model"] == "job:train@step-10"  # the submission as written
    listed = app_client.get(f"/v1/jobs?pipeline_id={p['id']}", headers=h).json()["data"]
    assert {j["pipeline_step"] for j in listed} == {"after", "train", "before"}
    # another project sees none of it
    other = admin_key(app_client)
    assert app_client.get(f"/v1/pipelines/{p['id']}", headers=other).status_code == 404
    assert app_client.post(f"/v1/pipelines/{p['id']}/cancel", headers=other).status_code == 404
    # cancelling before anything ran ends every job
    c = app_client.post(f"/v1/pipelines/{p['id']}/cancel", headers=h).json()
    assert c["status"] == "cancelled" and {j["status"] for j in c["jobs"]} == {"cancelled"}


@pytest.mark.quick
def test_spec_validates_in_the_sdk_too() -> None:
    p = PipelineSpec.model_validate({"jobs": {"a": sft(), "b": ev("job:a"), "c": ev("job:b@final")}})
    assert p.dependencies() == {"a": [], "b": ["a"], "c": ["b"]}


# ---- settling, on the store --------------------------------------------------------------


def _store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    upgrade(url)
    return url


def _pipeline(s: Any, deps: dict[str, list[str]]) -> dict[str, str]:
    proj = Project(name=f"p{id(deps)}")
    s.add(proj)
    s.flush()
    pl = Pipeline(project_id=proj.id, spec={}, tags=[])
    s.add(pl)
    s.flush()
    ids: dict[str, str] = {}
    for step, ds in deps.items():
        job = Job(
            project_id=proj.id,
            kind="eval",
            spec={},
            tags=[],
            pipeline_id=pl.id,
            pipeline_step=step,
            depends_on=[ids[d] for d in ds],
            status="waiting" if ds else "queued",
        )
        s.add(job)
        s.flush()
        ids[step] = job.id
    s.commit()
    return ids


def _run(url: str, job_id: str, status: str, error: str | None = None) -> None:
    with session_scope(url) as s:
        assert claim(s, job_id, "w", 30) is not None
    with session_scope(url) as s:
        assert finish(s, job_id, "w", status, error)


def _statuses(url: str, ids: dict[str, str]) -> dict[str, tuple[str, str | None]]:
    with session_scope(url) as s:
        return {step: (j.status, j.error) for step, jid in ids.items() if (j := s.get(Job, jid))}


@pytest.mark.quick
def test_a_job_is_queued_only_when_all_it_depends_on_succeeded(tmp_path: Path) -> None:
    url = _store(tmp_path)
    with session_scope(url) as s:
        ids = _pipeline(s, {"a": [], "b": [], "c": ["a", "b"], "d": ["c"]})
    _run(url, ids["a"], "succeeded")
    assert _statuses(url, ids)["c"][0] == "waiting"  # b has not run yet
    _run(url, ids["b"], "succeeded")
    st = _statuses(url, ids)
    assert st["c"][0] == "queued" and st["d"][0] == "waiting"
    with session_scope(url) as s:
        assert s.get(Job, ids["c"]).dispatched_at is None  # the worker/reconciler sends it


@pytest.mark.quick
def test_a_failure_marks_everything_downstream_with_the_reason(tmp_path: Path) -> None:
    url = _store(tmp_path)
    with session_scope(url) as s:
        ids = _pipeline(s, {"a": [], "side": [], "b": ["a"], "c": ["b", "side"]})
    _run(url, ids["a"], "failed", "CUDA out of memory")
    st = _statuses(url, ids)
    assert st["b"] == ("failed", f"upstream job 'a' ({ids['a']}) failed: CUDA out of memory")
    assert st["c"][0] == "failed" and "upstream job 'b'" in (st["c"][1] or "")
    assert st["side"][0] == "queued"  # an independent branch is untouched
    with session_scope(url) as s:
        assert s.scalar(select(Job.finished_at).where(Job.id == ids["c"])) is not None
        events = s.scalars(select(Event.type).where(Event.job_id == ids["c"])).all()
        assert events == ["failed"]


# ---- real jobs on the worker ----------------------------------------------------------------


@pytest.mark.slow
def test_pipeline_runs_in_dependency_order_with_a_checkpoint_reference(service: Service) -> None:
    c = service.client()
    p = c.pipelines.create(
        {
            "name": "order",
            "jobs": {
                "train": sft(steps=20, save_steps=10),
                "mid": ev("job:train@step-10"),
                "final": ev("job:train"),
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
                "bad": ev(str(tmp_path / "no-such-model")),
                "after": ev("job:bad"),
                "last": ev("job:after"),
                "ok": ev("org/none"),
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
    p = c.pipelines.create({"jobs": {"train": sft(steps=100000, save_steps=100000), "after": ev("job:train")}})
    train_id = next(j.job_id for j in p.jobs if j.step == "train")
    deadline = time.monotonic() + 120
    while c.jobs.retrieve(train_id).status != "running":
        assert time.monotonic() < deadline, "train never started"
        time.sleep(0.3)
    c.pipelines.cancel(p.id)
    done = c.pipelines.wait(p.id, timeout=60)
    assert {j.step: j.status for j in done.jobs} == {"train": "cancelled", "after": "cancelled"}
    assert done.status == "cancelled"


@pytest.mark.quick
def test_each_step_goes_through_admission_before_anything_is_stored(app_client: Any) -> None:
    h = admin_key(app_client)
    r = app_client.post("/v1/pipelines", json={"jobs": {"train": sft(), "bad": ev("/etc/models/x")}}, headers=h)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["pointer"] == "/jobs/bad/model" and "step 'bad'" in r.json()["detail"]
    assert app_client.get("/v1/pipelines", headers=h).json()["data"] == []
    assert app_client.get("/v1/jobs", headers=h).json()["data"] == []
