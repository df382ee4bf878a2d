"""A Tinker call forwarded to its session job's process (api/routers/tinker.py), at the address and
with the token its `endpoints` row holds: `forward` (a 404 once the job ended, a 429 the SDK
retries before it serves), `forward_quietly` for a heartbeat, `model_call` for a call on a model,
and `in_flight`, the project's share of calls in flight (FORWARDS_PER_PROJECT)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext

import httpx
from fastapi import Request, Response
from fastapi.concurrency import run_in_threadpool

from api.deps import Caller
from api.problems import Problem
from api.project_gates import ProjectGates
from api.tinker.common import Located, json_body
from api.tinker.lookups import job_with_id, model_job
from config.settings import Settings
from mathrl.status import TERMINAL

TOKEN_HEADER = "X-Mathrl-Session-Token"  # trainer/session_server.py checks it
FORWARD_TIMEOUT = httpx.Timeout(40.0, connect=5.0)
# Calls one project has in flight to its session processes (a retrieve_future long-polls for up to
# 20 s): past it a call waits up to FORWARD_WAIT_SECONDS for one of them to end, then is a 429 (the
# SDK retries). Before, every project's calls shared one pool of httpx's default 100 connections, and
# one tenant holding 100 long polls made every other project's calls wait 40 s and fail with 503.
FORWARDS_PER_PROJECT = 64
FORWARD_WAIT_SECONDS = 10.0
_forwards = ProjectGates(FORWARDS_PER_PROJECT)
_client: httpx.AsyncClient | None = None


def _http() -> httpx.AsyncClient:
    global _client
    if _client is None:
        # no total cap: each project's share is capped (FORWARDS_PER_PROJECT) instead
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=100)
        _client = httpx.AsyncClient(timeout=FORWARD_TIMEOUT, trust_env=False, limits=limits)
    return _client


@asynccontextmanager
async def in_flight(project_id: str) -> AsyncIterator[None]:
    """One of the project's FORWARDS_PER_PROJECT calls in flight, held for the `async with` block."""
    gate = _forwards.of(project_id)
    try:
        await asyncio.wait_for(gate.acquire(), FORWARD_WAIT_SECONDS)
    except TimeoutError:
        detail = f"your project has {FORWARDS_PER_PROJECT} Tinker calls in flight, the most it may: retry shortly"
        raise Problem(429, "Too many calls in flight", detail, headers={"Retry-After": "1"}) from None
    try:
        yield
    finally:
        gate.release()


async def forward(
    settings: Settings, at: Located, op: str, body: bytes, content_type: str, counted: bool = True
) -> Response:
    """`op` on the job's process; a 404 once the job has ended, a 429 (the SDK retries) before it serves.
    `counted`: one of the project's calls in flight (`in_flight`); a heartbeat is not, so a project
    busy with long polls keeps its sessions alive."""
    job, where = at
    if job.status in TERMINAL:  # its endpoint row may outlive a process that crashed
        raise Problem(404, "Session ended", f"the session job {job.id} is {job.status}: start a new client")
    if where is None:
        raise Problem(429, "Session starting", f"the session job {job.id} is {job.status}: retry shortly")
    url, token = where
    try:
        async with in_flight(str(job.project_id)) if counted else nullcontext():
            headers = {"Content-Type": content_type, TOKEN_HEADER: token}
            r = await _http().post(f"{url}/{op}", content=body, headers=headers)
    except httpx.HTTPError as exc:
        fresh = await run_in_threadpool(job_with_id, settings, job.project_id, job.id)
        if fresh is None or fresh.job.status in TERMINAL:
            status = fresh.job.status if fresh is not None else "gone"
            raise Problem(404, "Session ended", f"the session job {job.id} is {status}: start a new client") from None
        raise Problem(503, "Session unreachable", f"the session job {job.id} did not answer: {exc}") from None
    return Response(r.content, r.status_code, media_type=r.headers.get("content-type", "application/json"))


async def forward_quietly(settings: Settings, at: Located, op: str) -> None:
    try:
        await forward(settings, at, op, b"{}", "application/json", counted=False)  # a heartbeat: never held up
    except Problem:
        pass  # not serving yet, or ended


async def model_call(op: str, caller: Caller, settings: Settings, request: Request) -> Response:
    body = await request.body()
    at = await model_job(settings, caller, str(json_body(body).get("model_id") or ""))
    return await forward(settings, at, op, body, "application/json")
