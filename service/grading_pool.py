"""The grading pool (`mathrl-server grading-pool`; the chart's `grading` block): a process that only
runs python graders' sandboxes for the API and the workers, away from every credential
(`create_pool`).

- POST /v1/run {source, cases, limits} -> {results: [{score, error, detail}]}.
- POST /v1/tool {key, calls, limits} -> {results: [{output, error}]}: one job's python tool calls
  (evaluator/python_tool.py PoolTool) in a warm sandbox kept for its `key` (`ToolSandboxes`); POST
  /v1/tool/close {key} ends it.

Each call is sandboxed in the pool's own mode (evaluator/sandbox.py); where that cannot be made,
/readyz and every call answer 503. What its pods hold and reach: RELIABILITY.md,
"`evaluator/sandbox.py`: how the boundary is built"."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from config.settings import Settings, get_settings
from evaluator.python_tool import PythonTool, ToolLimits, ToolResult
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


class PoolToolLimits(BaseModel):
    """A tool call's limits, within the spec's bounds (mathrl/specs/tools.py)."""

    model_config = ConfigDict(extra="forbid")
    timeout_s: float = Field(5.0, gt=0, le=60)
    max_output_chars: int = Field(1024, ge=16, le=16384)
    memory_mb: int = Field(1024, ge=64, le=65536)


class PoolToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    code: str = Field(max_length=200_000)
    history: list[str] = Field(default_factory=list, max_length=16)  # a rollout's earlier calls (max_calls)


class PoolToolKey(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field(pattern=r"^[0-9a-f]{32}$")


class PoolToolRun(PoolToolKey):
    calls: list[PoolToolCall] = Field(max_length=4096)
    limits: PoolToolLimits = Field(default_factory=PoolToolLimits)


class ToolSandboxes:
    """The pool's warm tool sandboxes, one per job key and its limits; past `most`, the least recently
    used that no call is using is ended (its job's next batch starts it again). A sandbox in use is
    never ended under its call: `most` is passed by at most the calls running at once."""

    def __init__(self, most: int):
        self.most = most
        self.lock = threading.Lock()
        self.held: OrderedDict[tuple[str, ToolLimits], PythonTool] = OrderedDict()
        self.busy: dict[tuple[str, ToolLimits], int] = {}  # the calls using each now

    @contextlib.contextmanager
    def using(self, key: str, limits: ToolLimits) -> Iterator[PythonTool]:
        """The job's sandbox for one batch of its calls, held in use until the batch is done."""
        held = (key, limits)
        with self.lock:
            tool = self.held.pop(held, None) or PythonTool(limits)
            self.held[held] = tool
            self.busy[held] = self.busy.get(held, 0) + 1
            ended = self._over()
        self._end(ended)
        try:
            yield tool
        finally:
            with self.lock:
                self.busy[held] -= 1
                if not self.busy[held]:
                    del self.busy[held]
                ended = self._over()
            self._end(ended)

    def _over(self) -> list[PythonTool]:
        """The idle sandboxes past `most`, least recently used first, taken out (under the lock)."""
        ended: list[PythonTool] = []
        for held in list(self.held):
            if len(self.held) <= self.most:
                break
            if held not in self.busy:
                ended.append(self.held.pop(held))
        return ended

    @staticmethod
    def _end(tools: list[PythonTool]) -> None:
        for tool in tools:
            tool.close()

    def close(self, key: str | None = None) -> None:
        with self.lock:
            ended = [self.held.pop(k) for k in list(self.held) if key is None or k[0] == key]
        self._end(ended)


def create_pool(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    graders = settings.graders
    mode = graders.python_sandbox
    slots = asyncio.Semaphore(graders.pool_concurrency)
    sandboxes = ToolSandboxes(4 * graders.pool_concurrency)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        sandboxes.close()  # the tool's warm sandboxes end with the pool

    app = FastAPI(title="mathrl grading pool", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

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

    @app.post("/v1/tool")
    async def tool(body: PoolToolRun, authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        _authorized(authorization)
        if mode != "kernel":  # the calls need the sandbox's namespaces, as on a worker (python_tool.job_tool)
            raise HTTPException(503, f"the python tool runs only behind a kernel boundary; this pool runs {mode!r}")
        limits = ToolLimits(**body.limits.model_dump())
        calls = [(c.code, c.history) for c in body.calls]
        async with slots:
            try:

                def batch() -> list[ToolResult]:
                    with sandboxes.using(body.key, limits) as tool:
                        return tool.run(calls)

                results = await run_in_threadpool(batch)
            except SandboxUnavailable as e:
                raise HTTPException(503, str(e)) from None
        return {"results": [{"output": r.output, "error": r.error} for r in results]}

    @app.post("/v1/tool/close")
    def close_tool(body: PoolToolKey, authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        _authorized(authorization)
        sandboxes.close(body.key)
        return {"closed": body.key}

    return app
