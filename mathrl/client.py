"""The Python SDK: `Client` (sync) and `AsyncClient`, over httpx.

from mathrl import Client
client = Client("http://127.0.0.1:8000", api_key="mrl_...")   # or MATHRL_URL / MATHRL_API_KEY
job = client.jobs.create({"kind": "eval", "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "limit": 50})
for event in client.jobs.follow(job.id):
    print(event.message)
print(client.scores.list(job_id=job.id))

Each call is written once, as an operation (mathrl/_transport.py): its requests and their retries,
the mapping of error answers to MathRLError's classes (NotFoundError, RateLimitError, ...: one per
status, mathrl.errors), the parsing into mathrl.schemas, the paging and the polling. The
resources below (`_Jobs`, ...) hold them; `Jobs` and `AsyncJobs` are the same operations as
methods of `Client` and awaitables of `AsyncClient`, which only carry out their steps.
"""

from __future__ import annotations

import builtins
import json
import os
import random
import time
import uuid
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from mathrl._transport import (
    AsyncResource,
    AsyncTransport,
    Close,
    Item,
    NextLine,
    Op,
    Open,
    Pager,
    ReadBody,
    RetryLimit,
    Send,
    Sleep,
    SyncResource,
    SyncTransport,
    call,
    collect,
    iterator,
)
from mathrl.errors import MathRLError as MathRLError  # the client raises it; imported from here too
from mathrl.errors import error_for
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
GRADER_WAIT = 20  # seconds the API holds a graders:run call for a worker's job (under the HTTP timeout)
# `after` for a stream that sends no past events, only the job's end: no seq is above it
_NO_EVENTS = 2**63 - 1
# the API sends a comment on a quiet stream every 15 s (api/job_wakeups.py KEEPALIVE_SECONDS)
_STREAM_QUIET_SECONDS = 20.0

M = TypeVar("M", bound=BaseModel)
Ended = TypeVar("Ended", JobResponse, PipelineResponse)


# The request layer: what every call sends and how it reads the answer, once for both clients.


def _raise_for(resp: httpx.Response) -> None:
    """The exception of an error answer's status (mathrl.errors.error_for: NotFoundError, RateLimitError, ...)."""
    if resp.status_code < 400:
        return
    try:
        problem = resp.json()
    except ValueError:
        problem = {"title": resp.reason_phrase, "detail": resp.text[:500]}
    raise error_for(resp.status_code, problem)


# Retries, as openai-python's: an answer that says `x-should-retry` is taken at its word (the API says
# false for a final answer: a conflict, a quota, a failed completion, api/problems.py final_answer);
# otherwise 408, 409, 429 and every 5xx are sent again, after Retry-After when it says at most a minute,
# else after 0.5 s, 1 s, 2 s ... (at most 8 s, less up to a quarter at random); so are a connection
# refused or cut and a timeout. A create carries an Idempotency-Key (one made here when the caller gives
# none), so a create sent twice makes one object.
RETRIED_STATUSES = (408, 409, 429)
_NETWORK_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


def should_retry(resp: httpx.Response) -> bool:
    hint = str(resp.headers.get("x-should-retry", "")).lower()
    if hint in ("true", "false"):
        return hint == "true"
    return resp.status_code in RETRIED_STATUSES or resp.status_code >= 500


def retry_delay(attempt: int, resp: httpx.Response | None) -> float:
    """Seconds before try `attempt + 1` (0: the first retry)."""
    if resp is not None:
        for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
            try:
                after = float(resp.headers.get(header, "")) * scale  # seconds (or ms) only, not a date
            except ValueError:
                continue
            if 0 <= after <= 60:
                return after
    return min(8.0, 0.5 * 2.0**attempt) * (1 - 0.25 * random.random())


def _sent(
    step: type[Send] | type[Open], method: str, url: str, kw: dict[str, Any], retry: bool = True
) -> Op[httpx.Response]:
    """The answer to a request (`Send`) or the head of one (`Open`), sent again as the rules above say."""
    retries = (yield RetryLimit()) if retry else 0
    attempt = 0
    while True:
        try:
            resp: httpx.Response = yield step(method, url, kw)
        except _NETWORK_ERRORS:
            if attempt >= retries:
                raise
            yield Sleep(retry_delay(attempt, None))
        else:
            if resp.status_code < 400 or attempt >= retries or not should_retry(resp):
                return resp
            if step is Open:
                yield Close(resp)
            yield Sleep(retry_delay(attempt, resp))
        attempt += 1


def _create_key(idempotency_key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": idempotency_key or f"mathrl-sdk-{uuid.uuid4().hex}"}


def _params(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def _spec_body(spec: Any) -> dict[str, Any]:
    if isinstance(spec, BaseModel):
        return spec.model_dump(mode="json", exclude_unset=True)
    return dict(spec)


def _as_dict(obj: Any) -> Any:
    return obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj


def _json(method: str, url: str, retry: bool = True, **kw: Any) -> Op[Any]:
    """A request; its answer's JSON (None for a 204: a revoke), or MathRLError for an error answer.
    `retry=False`: sent once (a create the API keeps no Idempotency-Key for)."""
    resp = yield from _sent(Send, method, url, kw, retry)
    _raise_for(resp)
    return resp.json() if resp.content else None


def _one(model: type[M], method: str, url: str, retry: bool = True, **kw: Any) -> Op[M]:
    return model.model_validate((yield from _json(method, url, retry, **kw)))


def _many(model: type[M], url: str, **kw: Any) -> Op[builtins.list[M]]:
    """A GET of one page: its rows."""
    page = yield from _json("GET", url, **kw)
    return [model.model_validate(row) for row in page["data"]]


def _pages(model: type[M], url: str, cursor: str = "cursor", **params: Any) -> Pager[M]:
    """Every row of a paged list: the next page (the answer's `next_cursor`, sent back as the
    `cursor` parameter) is fetched when the rows of the last are used up."""
    after = None
    while True:
        page = yield from _json("GET", url, params=_params(**params, **{cursor: after}))
        for row in page["data"]:
            yield Item(model.model_validate(row))
        if not (after := page["next_cursor"]):
            return


def _open(url: str, **kw: Any) -> Op[httpx.Response]:
    """A GET whose answer is read a line at a time (NextLine); MathRLError for an error answer."""
    resp = yield from _sent(Open, "GET", url, kw)
    if resp.status_code >= 400:
        yield ReadBody(resp)
        _raise_for(resp)
    return resp


def _until_ended(model: type[Ended], url: str, what: str, ident: str, timeout: float, poll: float) -> Op[Ended]:
    """Poll `url` until its status is terminal (raises TimeoutError)."""
    deadline = time.monotonic() + timeout
    while True:
        obj = yield from _one(model, "GET", url)
        if obj.status in TERMINAL_STATUSES:
            return obj
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} {ident} still {obj.status} after {timeout:.0f}s")
        yield Sleep(poll)


def _until_stream_ends(job_id: str, deadline: float) -> Op[None]:
    """Hold the job's event stream open until the API ends it (the job ended) or the deadline
    passes. Errors (the key's stream limit, a connection cut) end it early: the caller polls."""
    read = max(0.1, min(deadline - time.monotonic(), _STREAM_QUIET_SECONDS + 10))
    kw = {"params": {"after": _NO_EVENTS}, "timeout": httpx.Timeout(30.0, read=read)}
    resp: httpx.Response | None = None
    try:
        resp = yield Open("GET", f"/v1/jobs/{job_id}/events/stream", kw)
        if resp.status_code < 400:
            # keep-alive comments too: the deadline is checked on each
            while (yield NextLine(resp)) is not None and time.monotonic() <= deadline:
                pass
    except httpx.HTTPError:
        pass
    if resp is not None:
        yield Close(resp)


def _merge_series(series: builtins.list[MetricSeries]) -> builtins.list[MetricSeries]:
    """Metric pages (whole steps each) joined into one series per name, in step order."""
    points: dict[str, builtins.list[Any]] = {}
    for s in series:
        points.setdefault(s.name, []).extend(s.points)
    return [MetricSeries.model_validate({"name": k, "points": v}) for k, v in sorted(points.items())]


def _grader_body(grader: Any, items: builtins.list[dict[str, Any]], resources: Any) -> dict[str, Any]:
    body = {"grader": _as_dict(grader), "items": items}
    if resources is not None:
        body["resources"] = _as_dict(resources)
    return body


# The resources, each written once: `Client.jobs` is a Jobs, `AsyncClient.jobs` an AsyncJobs.


class _Jobs:
    @call
    def create(self, spec: Any, idempotency_key: str | None = None) -> Op[JobResponse]:
        """Submit a job. A retry sends the same Idempotency-Key (`idempotency_key`, or one made
        here): the service gives back the job the first try made."""
        return _one(JobResponse, "POST", "/v1/jobs", json=_spec_body(spec), headers=_create_key(idempotency_key))

    @iterator
    def list(
        self, kind: str | None = None, status: str | None = None, tag: str | None = None, page_size: int = 50
    ) -> Pager[JobResponse]:
        """Every matching job, newest first, fetching pages as the iterator advances."""
        return _pages(JobResponse, "/v1/jobs", kind=kind, status=status, tag=tag, limit=page_size)

    @call
    def retrieve(self, job_id: str) -> Op[JobResponse]:
        return _one(JobResponse, "GET", f"/v1/jobs/{job_id}")

    @call
    def cancel(self, job_id: str) -> Op[JobResponse]:
        return _one(JobResponse, "POST", f"/v1/jobs/{job_id}/cancel")

    @call
    def pause(self, job_id: str) -> Op[JobResponse]:
        """A queued job pauses at once; a running one after it saves a checkpoint (409 otherwise)."""
        return _one(JobResponse, "POST", f"/v1/jobs/{job_id}/pause")

    @call
    def resume(self, job_id: str) -> Op[JobResponse]:
        """A paused job is queued again and goes on from its newest checkpoint (409 otherwise)."""
        return _one(JobResponse, "POST", f"/v1/jobs/{job_id}/resume")

    @call
    def events(self, job_id: str, after: int | None = None, limit: int = 500) -> Op[builtins.list[EventResponse]]:
        return _many(EventResponse, f"/v1/jobs/{job_id}/events", params=_params(after=after, limit=limit))

    @iterator
    def follow(self, job_id: str, after: int | None = None, timeout: float | None = None) -> Pager[EventResponse]:
        """Events as they happen (Server-Sent Events) until the job ends."""
        timeouts = httpx.Timeout(timeout or 30.0, read=timeout)
        resp = yield from _open(f"/v1/jobs/{job_id}/events/stream", params=_params(after=after), timeout=timeouts)
        data: builtins.list[str] = []
        while (line := (yield NextLine(resp))) is not None:
            if line.startswith("data:"):
                data.append(line[5:].strip())
            elif line == "" and data:
                yield Item(EventResponse.model_validate(json.loads("\n".join(data))))
                data = []

    @call
    def metrics(self, job_id: str, name: str | None = None) -> Op[builtins.list[MetricSeries]]:
        """Every point of the job's series (the API pages them: this follows the pages)."""
        pages = _pages(MetricSeries, f"/v1/jobs/{job_id}/metrics", cursor="after_step", name=name)
        return _merge_series((yield from collect(pages)))

    @call
    def samples(
        self, job_id: str, step: int | None = None, limit: int = 100, cursor: str | None = None
    ) -> Op[builtins.list[SampleResponse]]:
        return _many(
            SampleResponse, f"/v1/jobs/{job_id}/samples", params=_params(step=step, limit=limit, cursor=cursor)
        )

    @call
    def checkpoints(self, job_id: str) -> Op[builtins.list[CheckpointResponse]]:
        return _many(CheckpointResponse, f"/v1/jobs/{job_id}/checkpoints")

    @call
    def results(self, job_id: str) -> Op[builtins.list[dict[str, Any]]]:
        """An eval job's per-item results: one dict per sample with prompt, completion and data
        (gold, extracted answer, correct, tokens, and the problem's subject/level where it has them)."""
        resp = yield from _open(f"/v1/jobs/{job_id}/results")
        rows = []
        while (line := (yield NextLine(resp))) is not None:
            if line.strip():
                rows.append(json.loads(line))
        return rows

    @call
    def wait(self, job_id: str, timeout: float = 3600.0, poll: float = 1.0) -> Op[JobResponse]:
        """Block until the job reaches a terminal status (raises TimeoutError). It follows the
        job's event stream, which the API ends when the job ends, so it returns as soon as the job
        does; where no stream opens (the key's stream limit reached, say) it polls every `poll` s."""
        deadline = time.monotonic() + timeout
        job = yield from _one(JobResponse, "GET", f"/v1/jobs/{job_id}")
        if job.status not in TERMINAL_STATUSES and timeout > 0:
            yield from _until_stream_ends(job_id, deadline)
        left = max(0.0, deadline - time.monotonic())
        return (yield from _until_ended(JobResponse, f"/v1/jobs/{job_id}", "job", job_id, left, poll))


class _Pipelines:
    """Several job specs in one submission; a step names an earlier step's output 'job:<step>'."""

    @call
    def create(self, spec: Any, idempotency_key: str | None = None) -> Op[PipelineResponse]:
        """Submit a pipeline; retried with one Idempotency-Key, as `jobs.create`."""
        headers = _create_key(idempotency_key)
        return _one(PipelineResponse, "POST", "/v1/pipelines", json=_spec_body(spec), headers=headers)

    @iterator
    def list(self, page_size: int = 20) -> Pager[PipelineResponse]:
        return _pages(PipelineResponse, "/v1/pipelines", limit=page_size)

    @call
    def retrieve(self, pipeline_id: str) -> Op[PipelineResponse]:
        return _one(PipelineResponse, "GET", f"/v1/pipelines/{pipeline_id}")

    @call
    def cancel(self, pipeline_id: str) -> Op[PipelineResponse]:
        return _one(PipelineResponse, "POST", f"/v1/pipelines/{pipeline_id}/cancel")

    @call
    def wait(self, pipeline_id: str, timeout: float = 3600.0, poll: float = 1.0) -> Op[PipelineResponse]:
        """Block until every job of the pipeline has ended (raises TimeoutError)."""
        url = f"/v1/pipelines/{pipeline_id}"
        return _until_ended(PipelineResponse, url, "pipeline", pipeline_id, timeout, poll)


class _Scores:
    @call
    def list(
        self, model: str | None = None, benchmark: str | None = None, job_id: str | None = None, limit: int = 200
    ) -> Op[builtins.list[ScoreResponse]]:
        params = _params(model=model, benchmark=benchmark, job_id=job_id, limit=limit)
        return _many(ScoreResponse, "/v1/scores", params=params)


class _Graders:
    @call
    def run(
        self,
        grader: Any,
        items: builtins.list[dict[str, Any]],
        resources: dict[str, Any] | None = None,
        timeout: float = 600.0,
        poll: float = 1.0,
    ) -> Op[GraderRunResponse]:
        """Score completions with a grader (a dict or a mathrl.graders model) without a training
        job: items are {completion, answer, prompt}. A grader with a reward model runs as a short
        job on a worker (`resources`: its pool); this waits for it up to `timeout` seconds."""
        body = _grader_body(grader, items, resources)
        deadline = time.monotonic() + timeout
        out = yield from _json("POST", "/v1/graders:run", json=body, params={"wait": GRADER_WAIT})
        while "data" not in out:  # 202: the grade job has not finished yet
            if time.monotonic() + poll > deadline:
                raise TimeoutError(f"grading job {out['job_id']} still {out['status']} after {timeout:.0f}s")
            yield Sleep(poll)
            out = yield from _json("GET", f"/v1/graders/runs/{out['job_id']}")
        return GraderRunResponse.model_validate(out)


class _Keys:
    @call
    def create(
        self,
        name: str | None = None,
        project: str | None = None,
        expires_in_days: int | None = None,
        admin_token: str | None = None,
        scopes: builtins.list[str] | None = None,
    ) -> Op[KeyCreated]:
        """scopes: of 'read', 'submit', 'keys' (default: the creating key's own)."""
        headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        body = _params(name=name, project=project, expires_in_days=expires_in_days, scopes=scopes)
        return _one(KeyCreated, "POST", "/v1/keys", retry=False, json=body, headers=headers)

    @call
    def list(self) -> Op[builtins.list[KeyResponse]]:
        """Your project's keys (prefixes, scopes, dates; never secrets)."""
        return _many(KeyResponse, "/v1/keys")

    @call
    def revoke(self, key_id: str) -> Op[None]:
        yield from _json("DELETE", f"/v1/keys/{key_id}")


# The two clients: the service's URL and key, and an httpx client that carries out the steps.


class _Base:
    def __init__(self, base_url: str | None, api_key: str | None) -> None:
        self.base_url = (base_url or os.environ.get("MATHRL_URL") or DEFAULT_URL).rstrip("/")
        key = api_key or os.environ.get("MATHRL_API_KEY")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}


class Client(_Base, SyncTransport):
    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        max_retries: int = 2,
    ) -> None:
        super().__init__(base_url, api_key)
        self.max_retries = max_retries
        self.http = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout, transport=transport)
        self.jobs = Jobs(self)
        self.pipelines = Pipelines(self)
        self.scores = Scores(self)
        self.graders = Graders(self)
        self.keys = Keys(self)

    def request(self, method: str, path: str, **kw: Any) -> Any:
        return self._run(_json(method, path, **kw))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Base, AsyncTransport):
    """The same calls as `Client`, awaitable. `client.jobs.follow` is an async iterator."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_retries: int = 2,
    ) -> None:
        super().__init__(base_url, api_key)
        self.max_retries = max_retries
        self.http = httpx.AsyncClient(
            base_url=self.base_url, headers=self.headers, timeout=timeout, transport=transport
        )
        self.jobs = AsyncJobs(self)
        self.pipelines = AsyncPipelines(self)
        self.scores = AsyncScores(self)
        self.graders = AsyncGraders(self)
        self.keys = AsyncKeys(self)

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        return await self._run(_json(method, path, **kw))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Jobs(_Jobs, SyncResource):
    """`Client.jobs`"""


class Pipelines(_Pipelines, SyncResource):
    """`Client.pipelines`: several job specs in one submission; a step names an earlier step's
    output 'job:<step>'."""


class Scores(_Scores, SyncResource):
    """`Client.scores`"""


class Graders(_Graders, SyncResource):
    """`Client.graders`"""


class Keys(_Keys, SyncResource):
    """`Client.keys`"""


class AsyncJobs(_Jobs, AsyncResource):
    """`AsyncClient.jobs`"""


class AsyncPipelines(_Pipelines, AsyncResource):
    """`AsyncClient.pipelines`: see `Pipelines`."""


class AsyncScores(_Scores, AsyncResource):
    """`AsyncClient.scores`"""


class AsyncGraders(_Graders, AsyncResource):
    """`AsyncClient.graders`"""


class AsyncKeys(_Keys, AsyncResource):
    """`AsyncClient.keys`"""
