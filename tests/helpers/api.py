"""Helpers for the in-process app (the `app_client` fixture): keys, one object of each kind, live
settings, the database under it."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.helpers.env import ADMIN_TOKEN


@contextlib.contextmanager
def private_app(tmp: Path) -> Iterator[Any]:
    """The API in process (as `app_client`) on a database and broker of its own: a SQLite file and
    kombu's SQLAlchemy transport under `tmp`. `app_client` shares the session's with the suite's
    service fixtures, whose workers take any job sent to the cpu queue: a test of what a queued job
    does (or of an API that waits on one) gets a job that stays queued here, whatever ran before it."""
    import os

    from fastapi.testclient import TestClient

    from api.app import create_app
    from config.settings import get_settings
    from store.migrate import upgrade
    from tests.helpers.service import service_env

    tmp.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{tmp / 'mathrl.db'}"
    upgrade(url)
    old = dict(os.environ)
    os.environ.update(service_env(url, f"sqla+sqlite:///{tmp / 'broker.db'}", tmp / "artifacts"))
    get_settings.cache_clear()
    try:
        with TestClient(create_app()) as c:
            yield c
    finally:
        os.environ.clear()
        os.environ.update(old)
        get_settings.cache_clear()


def private_app_client() -> Any:
    """`app_client = private_app_client()` in a test module: its tests get a `private_app`, one per
    module, in place of the session's `app_client`."""
    import pytest

    @pytest.fixture(scope="module", name="app_client")
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
        with private_app(tmp_path_factory.mktemp("private-app")) as c:
            yield c

    return fixture


def admin_key(app_client: Any, project: str | None = None) -> dict[str, str]:
    """Headers with a fresh key for a (new) project, through the in-process app."""
    project = project or f"p-{uuid.uuid4().hex[:8]}"
    r = app_client.post("/v1/keys", json={"project": project}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['key']}"}


def make_objects(app_client: Any, owner: dict[str, str]) -> dict[str, str]:
    """One real object of the owner's project per path parameter the API takes (a job, a key, a
    pipeline, a file, a fine-tuning job), for tests that walk every route of the OpenAPI document.
    The jobs go to a pool no worker serves."""
    eval_spec = {"kind": "eval", "model": "org/model", "limit": 5, "resources": {"pool": "objects-parked"}}
    job = app_client.post("/v1/jobs", json=eval_spec, headers=owner)
    assert job.status_code == 201, job.text
    key = app_client.post("/v1/keys", json={"name": "victim"}, headers=owner)
    assert key.status_code == 201, key.text
    pipeline = app_client.post("/v1/pipelines", json={"jobs": {"only": eval_spec}}, headers=owner)
    assert pipeline.status_code == 201, pipeline.text
    ids = {"job_id": job.json()["id"], "key_id": key.json()["id"], "pipeline_id": pipeline.json()["id"]}
    chat = b'{"messages": [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}]}\n'
    f = app_client.post("/v1/files", files={"file": ("s.jsonl", chat)}, data={"purpose": "fine-tune"}, headers=owner)
    assert f.status_code == 200, f.text
    ids["file_id"] = f.json()["id"]
    ft = app_client.post(
        "/v1/fine_tuning/jobs", json={"model": "org/model", "training_file": ids["file_id"]}, headers=owner
    )
    assert ft.status_code == 200, ft.text
    ids["fine_tuning_job_id"] = ft.json()["id"]
    # a checkpoint of it, as a worker would record one: its `ft:` model is what /v1/models/{model} names
    from config.settings import get_settings
    from store.db import session_scope
    from store.models import Checkpoint

    job_uuid = str(uuid.UUID(ids["fine_tuning_job_id"].removeprefix("ftjob-")))
    with session_scope(get_settings().database.url) as s:
        s.add(Checkpoint(job_id=job_uuid, step=1, kind="checkpoint", uri="/nowhere/checkpoint-1"))
    ids["model"] = f"ft:model:mathrl:{ids['fine_tuning_job_id']}:ckpt-step-1"
    # a Tinker training client: a session job (its session's and its sampler's ids)
    session = f"s-{uuid.uuid4().hex[:8]}"
    spec = {"kind": "session", "model": "org/model", "session": session, "name": f"{session}:train:0"}
    client = app_client.post("/v1/jobs", json={**spec, "resources": {"pool": "objects-parked"}}, headers=owner)
    assert client.status_code == 201, client.text
    ids["session_id"], ids["sampler_id"] = session, f"{client.json()['id']}:sample:0"
    ids["training_run_id"], ids["checkpoint_id"] = f"{session}:train:0", "weights/final"  # the RestClient's names
    # a response (OpenAI's Responses API): a generate job so tagged
    gen = {"kind": "generate", "model": "org/model", "messages": [{"role": "user", "content": "hi"}]}
    resp = app_client.post(
        "/v1/jobs", json={**gen, "tags": ["openai:responses"], "resources": {"pool": "objects-parked"}}, headers=owner
    )
    assert resp.status_code == 201, resp.text
    ids["response_id"] = "resp_" + resp.json()["id"].replace("-", "")
    # a batch (OpenAI's Batch API): a generate job of a file of requests, so tagged
    line = {"custom_id": "r1", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "1 +"}}
    requests = app_client.post(
        "/v1/files", files={"file": ("b.jsonl", json.dumps(line).encode())}, data={"purpose": "batch"}, headers=owner
    )
    assert requests.status_code == 200, requests.text
    batch = {"file": requests.json()["id"], "endpoint": "/v1/completions"}
    made = app_client.post(
        "/v1/jobs",
        json={"kind": "generate", "model": "org/model", "batch": batch, "tags": ["openai:batches"]}
        | {"resources": {"pool": "objects-parked"}},
        headers=owner,
    )
    assert made.status_code == 201, made.text
    ids["batch_id"] = "batch_" + made.json()["id"].replace("-", "")
    # an OpenAI eval, a run of it (a grade job) and an output item of the run, as its worker would store one
    check = {"type": "string_check", "name": "same", "input": "{{sample.output_text}}", "reference": "{{item.a}}"}
    ev = app_client.post(
        "/v1/evals",
        json={
            "data_source_config": {"type": "custom", "item_schema": {}},
            "testing_criteria": [{**check, "operation": "eq"}],
        },
        headers=owner,
    )
    assert ev.status_code == 200, ev.text
    ids["eval_id"] = ev.json()["id"]
    rows = [{"item": {"a": "2"}, "sample": {"output_text": "2"}}]
    source = {"type": "file_content", "content": rows}
    run = app_client.post(
        f"/v1/evals/{ids['eval_id']}/runs", json={"data_source": {"type": "jsonl", "source": source}}, headers=owner
    )
    assert run.status_code == 200, run.text
    ids["run_id"] = run.json()["id"]
    from store.models import Sample

    with session_scope(get_settings().database.url) as s:
        sample = Sample(
            job_id=str(uuid.UUID(ids["run_id"].removeprefix("evalrun_"))), step=0, index=0, prompt="", completion="2"
        )
        s.add(sample)
        s.flush()
        ids["output_item_id"] = "outputitem_" + sample.id.replace("-", "")
    return ids


@contextlib.contextmanager
def overridden(**blocks: dict[str, Any]) -> Iterator[None]:
    """Change live settings of the in-process app (e.g. limits={'burst': 3}) and restore them."""
    from config.settings import get_settings

    settings = get_settings()
    saved = {(b, k): getattr(getattr(settings, b), k) for b, values in blocks.items() for k in values}
    try:
        for b, values in blocks.items():
            for k, v in values.items():
                setattr(getattr(settings, b), k, v)
        yield
    finally:
        for (b, k), v in saved.items():
            setattr(getattr(settings, b), k, v)


def project_jobs(app_client: Any, headers: dict[str, str]) -> list[dict[str, Any]]:
    r = app_client.get("/v1/jobs", headers=headers)
    if r.status_code == 429:  # the fuzzer can use up its key's request rate: wait as told, once
        time.sleep(float(r.headers.get("Retry-After", "1")))
        r = app_client.get("/v1/jobs", headers=headers)
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def db(app_client: Any) -> Any:
    from config.settings import get_settings
    from store.db import get_engine

    return get_engine(get_settings().database.url)
