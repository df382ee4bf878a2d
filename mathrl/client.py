"""The Python SDK: `Client` (sync) and `AsyncClient`, over httpx.

from mathrl import Client
client = Client("http://127.0.0.1:8000", api_key="mrl_...")   # or MATHRL_URL / MATHRL_API_KEY
job = client.jobs.create({"kind": "eval", "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "limit": 50})
for event in client.jobs.follow(job.id):
    print(event.message)
print(client.scores.list(job_id=job.id))
"""

from __future__ import annotations

import builtins
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
from pydantic import BaseModel

from mathrl.schemas import (
    TERMINAL_STATUSES,
    CheckpointResponse,
    EventResponse,
    GraderRunResponse,
    JobResponse,
    KeyCreated,
    KeyResponse,
    MetricSeries,
    PipelineResponse,
    SampleResponse,
    ScoreResponse,
)

DEFAULT_URL = "http://127.0.0.1:8000"


class MathRLError(Exception):
    """An error answer from the service, carrying its RFC 9457 problem details."""

    def __init__(self, status: int, problem: dict[str, Any]):
        self.status = status
        self.problem = problem
        self.title = problem.get("title", "error")
        self.detail = problem.get("detail", "")
        self.errors: list[dict[str, Any]] = problem.get("errors", [])
        lines = [f"{status} {self.title}: {self.detail}"]
        lines += [f"  {e.get('pointer', '')}: {e.get('detail', '')}" for e in self.errors]
        super().__init__("\n".join(lines))


def _spec_body(spec: Any) -> dict[str, Any]:
    if isinstance(spec, BaseModel):
        return spec.model_dump(mode="json", exclude_unset=True)
    return dict(spec)


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        problem = resp.json()
    except ValueError:
        problem = {"title": resp.reason_phrase, "detail": resp.text[:500]}
    raise MathRLError(resp.status_code, problem)


def _params(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def _wait(retrieve: Any, what: str, ident: str, timeout: float, poll: float) -> Any:
    """Poll `retrieve(ident)` until its status is terminal (raises TimeoutError)."""
    deadline = time.monotonic() + timeout
    while True:
        obj = retrieve(ident)
        if obj.status in TERMINAL_STATUSES:
            return obj
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} {ident} still {obj.status} after {timeout:.0f}s")
        time.sleep(poll)


# `after` for a stream that sends no past events, only the job's end: no seq is above it
_NO_EVENTS = 2**63 - 1
# the API sends a comment on a quiet stream every 15 s (api/job_wakeups.py KEEPALIVE_SECONDS)
_STREAM_QUIET_SECONDS = 20.0


def _stream_wait_args(job_id: str, deadline: float) -> dict[str, Any]:
    read = max(0.1, min(deadline - time.monotonic(), _STREAM_QUIET_SECONDS + 10))
    return {
        "method": "GET",
        "url": f"/v1/jobs/{job_id}/events/stream",
        "params": {"after": _NO_EVENTS},
        "timeout": httpx.Timeout(30.0, read=read),
    }


def _until_stream_ends(http: httpx.Client, job_id: str, deadline: float) -> None:
    """Hold the job's event stream open until the API ends it (the job ended) or the deadline
    passes. Errors (the key's stream limit, a connection cut) end it early: the caller polls."""
    try:
        with http.stream(**_stream_wait_args(job_id, deadline)) as resp:
            if resp.status_code >= 400:
                return
            for _ in resp.iter_lines():  # keep-alive comments too: the deadline is checked on each
                if time.monotonic() > deadline:
                    return
    except httpx.HTTPError:
        return


async def _until_stream_ends_async(http: httpx.AsyncClient, job_id: str, deadline: float) -> None:
    """`_until_stream_ends` for the AsyncClient."""
    try:
        async with http.stream(**_stream_wait_args(job_id, deadline)) as resp:
            if resp.status_code >= 400:
                return
            async for _ in resp.aiter_lines():
                if time.monotonic() > deadline:
                    return
    except httpx.HTTPError:
        return


async def _wait_async(retrieve: Any, what: str, ident: str, timeout: float, poll: float) -> Any:
    """`_wait` for the AsyncClient."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        obj = await retrieve(ident)
        if obj.status in TERMINAL_STATUSES:
            return obj
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} {ident} still {obj.status} after {timeout:.0f}s")
        await asyncio.sleep(poll)


def _merge_series(pages: list[list[dict[str, Any]]]) -> list[MetricSeries]:
    """Metric pages (whole steps each) joined into one series per name, in step order."""
    points: dict[str, list[Any]] = {}
    for page in pages:
        for series in page:
            points.setdefault(series["name"], []).extend(series["points"])
    return [MetricSeries.model_validate({"name": k, "points": v}) for k, v in sorted(points.items())]


def _parse_sse(lines: Iterator[str]) -> Iterator[EventResponse]:
    data: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            yield EventResponse.model_validate(json.loads("\n".join(data)))
            data = []


class _Base:
    def __init__(self, base_url: str | None, api_key: str | None) -> None:
        self.base_url = (base_url or os.environ.get("MATHRL_URL") or DEFAULT_URL).rstrip("/")
        key = api_key or os.environ.get("MATHRL_API_KEY")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}


class Client(_Base):
    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key)
        self.http = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout, transport=transport)
        self.jobs = Jobs(self)
        self.pipelines = Pipelines(self)
        self.scores = Scores(self)
        self.graders = Graders(self)
        self.keys = Keys(self)

    def request(self, method: str, path: str, **kw: Any) -> Any:
        resp = self.http.request(method, path, **kw)
        _raise_for(resp)
        return resp.json() if resp.content else None  # 204 (a revoke) has no body

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Jobs:
    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, spec: Any, idempotency_key: str | None = None) -> JobResponse:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return JobResponse.model_validate(self._c.request("POST", "/v1/jobs", json=_spec_body(spec), headers=headers))

    def list(
        self, kind: str | None = None, status: str | None = None, tag: str | None = None, page_size: int = 50
    ) -> Iterator[JobResponse]:
        """Every matching job, newest first, fetching pages as the iterator advances."""
        cursor: str | None = None
        while True:
            page = self._c.request(
                "GET", "/v1/jobs", params=_params(kind=kind, status=status, tag=tag, limit=page_size, cursor=cursor)
            )
            for row in page["data"]:
                yield JobResponse.model_validate(row)
            cursor = page["next_cursor"]
            if not cursor:
                return

    def retrieve(self, job_id: str) -> JobResponse:
        return JobResponse.model_validate(self._c.request("GET", f"/v1/jobs/{job_id}"))

    def cancel(self, job_id: str) -> JobResponse:
        return JobResponse.model_validate(self._c.request("POST", f"/v1/jobs/{job_id}/cancel"))

    def pause(self, job_id: str) -> JobResponse:
        """A queued job pauses at once; a running one after it saves a checkpoint (409 otherwise)."""
        return JobResponse.model_validate(self._c.request("POST", f"/v1/jobs/{job_id}/pause"))

    def resume(self, job_id: str) -> JobResponse:
        """A paused job is queued again and goes on from its newest checkpoint (409 otherwise)."""
        return JobResponse.model_validate(self._c.request("POST", f"/v1/jobs/{job_id}/resume"))

    def events(self, job_id: str, after: int | None = None, limit: int = 500) -> builtins.list[EventResponse]:
        page = self._c.request("GET", f"/v1/jobs/{job_id}/events", params=_params(after=after, limit=limit))
        return [EventResponse.model_validate(e) for e in page["data"]]

    def follow(self, job_id: str, after: int | None = None, timeout: float | None = None) -> Iterator[EventResponse]:
        """Events as they happen (Server-Sent Events) until the job ends."""
        with self._c.http.stream(
            "GET",
            f"/v1/jobs/{job_id}/events/stream",
            params=_params(after=after),
            timeout=httpx.Timeout(timeout or 30.0, read=timeout),
        ) as resp:
            if resp.status_code >= 400:
                resp.read()
                _raise_for(resp)
            yield from _parse_sse(resp.iter_lines())

    def metrics(self, job_id: str, name: str | None = None) -> builtins.list[MetricSeries]:
        """Every point of the job's series (the API pages them: this follows the pages)."""
        pages, after = [], None
        while True:
            data = self._c.request("GET", f"/v1/jobs/{job_id}/metrics", params=_params(name=name, after_step=after))
            pages.append(data["data"])
            if not (after := data["next_cursor"]):
                return _merge_series(pages)

    def samples(
        self, job_id: str, step: int | None = None, limit: int = 100, cursor: str | None = None
    ) -> builtins.list[SampleResponse]:
        data = self._c.request(
            "GET", f"/v1/jobs/{job_id}/samples", params=_params(step=step, limit=limit, cursor=cursor)
        )
        return [SampleResponse.model_validate(s) for s in data["data"]]

    def checkpoints(self, job_id: str) -> builtins.list[CheckpointResponse]:
        data = self._c.request("GET", f"/v1/jobs/{job_id}/checkpoints")
        return [CheckpointResponse.model_validate(s) for s in data["data"]]

    def results(self, job_id: str) -> builtins.list[dict[str, Any]]:
        """An eval job's per-item results: one dict per sample with prompt, completion and data
        (gold, extracted answer, correct, tokens, and the problem's subject/level where it has them)."""
        with self._c.http.stream("GET", f"/v1/jobs/{job_id}/results") as resp:
            if resp.status_code >= 400:
                resp.read()
                _raise_for(resp)
            return [json.loads(line) for line in resp.iter_lines() if line.strip()]

    def wait(self, job_id: str, timeout: float = 3600.0, poll: float = 1.0) -> JobResponse:
        """Block until the job reaches a terminal status (raises TimeoutError). It follows the
        job's event stream, which the API ends when the job ends, so it returns as soon as the job
        does; where no stream opens (the key's stream limit reached, say) it polls every `poll` s."""
        deadline = time.monotonic() + timeout
        job = self.retrieve(job_id)
        if job.status not in TERMINAL_STATUSES and timeout > 0:
            _until_stream_ends(self._c.http, job_id, deadline)
        return _wait(self.retrieve, "job", job_id, max(0.0, deadline - time.monotonic()), poll)  # type: ignore[no-any-return]


class Pipelines:
    """Several job specs in one submission; a step names an earlier step's output 'job:<step>'."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, spec: Any) -> PipelineResponse:
        return PipelineResponse.model_validate(self._c.request("POST", "/v1/pipelines", json=_spec_body(spec)))

    def list(self, page_size: int = 20) -> Iterator[PipelineResponse]:
        cursor: str | None = None
        while True:
            page = self._c.request("GET", "/v1/pipelines", params=_params(limit=page_size, cursor=cursor))
            for row in page["data"]:
                yield PipelineResponse.model_validate(row)
            cursor = page["next_cursor"]
            if not cursor:
                return

    def retrieve(self, pipeline_id: str) -> PipelineResponse:
        return PipelineResponse.model_validate(self._c.request("GET", f"/v1/pipelines/{pipeline_id}"))

    def cancel(self, pipeline_id: str) -> PipelineResponse:
        return PipelineResponse.model_validate(self._c.request("POST", f"/v1/pipelines/{pipeline_id}/cancel"))

    def wait(self, pipeline_id: str, timeout: float = 3600.0, poll: float = 1.0) -> PipelineResponse:
        """Block until every job of the pipeline has ended (raises TimeoutError)."""
        return _wait(self.retrieve, "pipeline", pipeline_id, timeout, poll)  # type: ignore[no-any-return]


class Scores:
    def __init__(self, client: Client) -> None:
        self._c = client

    def list(
        self, model: str | None = None, benchmark: str | None = None, job_id: str | None = None, limit: int = 200
    ) -> list[ScoreResponse]:
        data = self._c.request(
            "GET", "/v1/scores", params=_params(model=model, benchmark=benchmark, job_id=job_id, limit=limit)
        )
        return [ScoreResponse.model_validate(s) for s in data["data"]]


def _as_dict(obj: Any) -> Any:
    return obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj


GRADER_WAIT = 20  # seconds the API holds a graders:run call for a worker's job (under the HTTP timeout)


def _grader_body(grader: Any, items: builtins.list[dict[str, Any]], resources: Any) -> dict[str, Any]:
    body = {"grader": _as_dict(grader), "items": items}
    if resources is not None:
        body["resources"] = _as_dict(resources)
    return body


class Graders:
    def __init__(self, client: Client) -> None:
        self._c = client

    def run(
        self,
        grader: Any,
        items: builtins.list[dict[str, Any]],
        resources: dict[str, Any] | None = None,
        timeout: float = 600.0,
        poll: float = 1.0,
    ) -> GraderRunResponse:
        """Score completions with a grader (a dict or a mathrl.graders model) without a training
        job: items are {completion, answer, prompt}. A grader with a reward model runs as a short
        job on a worker (`resources`: its pool); this waits for it up to `timeout` seconds."""
        body = _grader_body(grader, items, resources)
        deadline = time.monotonic() + timeout
        out = self._c.request("POST", "/v1/graders:run", json=body, params={"wait": GRADER_WAIT})
        while "data" not in out:  # 202: the grade job has not finished yet
            if time.monotonic() + poll > deadline:
                raise TimeoutError(f"grading job {out['job_id']} still {out['status']} after {timeout:.0f}s")
            time.sleep(poll)
            out = self._c.request("GET", f"/v1/graders/runs/{out['job_id']}")
        return GraderRunResponse.model_validate(out)


class Keys:
    def __init__(self, client: Client) -> None:
        self._c = client

    def create(
        self,
        name: str | None = None,
        project: str | None = None,
        expires_in_days: int | None = None,
        admin_token: str | None = None,
        scopes: list[str] | None = None,
    ) -> KeyCreated:
        """scopes: of 'read', 'submit', 'keys' (default: the creating key's own)."""
        headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        body = _params(name=name, project=project, expires_in_days=expires_in_days, scopes=scopes)
        return KeyCreated.model_validate(self._c.request("POST", "/v1/keys", json=body, headers=headers))

    def list(self) -> list[KeyResponse]:
        """Your project's keys (prefixes, scopes, dates; never secrets)."""
        return [KeyResponse.model_validate(k) for k in self._c.request("GET", "/v1/keys")["data"]]

    def revoke(self, key_id: str) -> None:
        self._c.request("DELETE", f"/v1/keys/{key_id}")


class AsyncClient(_Base):
    """The same calls as `Client`, awaitable. `client.jobs.follow` is an async iterator."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key)
        self.http = httpx.AsyncClient(
            base_url=self.base_url, headers=self.headers, timeout=timeout, transport=transport
        )
        self.jobs = AsyncJobs(self)
        self.pipelines = AsyncPipelines(self)
        self.scores = AsyncScores(self)
        self.graders = AsyncGraders(self)
        self.keys = AsyncKeys(self)

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        resp = await self.http.request(method, path, **kw)
        _raise_for(resp)
        return resp.json() if resp.content else None  # 204 (a revoke) has no body

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncJobs:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(self, spec: Any, idempotency_key: str | None = None) -> JobResponse:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return JobResponse.model_validate(
            await self._c.request("POST", "/v1/jobs", json=_spec_body(spec), headers=headers)
        )

    async def list(
        self, kind: str | None = None, status: str | None = None, tag: str | None = None, page_size: int = 50
    ) -> AsyncIterator[JobResponse]:
        cursor: str | None = None
        while True:
            page = await self._c.request(
                "GET", "/v1/jobs", params=_params(kind=kind, status=status, tag=tag, limit=page_size, cursor=cursor)
            )
            for row in page["data"]:
                yield JobResponse.model_validate(row)
            cursor = page["next_cursor"]
            if not cursor:
                return

    async def retrieve(self, job_id: str) -> JobResponse:
        return JobResponse.model_validate(await self._c.request("GET", f"/v1/jobs/{job_id}"))

    async def cancel(self, job_id: str) -> JobResponse:
        return JobResponse.model_validate(await self._c.request("POST", f"/v1/jobs/{job_id}/cancel"))

    async def pause(self, job_id: str) -> JobResponse:
        return JobResponse.model_validate(await self._c.request("POST", f"/v1/jobs/{job_id}/pause"))

    async def resume(self, job_id: str) -> JobResponse:
        return JobResponse.model_validate(await self._c.request("POST", f"/v1/jobs/{job_id}/resume"))

    async def events(self, job_id: str, after: int | None = None, limit: int = 500) -> builtins.list[EventResponse]:
        page = await self._c.request("GET", f"/v1/jobs/{job_id}/events", params=_params(after=after, limit=limit))
        return [EventResponse.model_validate(e) for e in page["data"]]

    async def follow(
        self, job_id: str, after: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[EventResponse]:
        """Events as they happen (Server-Sent Events) until the job ends."""
        async with self._c.http.stream(
            "GET",
            f"/v1/jobs/{job_id}/events/stream",
            params=_params(after=after),
            timeout=httpx.Timeout(timeout or 30.0, read=timeout),
        ) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                _raise_for(resp)
            data: list[str] = []
            async for line in resp.aiter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].strip())
                elif line == "" and data:
                    yield EventResponse.model_validate(json.loads("\n".join(data)))
                    data = []

    async def metrics(self, job_id: str, name: str | None = None) -> builtins.list[MetricSeries]:
        """Every point of the job's series (the API pages them: this follows the pages)."""
        pages, after = [], None
        while True:
            data = await self._c.request(
                "GET", f"/v1/jobs/{job_id}/metrics", params=_params(name=name, after_step=after)
            )
            pages.append(data["data"])
            if not (after := data["next_cursor"]):
                return _merge_series(pages)

    async def samples(
        self, job_id: str, step: int | None = None, limit: int = 100, cursor: str | None = None
    ) -> builtins.list[SampleResponse]:
        data = await self._c.request(
            "GET", f"/v1/jobs/{job_id}/samples", params=_params(step=step, limit=limit, cursor=cursor)
        )
        return [SampleResponse.model_validate(s) for s in data["data"]]

    async def checkpoints(self, job_id: str) -> builtins.list[CheckpointResponse]:
        data = await self._c.request("GET", f"/v1/jobs/{job_id}/checkpoints")
        return [CheckpointResponse.model_validate(s) for s in data["data"]]

    async def results(self, job_id: str) -> builtins.list[dict[str, Any]]:
        """An eval job's per-item results (see `Client.jobs.results`)."""
        async with self._c.http.stream("GET", f"/v1/jobs/{job_id}/results") as resp:
            if resp.status_code >= 400:
                await resp.aread()
                _raise_for(resp)
            return [json.loads(line) async for line in resp.aiter_lines() if line.strip()]

    async def wait(self, job_id: str, timeout: float = 3600.0, poll: float = 1.0) -> JobResponse:
        """`Client.jobs.wait`: follows the job's event stream until the job ends, else polls."""
        deadline = time.monotonic() + timeout
        job = await self.retrieve(job_id)
        if job.status not in TERMINAL_STATUSES and timeout > 0:
            await _until_stream_ends_async(self._c.http, job_id, deadline)
        return await _wait_async(self.retrieve, "job", job_id, max(0.0, deadline - time.monotonic()), poll)  # type: ignore[no-any-return]


class AsyncPipelines:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(self, spec: Any) -> PipelineResponse:
        return PipelineResponse.model_validate(await self._c.request("POST", "/v1/pipelines", json=_spec_body(spec)))

    async def retrieve(self, pipeline_id: str) -> PipelineResponse:
        return PipelineResponse.model_validate(await self._c.request("GET", f"/v1/pipelines/{pipeline_id}"))

    async def cancel(self, pipeline_id: str) -> PipelineResponse:
        return PipelineResponse.model_validate(await self._c.request("POST", f"/v1/pipelines/{pipeline_id}/cancel"))

    async def list(self, page_size: int = 20) -> AsyncIterator[PipelineResponse]:
        cursor: str | None = None
        while True:
            page = await self._c.request("GET", "/v1/pipelines", params=_params(limit=page_size, cursor=cursor))
            for row in page["data"]:
                yield PipelineResponse.model_validate(row)
            cursor = page["next_cursor"]
            if not cursor:
                return

    async def wait(self, pipeline_id: str, timeout: float = 3600.0, poll: float = 1.0) -> PipelineResponse:
        """Wait until every job of the pipeline has ended (raises TimeoutError)."""
        return await _wait_async(self.retrieve, "pipeline", pipeline_id, timeout, poll)  # type: ignore[no-any-return]


class AsyncScores:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(
        self, model: str | None = None, benchmark: str | None = None, job_id: str | None = None, limit: int = 200
    ) -> list[ScoreResponse]:
        data = await self._c.request(
            "GET", "/v1/scores", params=_params(model=model, benchmark=benchmark, job_id=job_id, limit=limit)
        )
        return [ScoreResponse.model_validate(s) for s in data["data"]]


class AsyncGraders:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def run(
        self,
        grader: Any,
        items: builtins.list[dict[str, Any]],
        resources: dict[str, Any] | None = None,
        timeout: float = 600.0,
        poll: float = 1.0,
    ) -> GraderRunResponse:
        """Score completions with a grader without a training job (see Graders.run)."""
        import asyncio

        body = _grader_body(grader, items, resources)
        deadline = time.monotonic() + timeout
        out = await self._c.request("POST", "/v1/graders:run", json=body, params={"wait": GRADER_WAIT})
        while "data" not in out:
            if time.monotonic() + poll > deadline:
                raise TimeoutError(f"grading job {out['job_id']} still {out['status']} after {timeout:.0f}s")
            await asyncio.sleep(poll)
            out = await self._c.request("GET", f"/v1/graders/runs/{out['job_id']}")
        return GraderRunResponse.model_validate(out)


class AsyncKeys:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self,
        name: str | None = None,
        project: str | None = None,
        expires_in_days: int | None = None,
        admin_token: str | None = None,
        scopes: list[str] | None = None,
    ) -> KeyCreated:
        """scopes: of 'read', 'submit', 'keys' (default: the creating key's own)."""
        headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        body = _params(name=name, project=project, expires_in_days=expires_in_days, scopes=scopes)
        return KeyCreated.model_validate(await self._c.request("POST", "/v1/keys", json=body, headers=headers))

    async def list(self) -> list[KeyResponse]:
        return [KeyResponse.model_validate(k) for k in (await self._c.request("GET", "/v1/keys"))["data"]]

    async def revoke(self, key_id: str) -> None:
        await self._c.request("DELETE", f"/v1/keys/{key_id}")
