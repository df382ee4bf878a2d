"""The SDK: AsyncClient offers what Client offers (issue 20 found five calls missing), and
both work against the API (in-process here, so the calls are real routes, not mocks)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import httpx
import pytest

from mathrl import client as sdk
from tests.helpers.env import ADMIN_TOKEN

pytestmark = pytest.mark.quick

PAIRS = [
    (sdk.Jobs, sdk.AsyncJobs),
    (sdk.Pipelines, sdk.AsyncPipelines),
    (sdk.Scores, sdk.AsyncScores),
    (sdk.Keys, sdk.AsyncKeys),
]


def _methods(cls: type) -> dict[str, inspect.Signature]:
    return {n: inspect.signature(f) for n, f in vars(cls).items() if callable(f) and not n.startswith("_")}


@pytest.mark.parametrize(("sync", "async_"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_async_client_has_every_call_of_the_sync_one(sync: type, async_: type) -> None:
    want, have = _methods(sync), _methods(async_)
    assert sorted(want) == sorted(have), f"{async_.__name__} lacks {sorted(set(want) - set(have))}"
    for name, sig in want.items():
        assert list(sig.parameters) == list(have[name].parameters), (name, sig, have[name])


def _sync_client(app_client: Any, key: str) -> sdk.Client:
    """A Client whose HTTP goes to the in-process app (Starlette's TestClient is an httpx.Client)."""
    from fastapi.testclient import TestClient

    c = sdk.Client("http://testserver", api_key=key)
    c.http.close()
    c.http = TestClient(app_client.app, headers=c.headers)
    return c


def test_the_same_calls_work_sync_and_async(app_client: Any) -> None:
    key = _sync_client(app_client, ADMIN_TOKEN).keys.create(project="sdk-parity").key
    c = _sync_client(app_client, key)
    parked = {"kind": "eval", "model": "org/model", "limit": 5, "resources": {"gpus": 1}}
    job = c.jobs.create(parked)
    pipeline = c.pipelines.create({"name": "p", "jobs": {"a": parked}})
    made = c.keys.create(name="reader", scopes=["read"])
    c.keys.revoke(made.id)  # a 204 with no body
    with pytest.raises(TimeoutError, match=f"job {job.id} still queued"):
        c.jobs.wait(job.id, timeout=0, poll=0)

    async def run() -> dict[str, Any]:
        transport = httpx.ASGITransport(app=app_client.app)
        async with sdk.AsyncClient("http://test", api_key=key, transport=transport) as ac:
            out = {
                "samples": await ac.jobs.samples(job.id),
                "checkpoints": await ac.jobs.checkpoints(job.id),
                "pipelines": [p.id async for p in ac.pipelines.list()],
                "keys": [k.id for k in await ac.keys.list()],
            }
            with pytest.raises(TimeoutError, match=f"pipeline {pipeline.id} still queued"):
                await ac.pipelines.wait(pipeline.id, timeout=0, poll=0)
            await ac.jobs.cancel(job.id)
            await ac.pipelines.cancel(pipeline.id)
            out["waited"] = (await ac.pipelines.wait(pipeline.id, timeout=10, poll=0.1)).status
            another = await ac.keys.create(name="async", scopes=["read"])
            await ac.keys.revoke(another.id)
            out["revoked"] = next(k for k in await ac.keys.list() if k.id == another.id).revoked_at is not None
            return out

    out = asyncio.run(run())
    assert out["samples"] == c.jobs.samples(job.id) == [] and out["checkpoints"] == c.jobs.checkpoints(job.id) == []
    assert out["pipelines"] == [p.id for p in c.pipelines.list()] == [pipeline.id]
    assert made.id in out["keys"] and out["waited"] == "cancelled" and out["revoked"]
