"""The demo run again after an interrupted run (issue 44): what the earlier run left unfinished is
picked up or cancelled through the API, and the demo says which (service/demo.py `earlier_runs`).
The real routes, in-process; the jobs are parked (they ask for a GPU, and no worker runs here).
The whole story with real processes, a Ctrl-C and a closed terminal: tests/system/test_embedded.py."""

from __future__ import annotations

import io
import uuid
from typing import Any

import pytest
from rich.console import Console

from mathrl import client as sdk
from service.demo import earlier_runs
from tests.helpers.env import ADMIN_TOKEN

pytestmark = pytest.mark.quick

PARKED = {"kind": "eval", "model": "org/model", "limit": 5, "resources": {"gpus": 1}}
SPEC = {"name": "demo: parked", "tags": ["demo"], "jobs": {"a": PARKED, "b": {**PARKED, "limit": 6}}}


def _client(app_client: Any, key: str) -> sdk.Client:
    from fastapi.testclient import TestClient

    c = sdk.Client("http://testserver", api_key=key)
    c.http.close()
    c.http = TestClient(app_client.app, headers=c.headers)
    return c


def _demo_project(app_client: Any) -> sdk.Client:
    key = _client(app_client, ADMIN_TOKEN).keys.create(project=f"demo-{uuid.uuid4().hex[:8]}").key
    return _client(app_client, key)


def test_the_newest_unfinished_run_of_the_same_spec_is_picked_up_and_the_rest_cancelled(app_client: Any) -> None:
    c = _demo_project(app_client)
    older = c.pipelines.create(SPEC)  # two runs interrupted before this one
    other = c.pipelines.create({**SPEC, "name": "demo: another pipeline file"})
    broken = c.pipelines.create(SPEC)
    c.jobs.cancel(next(j.job_id for j in broken.jobs if j.step == "a"))  # 'b' still queued: unfinished
    ended = c.pipelines.cancel(c.pipelines.create(SPEC).id)
    newest = c.pipelines.create(SPEC)
    lone = c.jobs.create(PARKED)  # an eval demo's job
    out = io.StringIO()

    picked = earlier_runs(Console(file=out, width=300), c, dict(SPEC))

    said = out.getvalue()
    assert picked is not None and picked.id == newest.id, said
    status = {p.id: p.status for p in c.pipelines.list()}
    assert status[newest.id] == "queued"
    assert [pid for pid, s in status.items() if s not in ("cancelled", "failed", "succeeded")] == [newest.id]
    for p, why in (
        (older, f"the newer pipeline {newest.id}, of the same spec, is picked up instead"),
        (other, "a different spec"),
        (broken, "its step 'a' was cancelled"),
    ):
        assert status[p.id] == "cancelled"
        assert f"cancelled pipeline {p.id} from an earlier run: {why}" in said, said
    assert ended.id not in said  # ended already: left alone, not mentioned
    assert c.jobs.retrieve(lone.id).status == "cancelled"
    assert f"cancelled eval job {lone.id} from an earlier run" in said

    out = io.StringIO()  # the eval demo picks nothing up: the same pipeline is cancelled then
    assert earlier_runs(Console(file=out, width=300), c, None) is None
    assert c.pipelines.retrieve(newest.id).status == "cancelled"
    assert f"cancelled pipeline {newest.id} from an earlier run: a different spec" in out.getvalue()


def test_a_spec_the_api_would_refuse_leaves_the_earlier_run_alone(app_client: Any) -> None:
    c = _demo_project(app_client)
    earlier = c.pipelines.create(SPEC)
    out = io.StringIO()
    assert earlier_runs(Console(file=out), c, {"jobs": {}}) is None
    assert c.pipelines.retrieve(earlier.id).status == "queued" and out.getvalue() == ""
