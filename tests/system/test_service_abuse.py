"""Abuse cases that need the real API and worker processes: keys never in their logs, open event
streams holding no database connection (the in-process cases: tests/unit/api/test_abuse.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import text

from tests.helpers.jobs import parked_eval


@pytest.mark.slow
def test_keys_never_in_the_logs(service: Any) -> None:
    import httpx

    secret = service.key()
    h = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=service.url, headers=h) as c:
        job = c.post("/v1/jobs", json=parked_eval())
        assert job.status_code == 201
        assert c.get(f"/v1/jobs/{job.json()['id']}").status_code == 200
        assert c.post("/v1/jobs", json={"kind": "eval", "model": "/etc"}).status_code == 422
        assert c.get("/v1/jobs", headers={"Authorization": f"Bearer {secret}-wrong"}).status_code == 401
        created = c.post("/v1/keys", json={"name": "to-revoke"}).json()
        assert c.delete(f"/v1/keys/{created['id']}").status_code == 204
        assert c.get("/v1/jobs", headers={"Authorization": f"Bearer {created['key']}"}).status_code == 401
        c.post(f"/v1/jobs/{job.json()['id']}/cancel")
    logs = {p.name: p.read_text(errors="replace") for p in service.logs.glob("*.log")}
    # the API process logs warnings and errors (no access log); the worker logs each job it runs
    assert "api.log" in logs and any(name.startswith("worker") and "ready." in t for name, t in logs.items())
    for name, content in logs.items():
        for s in (secret, created["key"]):
            assert s not in content, f"an API key appears in {name}"
            assert s[len("mrl_") :] not in content, f"an API key's secret part appears in {name}"


@pytest.mark.slow
def test_open_event_streams_hold_no_database_connection(service: Any, pg_url: str) -> None:
    """Issue 16.1: each SSE stream kept its request's session, idle in a transaction, for its
    whole life; 30 streams (the pool: 10 + 20 overflow) stalled every other request of the API."""
    import asyncio

    import httpx
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    streams = 60
    h = {"Authorization": f"Bearer {service.key()}"}
    job_id = httpx.post(f"{service.url}/v1/jobs", json=parked_eval(), headers=h).json()["id"]  # parked: never ends
    admin = create_engine(pg_url)

    def idle_in_transaction() -> int:
        with admin.connect() as c:
            return int(
                c.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d AND state = 'idle in transaction'"),
                    {"d": make_url(pg_url).database},
                ).scalar()
            )

    async def main() -> tuple[list[int], int, int]:
        statuses: list[int] = []
        limits = httpx.Limits(max_connections=streams + 10)
        async with httpx.AsyncClient(
            base_url=service.url, headers=h, limits=limits, timeout=httpx.Timeout(60, read=None)
        ) as c:

            async def follow() -> None:
                async with c.stream("GET", f"/v1/jobs/{job_id}/events/stream") as r:
                    statuses.append(r.status_code)
                    async for _ in r.aiter_lines():
                        pass

            tasks = [asyncio.create_task(follow()) for _ in range(streams)]
            deadline = time.monotonic() + 45
            while len(statuses) < streams and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(2)  # every stream has polled a few times
            held = max([await asyncio.to_thread(idle_in_transaction) for _ in range(5)])
            other = await c.get(f"/v1/jobs/{job_id}", timeout=10)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return statuses, held, other.status_code

    statuses, held, other = asyncio.run(main())
    admin.dispose()
    assert statuses == [200] * streams, statuses
    # before: every stream held one (30, the whole pool); now only polls caught between their two queries
    assert held <= 20, f"{held} connections idle in transaction with {streams} streams open"
    assert other == 200
