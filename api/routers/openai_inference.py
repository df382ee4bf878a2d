"""Sampling fine-tuned models the way the `openai` SDK does: POST /v1/chat/completions and POST
/v1/completions (the models: api/routers/openai_models.py), for the `ft:` models of this project's
fine-tuning jobs (a final model, or any checkpoint) and of its Tinker sessions' saves.

Each call is a short 'generate' job (mathrl.specs.GenerateSpec) under the project's quotas, tagged
'openai:inference': a worker answers it on its warm vLLM engine or with transformers
(evaluator/chat.py; `fine_tuning.inference_backend`), and the route waits for it. With `stream`, the
job's 'delta' events are relayed as OpenAI's server-sent chunks, then `data: [DONE]`. A call that
outlives `fine_tuning.inference_timeout_seconds`, or whose client goes away while streaming, cancels
its job. docs/openai-rft.md."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from sqlalchemy import select

from api.admission import QuotaProblem
from api.deps import CallerDep, SettingsDep
from api.job_wakeups import KEEPALIVE_SECONDS  # a quiet stream sends a comment line this often, as event streams do
from api.openai.chat_params import ChatCompletionParams, CompletionParams, SamplingParams
from api.openai.models import sampled_model
from api.problems import Problem, validation_errors
from api.routers.openai_models import default_budget
from api.submit import admit, commit_and_dispatch, job_row
from config.settings import Settings
from evaluator.logprobs import as_completion_logprobs
from mathrl.specs import GenerateSpec
from mathrl.specs.generate import sampling_fields
from mathrl.status import WAIT_ENDS
from store.db import get_sessionmaker
from store.jobs import request_cancel
from store.models import Event, Job, Sample

router = APIRouter(prefix="/v1", tags=["openai: models and completions"])

TAG = "openai:inference"
POLL_SECONDS = 0.2


QUOTA_RETRY_SECONDS = 2  # a completion call over its project's active-jobs quota: try again this soon


RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "The model is not an 'ft:' model of your project (or not finished)."},
    422: {"description": "The request is invalid (the detail names the field)."},
    429: {"description": "Over the project's quota of active jobs."},
    502: {"description": "The worker could not answer (its job failed; the detail says why)."},
    504: {"description": "No answer within fine_tuning.inference_timeout_seconds (the job is cancelled)."},
}


@router.post("/chat/completions", responses=RESPONSES)
async def chat_completions(
    body: ChatCompletionParams, caller: CallerDep, settings: SettingsDep, request: Request
) -> Any:
    """The model's answer to the chat (`chat.completion`, or `chat.completion.chunk`s with `stream`)."""
    return await _answer(body, caller.project_id, settings, True, request)


@router.post("/completions", responses=RESPONSES)
async def completions(body: CompletionParams, caller: CallerDep, settings: SettingsDep, request: Request) -> Any:
    """The model's continuation of the prompt (`text_completion`), no chat template."""
    return await _answer(body, caller.project_id, settings, False, request)


async def _answer(body: SamplingParams, project_id: str, settings: Settings, chat: bool, request: Request) -> Any:
    fields: dict[str, Any] = {
        **sampling_fields(body.model_dump(), chat),  # the one reading of the knobs (a batch's lines' too)
        "stream": bool(body.stream),
        "backend": settings.fine_tuning.inference_backend,
        "name": "chat.completions" if chat else "completions",
        "tags": [TAG],
        "max_attempts": 1,
    }
    job_id = await run_in_threadpool(submit_generation, project_id, settings, body.model, fields)
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = _stream(settings, job_id, body.model, chat, fields["n"], usage)
        return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    await wait_answer(settings, job_id, request)
    rows = await run_in_threadpool(choices_of, settings, job_id)
    return completion_object(job_id, body.model, rows, chat)


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


def _usage(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """OpenAI's usage object, its token details included (the prompt's tokens a warm engine's prefix cache
    held, and zeros: no reasoning split, no audio): the SDK types them optional, and scripts read
    `usage.completion_tokens_details.reasoning_tokens`."""
    prompt = int(rows[0].get("prompt_tokens", 0)) if rows else 0
    cached = int(rows[0].get("cached_tokens", 0)) if rows else 0
    completion = sum(int(r.get("completion_tokens", 0)) for r in rows)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
    }


def _completion_id(job_id: str, chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + job_id.replace("-", "")


def logprobs_of(row: dict[str, Any], chat: bool) -> dict[str, Any] | None:
    """A choice's `logprobs`, in the shape of its route, where the call asked for them (else None)."""
    tokens = row.get("logprobs")
    if tokens is None:
        return None
    return {"content": tokens, "refusal": None} if chat else as_completion_logprobs(tokens)


def _message(row: dict[str, Any]) -> dict[str, Any]:
    """A choice's assistant message: its text, and the functions it called (content null where it only called)."""
    calls = row.get("tool_calls")
    if not calls:
        return {"role": "assistant", "content": row["text"], "refusal": None}
    return {"role": "assistant", "content": row["text"] or None, "refusal": None, "tool_calls": calls}


def completion_object(job_id: str, model: str, rows: list[dict[str, Any]], chat: bool) -> dict[str, Any]:
    """A call's answer as OpenAI's chat.completion or text_completion object (its choices: the job's samples)."""
    base = {"id": _completion_id(job_id, chat), "created": int(time.time()), "model": model, "usage": _usage(rows)}
    if chat:
        choices = [
            {
                "index": r["index"],
                "message": _message(r),
                "finish_reason": r["finish_reason"],
                "logprobs": logprobs_of(r, chat),
            }
            for r in rows
        ]
        return {**base, "object": "chat.completion", "choices": choices, "system_fingerprint": None}
    choices = [
        {"index": r["index"], "text": r["text"], "finish_reason": r["finish_reason"], "logprobs": logprobs_of(r, chat)}
        for r in rows
    ]
    return {**base, "object": "text_completion", "choices": choices}


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


async def _stream(settings: Settings, job_id: str, model: str, chat: bool, n: int, usage: bool) -> AsyncIterator[str]:
    """OpenAI's server-sent chunks of the job's text as it is stored, the finish reasons, the
    usage if asked, then [DONE]; an error chunk if the job fails or times out."""
    created = int(time.time())
    head = {"id": _completion_id(job_id, chat), "created": created, "model": model}
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(index: int, text: str | None, finish: str | None = None, role: bool = False, logprobs: Any = None) -> str:
        if chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        else:
            choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
        return "data: " + json.dumps({**head, "object": kind, "choices": [choice]}) + "\n\n"

    def error(message: str, code: str) -> str:
        return "data: " + json.dumps({"error": {"message": message, "type": "server_error", "code": code}}) + "\n\n"

    async with FollowedCall(settings, job_id) as call:
        if chat:
            for i in range(n):
                yield chunk(i, "", role=True)
        async for data in call:
            yield ": keep-alive\n\n" if data is None else chunk(int(data.get("index", 0)), str(data.get("text", "")))
    if call.status == "timeout":
        yield error(f"job {job_id} did not answer in time: cancelled", "timeout")
        return
    if call.status == "paused":
        yield error(f"job {job_id} was paused before it answered: call again", "job_paused")
        return
    if call.status != "succeeded":
        yield error(f"job {job_id} {call.status}: {call.error or 'no error recorded'}", "job_failed")
        return
    rows = await run_in_threadpool(choices_of, settings, job_id)
    for r in rows:  # the choice's log-probabilities, asked for, come whole with its last chunk
        yield chunk(r["index"], None if chat else "", r["finish_reason"], logprobs=logprobs_of(r, chat))
    if usage:
        yield "data: " + json.dumps({**head, "object": kind, "choices": [], "usage": _usage(rows)}) + "\n\n"
    yield "data: [DONE]\n\n"
