"""The grading pool: a process that only runs python graders' sandboxes for the API and the
workers (`mathrl-server grading-pool`; the chart's `grading` block runs it as a Deployment of its
own). It is where user code runs on Kubernetes, away from everything worth stealing:

- it holds no database or broker credentials, no admin token and no service-account token: its
  one secret is the token its callers present (graders.pool_token);
- its pods deny all egress (a NetworkPolicy) and accept only the API's and the workers' pods;
- its root filesystem is read-only, and it may run under a sandbox runtime (runtimeClassName,
  e.g. gVisor);
- inside it each call is still sandboxed as on any machine (evaluator/sandbox.py), in the pool's
  own mode, never the caller's; where that cannot be made, /readyz and every call answer 503
  saying why, so the pod shows not ready instead of running code unguarded.

POST /v1/run {source, cases: [{sample, item}], limits} -> {results: [{score, error, detail}]}.
"""

from __future__ import annotations

import asyncio
import hmac
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from config.settings import Settings, get_settings
from evaluator.sandbox import SandboxLimits, SandboxUnavailable, isolation, run_python


class PoolLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cpu_seconds: int = Field(10, ge=1, le=600)
    memory_mb: int = Field(1024, ge=64, le=65536)
    file_mb: int = Field(16, ge=1, le=4096)
    processes: int = Field(64, ge=1, le=4096)
    wall_seconds: float = Field(30.0, gt=0, le=600)


class PoolCase(BaseModel):
    sample: dict[str, Any]
    item: dict[str, Any]


class PoolRun(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = Field(max_length=200_000)
    cases: list[PoolCase] = Field(max_length=10_000)
    limits: PoolLimits = Field(default_factory=PoolLimits)


def create_pool(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    graders = settings.graders
    mode = graders.python_sandbox
    slots = asyncio.Semaphore(graders.pool_concurrency)
    app = FastAPI(title="mathrl grading pool", docs_url=None, redoc_url=None, openapi_url=None)

    def _authorized(authorization: str | None) -> None:
        token = graders.pool_token or ""
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not token or not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, "a grading pool answers only its callers: send graders.pool_token")

    @app.get("/livez")
    def livez() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz() -> dict[str, str]:
        iso = isolation(mode)
        if iso.refused:
            raise HTTPException(503, iso.describe())
        return {"status": "ok", "sandbox": iso.describe()}

    @app.post("/v1/run")
    async def run(body: PoolRun, authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        _authorized(authorization)
        limits = SandboxLimits(**body.limits.model_dump(), mode=mode)
        cases = [(c.sample, c.item) for c in body.cases]
        async with slots:
            try:
                results = await run_in_threadpool(run_python, body.source, cases, limits)
            except SandboxUnavailable as e:
                raise HTTPException(503, str(e)) from None
        return {"results": [asdict(r) for r in results]}

    return app
