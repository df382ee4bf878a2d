"""The Python SDK: `Client` (sync) and `AsyncClient`, over httpx.

from mathrl import Client
client = Client("http://127.0.0.1:8000", api_key="mrl_...")   # or MATHRL_URL / MATHRL_API_KEY
job = client.jobs.create({"kind": "eval", "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "limit": 50})
for event in client.jobs.follow(job.id):
    print(event.message)
print(client.scores.list(job_id=job.id))

Each call is written once, as an operation (mathrl/_transport.py): its requests and their retries,
the mapping of error answers to MathRLError's classes (NotFoundError, RateLimitError, ...: one per
status, mathrl.errors), the parsing into mathrl.schemas, the paging and the polling (the request
layer: mathrl/_requests.py). The
resources below (`_Jobs`, ...) hold them; `Jobs` and `AsyncJobs` are the same operations as
methods of `Client` and awaitables of `AsyncClient`, which only carry out their steps.
"""

from __future__ import annotations

import builtins
import json
import os
import time
from typing import Any

import httpx

from mathrl._requests import RETRIED_STATUSES as RETRIED_STATUSES  # the retry rules, public here before
from mathrl._requests import (
    as_dict,
    create_key,
    json_answer,
    many,
    one,
    open_lines,
    pages,
    query,
    spec_body,
    until_ended,
    until_stream_ends,
)
from mathrl._requests import retry_delay as retry_delay
from mathrl._requests import should_retry as should_retry
from mathrl._transport import (
    AsyncResource,
    AsyncTransport,
    Item,
    NextLine,
    Op,
    Pager,
    Sleep,
    SyncResource,
    SyncTransport,
    call,
    collect,
    iterator,
)
from mathrl.errors import MathRLError as MathRLError  # the client raises it; imported from here too
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


def _merge_series(series: builtins.list[MetricSeries]) -> builtins.list[MetricSeries]:
    """Metric pages (whole steps each) joined into one series per name, in step order."""
    points: dict[str, builtins.list[Any]] = {}
    for s in series:
        points.setdefault(s.name, []).extend(s.points)
    return [MetricSeries.model_validate({"name": k, "points": v}) for k, v in sorted(points.items())]


def _grader_body(grader: Any, items: builtins.list[dict[str, Any]], resources: Any) -> dict[str, Any]:
    body = {"grader": as_dict(grader), "items": items}
    if resources is not None:
        body["resources"] = as_dict(resources)
    return body


# The resources, each written once: `Client.jobs` is a Jobs, `AsyncClient.jobs` an AsyncJobs.


class _Jobs:
    @call
    def create(self, spec: Any, idempotency_key: str | None = None) -> Op[JobResponse]:
        """Submit a job. A retry sends the same Idempotency-Key (`idempotency_key`, or one made
        here): the service gives back the job the first try made."""
        return one(JobResponse, "POST", "/v1/jobs", json=spec_body(spec), headers=create_key(idempotency_key))

    @iterator
    def list(
        self, kind: str | None = None, status: str | None = None, tag: str | None = None, page_size: int = 50
    ) -> Pager[JobResponse]:
        """Every matching job, newest first, fetching pages as the iterator advances."""
        return pages(JobResponse, "/v1/jobs", kind=kind, status=status, tag=tag, limit=page_size)

    @call
    def retrieve(self, job_id: str) -> Op[JobResponse]:
        return one(JobResponse, "GET", f"/v1/jobs/{job_id}")

    @call
    def cancel(self, job_id: str) -> Op[JobResponse]:
        return one(JobResponse, "POST", f"/v1/jobs/{job_id}/cancel")

    @call
    def pause(self, job_id: str) -> Op[JobResponse]:
        """A queued job pauses at once; a running one after it saves a checkpoint (409 otherwise)."""
        return one(JobResponse, "POST", f"/v1/jobs/{job_id}/pause")

    @call
    def resume(self, job_id: str) -> Op[JobResponse]:
        """A paused job is queued again and goes on from its newest checkpoint (409 otherwise)."""
        return one(JobResponse, "POST", f"/v1/jobs/{job_id}/resume")

    @call
    def events(self, job_id: str, after: int | None = None, limit: int = 500) -> Op[builtins.list[EventResponse]]:
        return many(EventResponse, f"/v1/jobs/{job_id}/events", params=query(after=after, limit=limit))

    @iterator
    def follow(self, job_id: str, after: int | None = None, timeout: float | None = None) -> Pager[EventResponse]:
        """Events as they happen (Server-Sent Events) until the job ends."""
        timeouts = httpx.Timeout(timeout or 30.0, read=timeout)
        resp = yield from open_lines(f"/v1/jobs/{job_id}/events/stream", params=query(after=after), timeout=timeouts)
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
        series = pages(MetricSeries, f"/v1/jobs/{job_id}/metrics", cursor="after_step", name=name)
        return _merge_series((yield from collect(series)))

    @call
    def samples(
        self, job_id: str, step: int | None = None, limit: int = 100, cursor: str | None = None
    ) -> Op[builtins.list[SampleResponse]]:
        return many(SampleResponse, f"/v1/jobs/{job_id}/samples", params=query(step=step, limit=limit, cursor=cursor))

    @call
    def checkpoints(self, job_id: str) -> Op[builtins.list[CheckpointResponse]]:
        return many(CheckpointResponse, f"/v1/jobs/{job_id}/checkpoints")

    @call
    def results(self, job_id: str) -> Op[builtins.list[dict[str, Any]]]:
        """An eval job's per-item results: one dict per sample with prompt, completion and data
        (gold, extracted answer, correct, tokens, and the problem's subject/level where it has them)."""
        resp = yield from open_lines(f"/v1/jobs/{job_id}/results")
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
        job = yield from one(JobResponse, "GET", f"/v1/jobs/{job_id}")
        if job.status not in TERMINAL_STATUSES and timeout > 0:
            yield from until_stream_ends(job_id, deadline)
        left = max(0.0, deadline - time.monotonic())
        return (yield from until_ended(JobResponse, f"/v1/jobs/{job_id}", "job", job_id, left, poll))


class _Pipelines:
    """Several job specs in one submission; a step names an earlier step's output 'job:<step>'."""

    @call
    def create(self, spec: Any, idempotency_key: str | None = None) -> Op[PipelineResponse]:
        """Submit a pipeline; retried with one Idempotency-Key, as `jobs.create`."""
        headers = create_key(idempotency_key)
        return one(PipelineResponse, "POST", "/v1/pipelines", json=spec_body(spec), headers=headers)

    @iterator
    def list(self, page_size: int = 20) -> Pager[PipelineResponse]:
        return pages(PipelineResponse, "/v1/pipelines", limit=page_size)

    @call
    def retrieve(self, pipeline_id: str) -> Op[PipelineResponse]:
        return one(PipelineResponse, "GET", f"/v1/pipelines/{pipeline_id}")

    @call
    def cancel(self, pipeline_id: str) -> Op[PipelineResponse]:
        return one(PipelineResponse, "POST", f"/v1/pipelines/{pipeline_id}/cancel")

    @call
    def wait(self, pipeline_id: str, timeout: float = 3600.0, poll: float = 1.0) -> Op[PipelineResponse]:
        """Block until every job of the pipeline has ended (raises TimeoutError)."""
        url = f"/v1/pipelines/{pipeline_id}"
        return until_ended(PipelineResponse, url, "pipeline", pipeline_id, timeout, poll)


class _Scores:
    @call
    def list(
        self, model: str | None = None, benchmark: str | None = None, job_id: str | None = None, limit: int = 200
    ) -> Op[builtins.list[ScoreResponse]]:
        params = query(model=model, benchmark=benchmark, job_id=job_id, limit=limit)
        return many(ScoreResponse, "/v1/scores", params=params)


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
        out = yield from json_answer("POST", "/v1/graders:run", json=body, params={"wait": GRADER_WAIT})
        while "data" not in out:  # 202: the grade job has not finished yet
            if time.monotonic() + poll > deadline:
                raise TimeoutError(f"grading job {out['job_id']} still {out['status']} after {timeout:.0f}s")
            yield Sleep(poll)
            out = yield from json_answer("GET", f"/v1/graders/runs/{out['job_id']}")
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
        body = query(name=name, project=project, expires_in_days=expires_in_days, scopes=scopes)
        return one(KeyCreated, "POST", "/v1/keys", retry=False, json=body, headers=headers)

    @call
    def list(self) -> Op[builtins.list[KeyResponse]]:
        """Your project's keys (prefixes, scopes, dates; never secrets)."""
        return many(KeyResponse, "/v1/keys")

    @call
    def revoke(self, key_id: str) -> Op[None]:
        yield from json_answer("DELETE", f"/v1/keys/{key_id}")


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
        return self._run(json_answer(method, path, **kw))

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
        return await self._run(json_answer(method, path, **kw))

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
