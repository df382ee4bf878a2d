"""What a completion call answers (api/routers/openai_inference.py; each line of a batch,
api/openai/batch_views.py), read off its job's samples: OpenAI's `chat.completion` or
`text_completion` object (`completion_object`), its id, each choice's log-probabilities in its
route's shape, and the usage with its token details."""

from __future__ import annotations

import time
from typing import Any

from evaluator.logprobs import as_completion_logprobs


def usage_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
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


def completion_id(job_id: str, chat: bool) -> str:
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
    base = {"id": completion_id(job_id, chat), "created": int(time.time()), "model": model, "usage": usage_of(rows)}
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
