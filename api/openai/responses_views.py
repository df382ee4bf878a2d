"""What OpenAI's response objects look like (api/routers/openai_responses.py), read off the generate
jobs they are views over (`RESPONSE_JOBS`): a response (`response_object`: its status, its answer as
an output message, its usage, and what it repeats of its request), read with its answer once its
job has ended."""

from __future__ import annotations

from typing import Any

from api.openai.generation_calls import choices_of
from api.openai.records import ResponseRecord
from api.openai.resource import JobResource
from config.settings import Settings
from store.db import get_sessionmaker
from store.models import Job

RESPONSES_TAG = "openai:responses"
UNSTORED_TAG = "openai:responses-unstored"  # store: false: answered, then not retrievable (the job stays)
NOT_FOUND = "no response with this id in your project"

RESPONSE_JOBS = JobResource(
    "resp_", RESPONSES_TAG, NOT_FOUND, "response",
    statuses={"waiting": "queued", "queued": "queued", "paused": "queued", "running": "in_progress",
              "succeeded": "completed", "failed": "failed", "cancelled": "cancelled"},
    stopping="cancelled",  # its stop is under way: a cancel answers cancelled
)  # fmt: skip


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


def output_message(job_id: str, text: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The response's answer as OpenAI's output message (its one output item)."""
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
    output = [output_message(str(job.id), row["text"], done, row.get("logprobs"))] if row else []
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


def answer_row(settings: Settings, job_id: str) -> dict[str, Any] | None:
    """The response's answer: its job's one sample (None before it has one)."""
    rows = choices_of(settings, job_id)
    return rows[0] if rows else None


def detached_job(settings: Settings, job_id: str) -> Job:
    """The response's job, read in a session of its own and detached from it."""
    with get_sessionmaker(settings.database.url)() as session:
        job = session.get(Job, job_id)
        assert job is not None  # the job this request submitted
        session.expunge(job)
        return job
