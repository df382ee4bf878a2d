"""Tenant isolation at the API (issue 43): a raw path never reaches the service's own storage
(another project's trained models and uploaded files), refusals name no server path, revoking a
key revokes every key minted below it, and a NUL is refused by the store's one check on every
JSON column, whatever the route. (The python grader's kernel boundary: tests/unit/evaluator/test_sandbox.py;
forwarded addresses: tests/system/test_grader_isolation_api.py, against a real uvicorn.)"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from config.settings import get_settings
from tests.helpers.api import admin_key, make_objects, project_jobs
from tests.helpers.jobs import parked_eval, parked_session

pytestmark = pytest.mark.quick


def _stored_model(artifacts: Path, job_id: str) -> Path:
    final = artifacts / "jobs" / job_id / "train" / "final"
    final.mkdir(parents=True, exist_ok=True)
    (final / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return final


def test_a_raw_path_never_reaches_another_projects_models_or_files(app_client: Any) -> None:
    """Before: B evaluated A's model at <artifact_dir>/jobs/<A's job>/train/final and read A's upload
    at <artifact_dir>/files/<A's project>/<file>.jsonl as a dataset; each refusal listed the server's roots.
    A session's `load` (the saved state it starts from) took a raw path into storage, and another
    project's 'job:' reference, until 2026-11-28: no submit-time check saw the field."""
    settings = get_settings()
    artifacts = Path(settings.artifact_dir).resolve()
    a, b = admin_key(app_client), admin_key(app_client)
    ids = make_objects(app_client, a)
    model = _stored_model(artifacts, ids["job_id"])
    uploads = list((artifacts / "files").rglob(f"{ids['file_id']}*"))
    assert uploads, "the upload is stored under the artifact directory"
    link = artifacts.parent / f"link-{ids['job_id']}"
    link.symlink_to(model)  # under a model root (the artifact dir's parent), pointing back into storage
    saved = artifacts / "jobs" / ids["job_id"] / "weights" / "s1"  # a Tinker session's save_state
    for spec, pointer in (
        (parked_session(load=str(saved)), "/load"),
        (parked_session(load=f"{artifacts}/jobs/../jobs/{ids['job_id']}/weights/s1"), "/load"),
        (parked_eval(model=str(model)), "/model"),
        (parked_eval(model=f"{artifacts}/jobs/../jobs/{ids['job_id']}/train/final"), "/model"),
        (parked_eval(model=str(link)), "/model"),
        (parked_eval(dataset={"path": str(uploads[0])}), "/dataset/path"),
        (parked_eval(dataset={"path": f"file://{uploads[0]}"}), "/dataset/path"),
    ):
        for who in (b, a):  # a raw path is refused to the owner too: storage is named by reference only
            r = app_client.post("/v1/jobs", json=spec, headers=who)
            assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == pointer, r.text
            detail = r.json()["detail"]
            assert "service's own storage" in detail and ("job:" in detail or "file-" in detail), detail
    # fsspec's chained URLs (datasets reads 'a::b' as b, a file system holding a): a path under a root
    # whose chain names a file in storage
    root = artifacts.parent
    for path in (f"{root}/x::{uploads[0]}", f"{root}/x.jsonl::{root}/y.zip"):
        r = app_client.post("/v1/jobs", json=parked_eval(dataset={"path": path}), headers=a)
        assert r.status_code == 422 and "chains file systems" in r.json()["detail"], r.text  # before: 201
    assert project_jobs(app_client, b) == []
    # the typed reference works for the owner and is refused to the other project
    trained = str(uuid.UUID(ids["fine_tuning_job_id"].removeprefix("ftjob-")))  # an SFT job, saved at step 1
    assert app_client.post("/v1/jobs", json=parked_eval(model=f"job:{trained}"), headers=a).status_code == 201
    r = app_client.post("/v1/jobs", json=parked_eval(model=f"job:{trained}"), headers=b)
    assert r.status_code == 422, r.text
    # a session starts from its project's save by reference, never from another project's: the same
    # 422 as a missing job
    saved_ref = f"job:{trained}@step-1"
    assert app_client.post("/v1/jobs", json=parked_session(load=saved_ref), headers=a).status_code == 201
    r = app_client.post("/v1/jobs", json=parked_session(load=saved_ref), headers=b)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/load", r.text


def test_a_raw_path_never_reaches_the_workers_cache(app_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers keep their hub downloads and prepared datasets (every project's) under
    /var/cache/mathrl (HF_HOME in the images and the chart), not under the API's HF_HOME, which
    was the only cache the API guarded: under a model root, a raw path reached theirs."""
    settings = get_settings()
    cache = Path(settings.artifact_dir).resolve().parent / "worker-cache"  # under a model root, as a mount might be
    snapshot = cache / "huggingface" / "hub" / "models--org--private" / "snapshots" / "0"
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    monkeypatch.setattr(settings.sources, "cache_dirs", [*settings.sources.cache_dirs, str(cache)])
    r = app_client.post("/v1/jobs", json=parked_eval(model=str(snapshot)), headers=admin_key(app_client))
    assert r.status_code == 422 and "service's own storage" in r.json()["detail"], r.text  # before: 201
    assert "/var/cache/mathrl" in type(settings.sources)().cache_dirs  # the images' and the chart's


def test_a_tinker_model_on_another_projects_job_is_refused_at_submit(app_client: Any) -> None:
    """Before: POST /api/v1/create_model took `base_model: job:<another project's job>` (or its ft:
    name) and made a session job; only the worker refused it, and the API's memory plan read that
    job's model config first. Now the same 422 as /v1/jobs gives, and no job is made."""
    a, b = admin_key(app_client), admin_key(app_client)
    ids = make_objects(app_client, a)
    trained = str(uuid.UUID(ids["fine_tuning_job_id"].removeprefix("ftjob-")))  # an SFT job of A's
    _stored_model(Path(get_settings().artifact_dir).resolve(), trained)
    answers = {}
    for who, name in ((b, "b"), (a, "a")):
        tinker = {"X-API-Key": "tml-" + who["Authorization"].removeprefix("Bearer ")}
        session = app_client.post("/api/v1/create_session", json={"tags": []}, headers=tinker).json()["session_id"]
        body = {"session_id": session, "base_model": f"job:{trained}", "model_seq_id": 0}
        answers[name] = app_client.post("/api/v1/create_model", json=body, headers=tinker)
    refused, owner = answers["b"], answers["a"]
    assert refused.status_code == 422, refused.text
    assert refused.json()["errors"][0]["pointer"] == "/model" and trained in refused.json()["detail"]
    assert project_jobs(app_client, b) == []
    assert owner.status_code == 200 and owner.json()["model_id"], owner.text  # a session job on its own model


def test_path_refusals_name_no_server_path(app_client: Any, tmp_path: Path) -> None:
    settings = get_settings()
    server_paths = [
        str(Path(p).resolve()) for p in (settings.artifact_dir, settings.data_dir, *settings.sources.model_roots)
    ]
    server_paths.append(os.getcwd())
    h = admin_key(app_client)
    for spec in (
        parked_eval(model="/etc"),
        parked_eval(model="./relative"),
        parked_session(load="./relative"),
        parked_session(load="/etc"),
        parked_eval(dataset={"path": "/etc/passwd"}),
        parked_eval(dataset={"path": "set.jsonl"}),
    ):
        r = app_client.post("/v1/jobs", json=spec, headers=h)
        assert r.status_code == 422, r.text
        for p in server_paths:
            assert p not in r.text, (p, r.text)


def _key(app_client: Any, headers: dict[str, str], name: str) -> dict[str, Any]:
    r = app_client.post("/v1/keys", json={"name": name}, headers=headers)
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_revoking_a_key_revokes_every_key_minted_below_it(app_client: Any) -> None:
    """Before: after DELETE /v1/keys/<P>, C (minted by P) could still submit and mint, and G (minted by C) read."""
    a = admin_key(app_client)
    p = _key(app_client, a, "P")
    hp = {"Authorization": f"Bearer {p['key']}"}
    c = _key(app_client, hp, "C")
    hc = {"Authorization": f"Bearer {c['key']}"}
    g = _key(app_client, hc, "G")
    hg = {"Authorization": f"Bearer {g['key']}"}
    sibling = _key(app_client, a, "sibling")
    hs = {"Authorization": f"Bearer {sibling['key']}"}
    listed = {k["name"]: k for k in app_client.get("/v1/keys", headers=a).json()["data"]}
    assert listed["C"]["parent_id"] == p["id"] and listed["G"]["parent_id"] == c["id"]
    assert listed["P"]["parent_id"] is not None and listed["P"]["parent_id"] == listed["sibling"]["parent_id"]
    assert app_client.delete(f"/v1/keys/{p['id']}", headers=a).status_code == 204
    for h in (hp, hc, hg):
        assert app_client.get("/v1/jobs", headers=h).status_code == 401
        assert app_client.post("/v1/jobs", json=parked_eval(), headers=h).status_code == 401
        assert app_client.post("/v1/keys", json={"name": "more"}, headers=h).status_code == 401
    listed = {k["name"]: k for k in app_client.get("/v1/keys", headers=a).json()["data"]}
    assert all(listed[n]["revoked_at"] for n in ("P", "C", "G")) and listed["sibling"]["revoked_at"] is None
    assert (
        app_client.get("/v1/jobs", headers=hs).status_code == 200
        and app_client.get("/v1/jobs", headers=a).status_code == 200
    )


def test_a_nul_is_refused_at_the_store_on_every_route(app_client: Any) -> None:
    """Before: a NUL in fine-tuning `metadata` was stored, and every later query over that row's
    resolved_config failed on PostgreSQL. Each route here stores JSON; none checks NUL itself."""
    h = admin_key(app_client)
    ids = make_objects(app_client, h)
    before = len(project_jobs(app_client, h))
    cases = [
        (
            "/v1/fine_tuning/jobs",
            {"model": "org/model", "training_file": ids["file_id"], "metadata": {"team": "a\x00b"}},
        ),
        ("/v1/jobs", parked_eval(name="a\x00b")),
        ("/v1/pipelines", {"jobs": {"only": parked_eval(name="n\x00")}}),
        ("/v1/keys", {"name": "k\x00"}),
    ]
    for route, body in cases:
        r = app_client.post(route, json=body, headers=h)
        assert r.status_code == (400 if route.startswith("/v1/fine_tuning") else 422), (route, r.text)  # as OpenAI
        assert "NUL" in r.json()["detail"] and r.json()["errors"][0]["pointer"].startswith("/"), (route, r.text)
        if route.startswith("/v1/fine_tuning"):  # the request's own field, in OpenAI's error too
            assert (
                r.json()["errors"][0]["pointer"] == "/metadata/team" and r.json()["error"]["param"] == "metadata.team"
            )
    assert len(project_jobs(app_client, h)) == before  # nothing stored, nothing lost
    r = app_client.get("/v1/fine_tuning/jobs", headers=h)
    assert r.status_code == 200 and len(r.json()["data"]) == 1, r.text
