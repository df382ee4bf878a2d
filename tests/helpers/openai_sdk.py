"""The real `openai` package against a running service (tests/helpers/service.py): a client with a
key of a new project, and a fine-tuning job awaited as a script written for OpenAI polls it."""

from __future__ import annotations

import time
from typing import Any

from tests.helpers.service import Service


def openai_client(service: Service, key: str | None = None, timeout: float = 60) -> Any:
    """An `openai.OpenAI` on the service's /v1 (`key`, or a new project's), without the SDK's retries."""
    from openai import OpenAI

    return OpenAI(base_url=f"{service.url}/v1", api_key=key or service.key(), max_retries=0, timeout=timeout)


def wait_fine_tuning(client: Any, job_id: str, timeout: float = 300) -> Any:
    """The fine-tuning job once it has ended (TimeoutError past `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.5)
    raise TimeoutError(f"{job_id} still {job.status}")


# a strict JSON Schema a tiny model's answer can meet in a few tokens (structured outputs, issue 69.2)
VERDICT_SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["verdict", "sure"],
    "additionalProperties": False,
}
VERDICT_FORMAT = {"type": "json_schema", "json_schema": {"name": "verdict", "strict": True, "schema": VERDICT_SCHEMA}}
