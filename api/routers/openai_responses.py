"""OpenAI's Responses API for sampling a model, as newer scripts call it (`client.responses.create`,
`.retrieve`, `.delete`, `.input_items.list`, `response.output_text`): POST /v1/responses, streamed
or not, and GET and DELETE /v1/responses/{id}. A response is a generate job of the project, the
same as a chat completion's (api/routers/openai_inference.py: the same models, quotas, engines and
waits), tagged 'openai:responses'; its conversation (without `instructions`, which OpenAI does not
carry over) is kept in the job's config, so `previous_response_id` continues it. Only text is served:
no tools, files, images or reasoning items (a 400 naming the field). The request checked and submitted:
api/openai/responses_requests.py; the response object: api/openai/responses_views.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from api.deps import CallerDep, SessionDep, SettingsDep
from api.openai.generation_calls import RESPONSES, FollowedCall, wait_answer
from api.openai.records import ResponseRecord
from api.openai.resource import listed
from api.openai.responses_requests import ResponseParams, submit_response
from api.openai.responses_views import (
    NOT_FOUND,
    RESPONSE_JOBS,
    RESPONSES_TAG,
    answer_row,
    detached_job,
    output_message,
    response_object,
)
from api.problems import Problem
from config.settings import Settings
from mathrl.status import TERMINAL
from store.jobs import request_cancel

router = APIRouter(prefix="/v1/responses", tags=["openai: responses"])


@router.post("", responses=RESPONSES)
async def create(body: ResponseParams, caller: CallerDep, settings: SettingsDep, request: Request) -> Any:
    """The model's response to the input (`response`, or its server-sent events with `stream`)."""
    job_id = await run_in_threadpool(submit_response, caller.project_id, settings, body)
    if body.background:  # the job goes on without this call: the client retrieves it
        return response_object(await run_in_threadpool(detached_job, settings, job_id), None)
    if body.stream:
        events = _stream(settings, job_id)
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    await wait_answer(settings, job_id, request)
    row = await run_in_threadpool(answer_row, settings, job_id)
    job = await run_in_threadpool(detached_job, settings, job_id)
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
    added = output_message(job_id, "", "in_progress")
    text = ""
    async with FollowedCall(settings, job_id) as call:
        job = await run_in_threadpool(detached_job, settings, job_id)
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
    job = await run_in_threadpool(detached_job, settings, job_id)
    if call.status != "succeeded":
        yield event("response.failed", response=response_object(job, None))
        return
    row = await run_in_threadpool(answer_row, settings, job_id)
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
    row = answer_row(settings, str(job.id)) if job.status == "succeeded" else None
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
    row = answer_row(settings, str(job.id)) if job.status == "succeeded" else None
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
