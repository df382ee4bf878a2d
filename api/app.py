"""The FastAPI application: routers combined in one place, problem details, size limit, metrics."""

from __future__ import annotations

import gc
import re
import time
import uuid
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import JSONResponse
from prometheus_client import Counter, Histogram
from sqlalchemy.exc import DBAPIError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

from api import problems
from api.deps import CALLER_STATE, RATE_STATE, caller_for, finite_body, storable_query
from api.routers import (
    graders,
    health,
    jobs,
    keys,
    openai_batches,
    openai_evals,
    openai_files,
    openai_fine_tuning,
    openai_graders,
    openai_inference,
    openai_models,
    openai_responses,
    pipelines,
    scores,
    tinker,
    tinker_runs,
)
from api.web.router import router as web_router
from config.settings import get_settings

REQUESTS = Counter("mathrl_http_requests_total", "HTTP requests", ["method", "route", "status"])
LATENCY = Histogram(
    "mathrl_http_request_seconds",
    "HTTP request latency",
    ["method", "route"],
    buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)


BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class LimitsAndMetrics:
    """Pure ASGI middleware: a request with a body has its key checked before a byte of the body
    is read (every API route that takes a body needs a key), and its body is refused with a 413
    past `max_bytes`, by Content-Length or, for a chunked body, while it is read. Records
    Prometheus metrics."""

    def __init__(self, app: Any, max_bytes: int, upload_bytes: int, call_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.larger = {
            "/v1/files": upload_bytes + 64 * 1024,  # an upload may be as large as a file may, and its multipart framing
            "/api/v1/forward_backward": call_bytes,  # a Tinker batch's chunk (settings.sessions.max_call_bytes)
        }

    def _limit(self, scope: dict[str, Any]) -> int:
        return self.larger.get(_route_path(scope).rstrip("/"), self.max_bytes)

    def _too_large(self, limit: int) -> str:
        return f"{problems.TOO_LARGE} Limit: {limit} bytes."

    async def _authenticate(self, scope: dict[str, Any]) -> JSONResponse | None:
        """None with the caller left in the request's state, else the problem to answer."""
        authorization = Headers(scope=scope).get("authorization", "")
        client = (scope.get("client") or ("", 0))[0]
        try:
            caller = await caller_for(authorization, get_settings(), client, scope.setdefault("state", {}))
        except problems.Problem as p:
            return problems.problem_response(p.status, p.title, p.detail, scope["path"], p.errors, p.headers)
        except DBAPIError:
            return problems.problem_response(
                503, "Service unavailable", problems.DB_UNAVAILABLE, scope["path"], headers={"Retry-After": "5"}
            )
        scope.setdefault("state", {})[CALLER_STATE] = caller
        return None

    def _limited(self, receive: Any, limit: int) -> Any:
        """`receive` that counts body bytes and stops the request past the limit."""
        seen = 0

        async def wrapped() -> dict[str, Any]:
            nonlocal seen
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:  # FastAPI passes HTTPException through its body reading
                    raise HTTPException(413, self._too_large(limit))
            return message

        return wrapped

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _with_request_id(scope, send)
        length = dict(scope.get("headers", [])).get(b"content-length")
        refused = None
        limit = self._limit(scope)
        if length is not None and length.isdigit() and int(length) > limit:
            refused = problems.problem_response(413, "Request too large", self._too_large(limit), scope["path"])
        elif scope["method"] in BODY_METHODS and _route_path(scope).startswith("/v1/"):
            refused = await self._authenticate(scope)
        if refused is not None:
            await refused(scope, receive, send)
            return
        receive = self._limited(receive, limit)
        start = time.perf_counter()
        status = [500]

        async def send_wrapper(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            REQUESTS.labels(scope["method"], route, str(status[0])).inc()
            LATENCY.labels(scope["method"], route).observe(time.perf_counter() - start)


def _route_path(scope: dict[str, Any]) -> str:
    """The request's path as the routes know it: without the root path a proxy's prefix adds."""
    root = scope.get("root_path", "")
    path: str = scope["path"]
    return path[len(root) :] if root and path.startswith(root) else path


REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


def _with_request_id(scope: dict[str, Any], send: Any) -> Any:
    """`send` that adds x-request-id to the response: the client's (a proxy's) where it sent a sane one,
    else a new one; the openai SDK reads it into its errors (`e.request_id`) and responses."""
    given = dict(scope.get("headers", [])).get(b"x-request-id", b"")
    request_id = given if REQUEST_ID.match(given) else f"req_{uuid.uuid4().hex}".encode()

    async def send_with_id(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            extra = [(b"x-request-id", request_id)]
            left = scope.get("state", {}).get(RATE_STATE)  # a caller's bucket (api/deps.py caller_for)
            if left is not None:  # (a 429 carries its own: enforce raised before the state was kept)
                extra += [(k.encode(), v.encode()) for k, v in left.headers().items()]
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return send_with_id


def _tune_gc() -> None:
    """Fewer, cheaper collections: the objects alive after start-up never become garbage,
    so move them out of the collector's way (a gen-2 pass over them was a p99 spike)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)


def create_app() -> FastAPI:
    settings = get_settings()
    _tune_gc()
    app = FastAPI(
        title="mathrl",
        version="0.1.0",
        description="Train and evaluate math-reasoning language models with GRPO. "
        "Authenticate with `Authorization: Bearer <key>`.",
        dependencies=[Depends(storable_query), Depends(finite_body)],
    )
    routers: tuple[APIRouter, ...] = (
        jobs.router,
        pipelines.router,
        scores.router,
        graders.router,
        openai_graders.router,
        openai_files.router,
    )
    routers += (
        openai_fine_tuning.router,
        openai_evals.router,
        openai_models.router,
        openai_inference.router,
        openai_responses.router,
        openai_batches.router,
        keys.router,
        tinker.router,
        tinker_runs.router,
    )
    for r in (*routers, health.router):
        app.include_router(r)
    app.include_router(web_router)  # /ui: status pages (their data comes from the API above)
    problems.install(app)
    app.add_middleware(
        LimitsAndMetrics,
        max_bytes=settings.max_request_bytes,
        upload_bytes=settings.files.max_file_bytes,
        call_bytes=settings.sessions.max_call_bytes,
    )
    return app


app = create_app()
