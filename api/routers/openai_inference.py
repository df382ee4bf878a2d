"""Sampling fine-tuned models the way the `openai` SDK does: POST /v1/chat/completions and POST
/v1/completions (the models: api/routers/openai_models.py), for the `ft:` models of this project's
fine-tuning jobs (a final model, or any checkpoint) and of its Tinker sessions' saves.

Each call is a short 'generate' job (mathrl.specs.GenerateSpec) under the project's quotas, tagged
'openai:inference': a worker answers it on its warm vLLM engine or with transformers
(evaluator/chat.py; `fine_tuning.inference_backend`), and the route waits for it (api/openai/generation_calls.py:
a call that outlives `fine_tuning.inference_timeout_seconds`, or whose client goes away while streaming, cancels
its job). With `stream`, the job's 'delta' events are relayed as OpenAI's server-sent chunks, then
`data: [DONE]`. The objects: api/openai/completion_views.py. docs/openai-rft.md."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from api.deps import CallerDep, SettingsDep
from api.openai.chat_params import ChatCompletionParams, CompletionParams, SamplingParams
from api.openai.completion_views import completion_id, completion_object, logprobs_of, usage_of
from api.openai.generation_calls import RESPONSES, TAG, FollowedCall, choices_of, submit_generation, wait_answer
from config.settings import Settings
from mathrl.specs.generate import sampling_fields

router = APIRouter(prefix="/v1", tags=["openai: models and completions"])


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


async def _stream(settings: Settings, job_id: str, model: str, chat: bool, n: int, usage: bool) -> AsyncIterator[str]:
    """OpenAI's server-sent chunks of the job's text as it is stored, the finish reasons, the
    usage if asked, then [DONE]; an error chunk if the job fails or times out."""
    created = int(time.time())
    head = {"id": completion_id(job_id, chat), "created": created, "model": model}
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
        yield "data: " + json.dumps({**head, "object": kind, "choices": [], "usage": usage_of(rows)}) + "\n\n"
    yield "data: [DONE]\n\n"
