"""A completion call's generate job (a chat completion's, a completion's, a response's: the routes of
api/routers/openai_inference.py and openai_responses.py): submitted under the project's quotas
(`submit_generation`, a call over them a 429 to retry), waited for within
fine_tuning.inference_timeout_seconds and the client's own read timeout (`wait_answer`), or followed
as it streams (`FollowedCall`); its answers read back (`choices_of`). A call that runs out of time,
or whose client went away, cancels its job."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from sqlalchemy import select

from api.admission import QuotaProblem
from api.job_wakeups import KEEPALIVE_SECONDS  # a quiet stream sends a comment line this often, as event streams do
from api.openai.models import default_budget, sampled_model
from api.problems import Problem, validation_errors
from api.submit import admit, commit_and_dispatch, job_row
from config.settings import Settings
from mathrl.specs import GenerateSpec
from mathrl.status import WAIT_ENDS
from store.db import get_sessionmaker
from store.jobs import request_cancel
from store.models import Event, Job, Sample

TAG = "openai:inference"
POLL_SECONDS = 0.2
QUOTA_RETRY_SECONDS = 2  # a completion call over its project's active-jobs quota: try again this soon

# what a call's route answers besides its object (its `responses` in the API's schema)
RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "The model is not an 'ft:' model of your project (or not finished)."},
    422: {"description": "The request is invalid (the detail names the field)."},
    429: {"description": "Over the project's quota of active jobs."},
    502: {"description": "The worker could not answer (its job failed; the detail says why)."},
    504: {"description": "No answer within fine_tuning.inference_timeout_seconds (the job is cancelled)."},
}


def submit_generation(
    project_id: str, settings: Settings, model: str, fields: dict[str, Any], openai: dict[str, Any] | None = None
) -> str:
    """The generate job of one call (its id); `openai`: what the call's route keeps of its request
    in the job's config (a response's turns, say)."""
    with get_sessionmaker(settings.database.url)() as session:
        ref = sampled_model(session, project_id, settings, model)
        if fields["max_tokens"] is None:
            fields = {**fields, "max_tokens": default_budget(session, ref)}
        try:
            spec = GenerateSpec(model=ref, **{k: v for k, v in fields.items() if v is not None})
        except ValidationError as exc:
            err = validation_errors(exc.errors())[0]
            raise Problem.at(_as_requested(str(err["pointer"])), err["detail"]) from None
        try:
            config = admit({"": spec}, settings)[""]
        except Problem as exc:  # (a model whose chat template has no tools, say)
            err = (exc.errors or [{}])[0]
            if "pointer" not in err:
                raise
            raise Problem.at(_as_requested(str(err["pointer"])), str(err["detail"]), exc.title) from None
        if openai is not None:
            config.openai = openai
        job = job_row(project_id, spec, config, settings)
        session.add(job)
        where = f"/v1/{'chat/completions' if spec.messages is not None else 'completions'}"
        where = "/v1/responses" if spec.name == "responses" else where
        try:
            commit_and_dispatch(session, settings, project_id, [(job, f"queued on '{job.queue}' by POST {where}")])
        except QuotaProblem as e:
            # each call is a job: a burst of calls (asyncio.gather) meets the active-jobs quota, and a slot
            # frees within seconds. A rate limit the SDK retries after Retry-After, not a final quota.
            raise Problem(
                429, "Too many requests", f"{e.detail} (each completion call is a job of your project)",
                e.errors, {"Retry-After": str(QUOTA_RETRY_SECONDS)},
            ) from None  # fmt: skip
        return str(job.id)


def _as_requested(pointer: str) -> str:
    """A generate job's field as OpenAI's request names it (its functions are the request's tools)."""
    return "/tools" + pointer.removeprefix("/function_tools") if pointer.startswith("/function_tools") else pointer


def _status(settings: Settings, job_id: str) -> tuple[str, str | None]:
    with get_sessionmaker(settings.database.url)() as session:
        job = session.get(Job, job_id)
        assert job is not None  # the job this request submitted
        return job.status, job.error


def cancel_call(settings: Settings, job_id: str) -> None:
    with get_sessionmaker(settings.database.url)() as session:
        job = session.get(Job, job_id)
        if job is not None:
            request_cancel(session, job)


def wait_limit(settings: Settings, request: Request) -> float:
    """How long a completion call waits: fine_tuning.inference_timeout_seconds, under the client's own."""
    return under_client_timeout(request, float(settings.fine_tuning.inference_timeout_seconds))


def under_client_timeout(request: Request, limit: float) -> float:
    """`limit`, and under the client's own read timeout where the openai SDK says it
    (x-stainless-read-timeout), so that the client reads a 504 it does not retry instead of timing out
    itself and sending the call again as a new job."""
    try:
        theirs = float(request.headers.get("x-stainless-read-timeout", "inf"))
    except ValueError:
        return limit
    return max(1.0, min(limit, theirs - 5.0)) if math.isfinite(theirs) else limit


async def wait_answer(settings: Settings, job_id: str, request: Request) -> None:
    """Back once the job has succeeded; a 504 (job cancelled) past the wait limit, a 502 if it did not
    succeed. A client that has gone away cancels the job: no one would read its answer."""
    limit = wait_limit(settings, request)
    deadline = time.monotonic() + limit
    while True:
        status, error = await run_in_threadpool(_status, settings, job_id)
        if status in WAIT_ENDS:
            break
        if await request.is_disconnected():
            await run_in_threadpool(cancel_call, settings, job_id)
            raise Problem(499, "Client closed request", f"job {job_id} cancelled: the client went away")
        if time.monotonic() >= deadline:
            await run_in_threadpool(cancel_call, settings, job_id)
            raise Problem(504, "Completion timed out", f"job {job_id} did not answer in {limit:g} s: cancelled")
        await asyncio.sleep(POLL_SECONDS)
    if status == "paused":
        raise Problem(409, "Completion paused", f"job {job_id} was paused before it answered: call again")
    if status != "succeeded":
        raise Problem(502, "Completion failed", f"job {job_id} {status}: {error or 'no error recorded'}")


def choices_of(settings: Settings, job_id: str) -> list[dict[str, Any]]:
    with get_sessionmaker(settings.database.url)() as session:
        rows = session.scalars(select(Sample).where(Sample.job_id == job_id).order_by(Sample.index)).all()
        return [{"text": r.completion, **(r.data or {})} for r in rows]


def progress_of(
    settings: Settings, job_id: str, after: int
) -> tuple[str, str | None, list[tuple[int, dict[str, Any]]]]:
    """The job's status and error, then its 'delta' events after `after`: one session a poll
    (read in that order, so a job seen ended has all its deltas read too)."""
    with get_sessionmaker(settings.database.url)() as session:
        job = session.get(Job, job_id)
        assert job is not None  # the job this request submitted
        q = select(Event.seq, Event.data).where(Event.job_id == job_id, Event.type == "delta", Event.seq > after)
        deltas = [(seq, data or {}) for seq, data in session.execute(q.order_by(Event.seq)).all()]
        return job.status, job.error, deltas


class FollowedCall:
    """A streamed call's job, followed as it answers: `async with FollowedCall(...) as call`, then
    `async for data in call` gives each stored delta's data, and None where a keep-alive is due (a
    comment line: a client's read timeout, the SDK's timeout=60, is per read, and a first token can
    be minutes away while an engine starts). It ends when the job ends (`status`, `error`) or the
    call's time runs out (the job cancelled, `status` 'timeout'). Left before either (the client went
    away, whatever the stream was sending), the job is cancelled: no one would read its answer."""

    def __init__(self, settings: Settings, job_id: str) -> None:
        self.settings, self.job_id = settings, job_id
        self.status = ""
        self.error: str | None = None

    async def __aenter__(self) -> FollowedCall:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.status:
            await asyncio.shield(run_in_threadpool(cancel_call, self.settings, self.job_id))

    async def __aiter__(self) -> AsyncIterator[dict[str, Any] | None]:
        last = 0
        deadline = time.monotonic() + self.settings.fine_tuning.inference_timeout_seconds
        sent = time.monotonic()
        while True:
            status, error, deltas = await run_in_threadpool(progress_of, self.settings, self.job_id, last)
            for seq, data in deltas:
                last, sent = seq, time.monotonic()
                yield data
            if status in WAIT_ENDS:
                self.status, self.error = status, error
                return
            if time.monotonic() - sent >= KEEPALIVE_SECONDS:
                sent = time.monotonic()
                yield None
            if time.monotonic() >= deadline:
                await run_in_threadpool(cancel_call, self.settings, self.job_id)
                self.status = "timeout"
                return
            await asyncio.sleep(POLL_SECONDS)
