"""OpenAI's Responses API for sampling a model, as newer scripts call it (`client.responses.create`,
`.retrieve`, `.delete`, `.input_items.list`, `response.output_text`): POST /v1/responses, streamed
or not, and GET and DELETE /v1/responses/{id}. A response is a generate job of the project, the
same as a chat completion's (api/routers/openai_inference.py: the same models, quotas, engines and
waits), tagged 'openai:responses'; its conversation (without `instructions`, which OpenAI does not
carry over) is kept in the job's config, so `previous_response_id` continues it. Only text is served:
no tools, files, images or reasoning items (a 400 naming the field)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.deps import CallerDep, SessionDep, SettingsDep
from api.openai.records import ResponseRecord
from api.openai.resource import JobResource, listed
from api.problems import Problem
from api.routers.openai_inference import (
    RESPONSES,
    TAG,
    FollowedCall,
    choices_of,
    submit_generation,
    wait_answer,
)
from config.settings import Settings
from mathrl.errors import FieldError
from mathrl.specs.generate import MAX_TOKENS, MAX_TOP_LOGPROBS, effort_budget
from mathrl.status import TERMINAL
from store.db import get_sessionmaker
from store.jobs import request_cancel
from store.models import Job, Sample

router = APIRouter(prefix="/v1/responses", tags=["openai: responses"])

RESPONSES_TAG = "openai:responses"
UNSTORED_TAG = "openai:responses-unstored"  # store: false: answered, then not retrievable (the job stays)
NOT_FOUND = "no response with this id in your project"
MAX_TURNS = 256  # messages in one conversation, previous responses' included


class _Open(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputText(_Open):
    type: Literal["input_text", "output_text"]
    text: str = Field(..., max_length=100_000)
    annotations: Annotated[list[Any], Field(max_length=0)] | None = Field(None, description="Accepted empty.")
    # an output text sent back as the SDK returned it: its log-probabilities, where asked for, are not read
    logprobs: Annotated[list[Any], Field(max_length=MAX_TOKENS)] | None = Field(None, description="Accepted; not used.")


class InputMessage(_Open):
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[str, Field(max_length=100_000)] | Annotated[list[InputText], Field(min_length=1, max_length=64)]
    type: Literal["message"] | None = None
    # what an output message the SDK returned carries, sent back as it is by a multi-turn script
    id: str | None = Field(None, max_length=128, description="Accepted; not used.")
    status: str | None = Field(None, max_length=32, description="Accepted; not used.")

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class TextFormat(_Open):
    """The Responses API's format: chat's response_format with its json_schema's fields flattened."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)

    type: Literal["text", "json_object", "json_schema"] = Field(..., description="What the answer must be.")
    name: str | None = Field(None, max_length=64, description="json_schema: the format's name.")
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="json_schema: the JSON Schema.")
    description: str | None = Field(None, max_length=10_000, description="json_schema: what it is for.")
    strict: bool | None = Field(None, description="json_schema: OpenAI's strict mode.")

    def as_response_format(self) -> dict[str, Any]:
        """The same format as a chat's response_format (mathrl/specs/response_format.py checks it)."""
        if self.type != "json_schema":
            return {"type": self.type}
        schema = {"name": self.name, "schema": self.schema_, "description": self.description, "strict": self.strict}
        return {"type": "json_schema", "json_schema": {k: v for k, v in schema.items() if v is not None}}


class TextConfig(_Open):
    format: TextFormat | None = None
    verbosity: str | None = Field(None, max_length=16, description="Accepted; not used.")


class Reasoning(_Open):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None, description="A length budget where max_output_tokens is not given, as for chat completions."
    )
    summary: Literal["auto", "concise", "detailed"] | None = Field(None, description="Accepted; none is written.")


class ResponseParams(_Open):
    model: str = Field(..., min_length=1, max_length=512, description="An 'ft:' model of your project, or an alias.")
    input: (
        Annotated[str, Field(max_length=100_000)]
        | Annotated[list[InputMessage], Field(min_length=1, max_length=MAX_TURNS)]
    )
    instructions: str | None = Field(None, max_length=100_000, description="A system message first; not carried on.")
    previous_response_id: str | None = Field(None, max_length=64, description="A response of yours to go on from.")
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    stream: bool | None = None
    store: bool | None = Field(
        None, description="false: the response is not retrievable once answered (its job stays, as every job does)."
    )
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        None, max_length=16
    )
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    tools: Annotated[list[Any], Field(max_length=0)] | None = Field(None, description="No tools here: only empty.")
    tool_choice: Literal["none", "auto"] | None = Field(None, description="No tools here.")
    parallel_tool_calls: bool | None = Field(None, description="Accepted; no tools here.")
    truncation: Literal["disabled"] | None = None
    include: Annotated[list[Literal["message.output_text.logprobs"]], Field(max_length=1)] | None = Field(
        None, description="Only the output text's log-probabilities (the model's own, as chat completions')."
    )
    top_logprobs: int | None = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS, description="With them, this many most likely tokens in each token's place."
    )
    user: str | None = Field(None, max_length=256, description="Accepted; not used.")
    service_tier: str | None = Field(None, max_length=32, description="Accepted; not used.")
    prompt_cache_key: str | None = Field(None, max_length=256, description="Accepted; not used.")
    safety_identifier: str | None = Field(None, max_length=256, description="Accepted; not used.")
    background: bool | None = Field(
        None, description="true: answered at once, queued; retrieve it until it ends, or cancel it (not streamed)."
    )

    @model_validator(mode="after")
    def _background_is_stored(self) -> ResponseParams:
        if self.background and self.store is False:
            raise FieldError("store", "a background response is retrieved when it ends: it needs store (true)")
        if self.background and self.stream:
            raise FieldError("stream", "a background response is not streamed here: retrieve it until it ends")
        return self


RESPONSE_JOBS = JobResource(
    "resp_", RESPONSES_TAG, NOT_FOUND, "response",
    statuses={"waiting": "queued", "queued": "queued", "paused": "queued", "running": "in_progress",
              "succeeded": "completed", "failed": "failed", "cancelled": "cancelled"},
    stopping="cancelled",  # its stop is under way: a cancel answers cancelled
)  # fmt: skip


def _turns(session: Session, project_id: str, body: ResponseParams) -> list[dict[str, str]]:
    """The conversation this response answers: the previous response's (its turns and its answer),
    then this input."""
    turns: list[dict[str, str]] = []
    if body.previous_response_id is not None:
        try:
            previous = RESPONSE_JOBS.own(session, project_id, body.previous_response_id)
        except Problem:
            raise Problem.at("/previous_response_id", "no response with this id in your project", status=400) from None
        if previous.status != "succeeded":
            detail = f"that response is {previous.status}: go on from one that completed"
            raise Problem.at("/previous_response_id", detail, status=400)
        q = select(Sample.completion).where(Sample.job_id == previous.id).order_by(Sample.index).limit(1)
        answer = session.scalar(q)
        turns = [*ResponseRecord.of(previous).turns, {"role": "assistant", "content": answer or ""}]
    if isinstance(body.input, str):
        turns.append({"role": "user", "content": body.input})
    else:
        turns += [{"role": m.role, "content": m.text()} for m in body.input]
    if len(turns) > MAX_TURNS:
        raise Problem.at(
            "/input", f"{len(turns)} messages with the previous responses': at most {MAX_TURNS}", status=400
        )
    return turns


def _request(body: ResponseParams) -> dict[str, Any]:
    """What a response object repeats of its request."""
    return {
        "instructions": body.instructions,
        "metadata": body.metadata or {},
        "previous_response_id": body.previous_response_id,
        "max_output_tokens": body.max_output_tokens,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
        "user": body.user,
        "top_logprobs": body.top_logprobs or 0,
        "background": bool(body.background),
        "text": {"format": _format(body).model_dump(mode="json", exclude_none=True)},
    }


def _format(body: ResponseParams) -> TextFormat:
    return body.text.format if body.text is not None and body.text.format is not None else TextFormat(type="text")


def _submit(project_id: str, settings: Settings, body: ResponseParams) -> str:
    with get_sessionmaker(settings.database.url)() as session:
        turns = _turns(session, project_id, body)
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + turns
    fields: dict[str, Any] = {
        "messages": messages,
        "max_tokens": body.max_output_tokens or effort_budget(body.reasoning.effort if body.reasoning else None),
        "temperature": 0.0 if body.top_p == 0 else 1.0 if body.temperature is None else body.temperature,
        "top_p": body.top_p or 1.0,
        "n": 1,
        "logprobs": (body.top_logprobs or 0) if body.include else None,
        "response_format": _format(body).as_response_format(),
        "stream": bool(body.stream),
        "backend": settings.fine_tuning.inference_backend,
        "name": "responses",
        "tags": [TAG, RESPONSES_TAG if body.store is not False else UNSTORED_TAG],
        "max_attempts": 1,
    }
    info = ResponseRecord(turns=turns, model=body.model, request=_request(body)).model_dump(mode="json")
    try:
        return submit_generation(project_id, settings, body.model, fields, info)
    except Problem as e:  # the generate spec's fields, named as this request names them
        first = (e.errors or [{}])[0]
        pointer, detail = str(first.get("pointer", "")), str(first.get("detail", e.detail))
        named = (
            "/input" if pointer.startswith("/messages") else "/max_output_tokens" if pointer == "/max_tokens" else None
        )
        for theirs in ("/response_format/json_schema", "/response_format"):  # flattened in text.format
            if named is None and pointer.startswith(theirs):
                named = "/text/format" + pointer.removeprefix(theirs)
        if named is None:
            raise
        raise Problem.at(named, detail.replace("response_format", "text.format"), status=400) from None


def _usage(row: dict[str, Any] | None) -> dict[str, Any]:
    prompt = int((row or {}).get("prompt_tokens", 0))
    output = int((row or {}).get("completion_tokens", 0))
    return {
        "input_tokens": prompt,
        # cache_write_tokens (the SDK's ResponseUsage requires it): 0, as writes are not counted here; the
        # warm engine's prefix cache keeps blocks as it pleases, with no retention a caller picks or pays for
        "input_tokens_details": {"cached_tokens": int((row or {}).get("cached_tokens", 0)), "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def _message(job_id: str, text: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}]
    return {
        "type": "message",
        "id": "msg_" + job_id.replace("-", ""),
        "status": status,
        "role": "assistant",
        "content": content,
    }


def response_object(job: Job, row: dict[str, Any] | None) -> dict[str, Any]:
    """The response as OpenAI's object: `row` is its answer (the job's sample), None before it ends."""
    info = ResponseRecord.of(job)
    request = dict(info.request)
    status = RESPONSE_JOBS.status(job)
    incomplete = None
    if status == "completed" and row is not None and row.get("finish_reason") == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    done = "completed" if status == "completed" else "incomplete"
    output = [_message(str(job.id), row["text"], done, row.get("logprobs"))] if row else []
    error = (
        {"code": "server_error", "message": job.error or f"the response's job {job.status}"}
        if job.status == "failed"
        else None
    )
    return {
        "id": RESPONSE_JOBS.id_of(job),
        "object": "response",
        "created_at": int(job.created_at.timestamp()),
        "status": status,
        "model": info.model,
        "output": output,
        "error": error,
        "incomplete_details": incomplete,
        "usage": _usage(row) if row is not None else None,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "store": UNSTORED_TAG not in (job.tags or []),
        "background": False,  # (a response stored before its request kept these)
        "top_logprobs": 0,
        **request,
    }


def _answer_row(settings: Settings, job_id: str) -> dict[str, Any] | None:
    rows = choices_of(settings, job_id)
    return rows[0] if rows else None


def _job(settings: Settings, job_id: str) -> Job:
    with get_sessionmaker(settings.database.url)() as session:
        job = session.get(Job, job_id)
        assert job is not None  # the job this request submitted
        session.expunge(job)
        return job


@router.post("", responses=RESPONSES)
async def create(body: ResponseParams, caller: CallerDep, settings: SettingsDep, request: Request) -> Any:
    """The model's response to the input (`response`, or its server-sent events with `stream`)."""
    job_id = await run_in_threadpool(_submit, caller.project_id, settings, body)
    if body.background:  # the job goes on without this call: the client retrieves it
        return response_object(await run_in_threadpool(_job, settings, job_id), None)
    if body.stream:
        events = _stream(settings, job_id)
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    await wait_answer(settings, job_id, request)
    row = await run_in_threadpool(_answer_row, settings, job_id)
    job = await run_in_threadpool(_job, settings, job_id)
    return response_object(job, row)


async def _stream(settings: Settings, job_id: str) -> AsyncIterator[str]:
    """OpenAI's response events: created, in_progress, the output item and its text part added, a
    delta per stored piece of text, their done events, then completed (or failed / error)."""
    seq = 0

    def event(kind: str, **data: Any) -> str:
        nonlocal seq
        seq += 1
        return f"event: {kind}\ndata: " + json.dumps({"type": kind, "sequence_number": seq, **data}) + "\n\n"

    item_id = "msg_" + job_id.replace("-", "")
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    added = _message(job_id, "", "in_progress")
    text = ""
    async with FollowedCall(settings, job_id) as call:
        job = await run_in_threadpool(_job, settings, job_id)
        yield event("response.created", response=response_object(job, None))
        yield event("response.in_progress", response={**response_object(job, None), "status": "in_progress"})
        yield event("response.output_item.added", output_index=0, item={**added, "content": []})
        yield event("response.content_part.added", item_id=item_id, output_index=0, content_index=0, part=part)
        async for data in call:
            if data is None:
                yield ": keep-alive\n\n"
                continue
            piece = str(data.get("text", ""))
            text += piece
            yield event(
                "response.output_text.delta", item_id=item_id, output_index=0, content_index=0, delta=piece, logprobs=[]
            )
    if call.status == "timeout":
        yield event("error", code="timeout", message=f"job {job_id} did not answer in time: cancelled", param=None)
        return
    job = await run_in_threadpool(_job, settings, job_id)
    if call.status != "succeeded":
        yield event("response.failed", response=response_object(job, None))
        return
    row = await run_in_threadpool(_answer_row, settings, job_id)
    final = response_object(job, row)
    whole = row["text"] if row else text
    done_part = {**part, "text": whole, "logprobs": (row or {}).get("logprobs") or []}
    logprobs = (row or {}).get("logprobs") or []
    yield event(
        "response.output_text.done", item_id=item_id, output_index=0, content_index=0, text=whole, logprobs=logprobs
    )
    yield event("response.content_part.done", item_id=item_id, output_index=0, content_index=0, part=done_part)
    yield event("response.output_item.done", output_index=0, item=final["output"][0] if final["output"] else added)
    yield event("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)


@router.get("/{response_id}", responses={404: {"description": NOT_FOUND}})
def retrieve(response_id: str, caller: CallerDep, session: SessionDep, settings: SettingsDep) -> dict[str, Any]:
    """A response of the project: queued or in progress while its job runs, then its answer."""
    job = RESPONSE_JOBS.own(session, caller.project_id, response_id)
    row = _answer_row(settings, str(job.id)) if job.status == "succeeded" else None
    return response_object(job, row)


@router.post(
    "/{response_id}/cancel", responses={404: {"description": NOT_FOUND}, 400: {"description": "Not background."}}
)
def cancel(response_id: str, caller: CallerDep, session: SessionDep, settings: SettingsDep) -> dict[str, Any]:
    """A background response's job is cancelled (at once if it has not started); an ended one is
    returned as it is. Only a background response can be (as OpenAI's): the others' calls wait."""
    job = RESPONSE_JOBS.own(session, caller.project_id, response_id)
    if not ResponseRecord.of(job).request.get("background"):
        raise Problem.at("/response_id", "only a response created with background: true can be cancelled", status=400)
    if job.status not in TERMINAL:
        request_cancel(session, job)
    row = _answer_row(settings, str(job.id)) if job.status == "succeeded" else None
    return response_object(job, row)


@router.delete("/{response_id}", responses={404: {"description": NOT_FOUND}, 409: {"description": "Not ended."}})
def delete(response_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    """The response goes from the Responses API (its id answers 404, and no response goes on from it);
    its job stays among the project's jobs, as every job does, tagged 'openai:responses-deleted'."""
    job = RESPONSE_JOBS.own(session, caller.project_id, response_id)
    if job.status not in TERMINAL:
        raise Problem(409, "Conflict", "the response has not ended: wait for it")
    job.tags = [t if t != RESPONSES_TAG else "openai:responses-deleted" for t in job.tags or []]
    session.commit()
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/{response_id}/input_items", responses={404: {"description": NOT_FOUND}})
def input_items(
    response_id: str,
    caller: CallerDep,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    after: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    """The messages the response answered (the previous responses' too), newest first by default."""
    job = RESPONSE_JOBS.own(session, caller.project_id, response_id)
    base = str(job.id).replace("-", "")
    items = [
        {
            "type": "message",
            "id": f"msg_{base}_{i}",
            "role": m["role"],
            "status": "completed",
            "content": [{"type": "input_text" if m["role"] != "assistant" else "output_text", "text": m["content"]}],
        }
        for i, m in enumerate(ResponseRecord.of(job).turns)
    ]
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [i["id"] for i in items]
        if after not in ids:
            raise Problem(400, "Bad cursor", "query:/after: an item id from a previous page")
        items = items[ids.index(after) + 1 :]
    return listed(items[:limit], len(items) > limit)
