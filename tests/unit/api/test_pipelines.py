"""Pipelines: named job specs in one submission, run in dependency order.

Quick tests use the in-process API and the store; slow ones run real jobs on the worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from mathrl.specs import PipelineSpec
from store.db import session_scope
from store.jobs import claim, finish
from store.migrate import upgrade
from store.models import Event, Job, Pipeline, Project
from tests.helpers.api import admin_key
from tests.helpers.jobs import PARKED, parked_grpo
from tests.helpers.jobs import eval_step as running_eval
from tests.helpers.jobs import sft_step as running_sft


# parked: in a session where a test's worker is up (the `service` fixture, on the same database and
# broker), an unparked job of these tests was claimed and running when they cancelled it
def sft_step() -> dict[str, Any]:
    return {**running_sft(), "resources": PARKED}


def eval_step(model: str) -> dict[str, Any]:
    return {**running_eval(model), "resources": PARKED}


ARITH = {"name": "arith-train"}


# ---- validation ------------------------------------------------------------------------


@pytest.mark.quick
@pytest.mark.parametrize(
    ("jobs", "pointer", "words"),
    [
        ({"a": eval_step("job:b"), "b": eval_step("job:a")}, "/jobs", "cycle: a -> b -> a"),
        ({"a": eval_step("job:c"), "b": eval_step("job:a"), "c": eval_step("job:b")}, "/jobs", "cycle"),
        ({"a": eval_step("job:a")}, "/jobs/a/model", "its own output"),
        (
            {"train": sft_step(), "after": eval_step("job:trian")},
            "/jobs/after/model",
            "use one of after, train",
        ),
        (
            {"train": sft_step(), "after": {**eval_step("job:train"), "limit": 0}},
            "/jobs/after/limit",
            "greater than",
        ),
        # an eval step saves no model: the step naming it was accepted, then failed on the worker
        (
            {"train": sft_step(), "ev": eval_step("job:train"), "again": eval_step("job:ev")},
            "/jobs/again/model",
            "step 'ev' is eval: that kind saves no model",
        ),
        ({"Bad Name": sft_step()}, "/jobs/Bad Name", "pattern"),
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
    foreign = app_client.post("/v1/jobs", json=eval_step("org/m"), headers=other).json()["id"]
    mine = admin_key(app_client)
    r = app_client.post("/v1/pipelines", json={"jobs": {"e": eval_step(f"job:{foreign}")}}, headers=mine)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/jobs/e/model", r.text
    assert app_client.get("/v1/pipelines", headers=mine).json()["data"] == []
    assert app_client.get("/v1/jobs", headers=mine).json()["data"] == []


@pytest.mark.quick
def test_a_step_whose_defaults_resolve_by_its_rewards_is_submitted_as_a_job_is(app_client: Any) -> None:
    """dynamic_sampling with no accuracy reward: the stored spec (every field dumped) parsed again
    read the default metric 'correct' as asked for; a pipeline answered that with a 500."""
    grpo = parked_grpo(rewards=[{"name": "format"}], dynamic_sampling=True)
    h = admin_key(app_client)
    r = app_client.post("/v1/pipelines", json={"jobs": {"rl": grpo}}, headers=h)
    assert r.status_code == 201, r.text
    job = app_client.get(f"/v1/jobs/{r.json()['jobs'][0]['job_id']}", headers=h).json()
    assert job["resolved_config"]["dynamic_sampling"]["metric"] == "reward"
    one = app_client.post("/v1/jobs", json=grpo, headers=h).json()
    assert one["resolved_config"]["dynamic_sampling"]["metric"] == "reward"
    app_client.post(f"/v1/pipelines/{r.json()['id']}/cancel", headers=h)
    app_client.post(f"/v1/jobs/{one['id']}/cancel", headers=h)


@pytest.mark.quick
def test_submit_stores_waiting_jobs_with_rewritten_references(app_client: Any) -> None:
    h = admin_key(app_client)
    spec = {
        "name": "demo",
        "tags": ["t1"],
        "jobs": {
            "after": eval_step("job:train@step-10"),
            "train": sft_step(),
            "before": eval_step("org/m"),
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
    p = PipelineSpec.model_validate({"jobs": {"a": sft_step(), "b": eval_step("job:a"), "c": eval_step("job:b@final")}})
    assert p.dependencies() == {"a": [], "b": ["a"], "c": ["b"]}
    # a step named like a job id is that step (it was read as an existing job: no wait, then a failure)
    named = "abcdef01-2345-6789-abcd-ef0123456789"
    p = PipelineSpec.model_validate({"jobs": {named: sft_step(), "after": eval_step(f"job:{named}")}})
    assert p.dependencies() == {named: [], "after": [named]}


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


@pytest.mark.quick
def test_each_step_goes_through_admission_before_anything_is_stored(app_client: Any) -> None:
    h = admin_key(app_client)
    r = app_client.post(
        "/v1/pipelines", json={"jobs": {"train": sft_step(), "bad": eval_step("/etc/models/x")}}, headers=h
    )
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["pointer"] == "/jobs/bad/model" and "step 'bad'" in r.json()["detail"]
    assert app_client.get("/v1/pipelines", headers=h).json()["data"] == []
    assert app_client.get("/v1/jobs", headers=h).json()["data"] == []
