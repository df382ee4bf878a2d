"""What a job-backed OpenAI resource keeps of its request in its job's `resolved_config.openai`, typed:
written once at create, read by the resource's views."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from store.models import Job


class EvalRunRecord(BaseModel):
    """An eval run's (api/routers/openai_evals.py): its eval, the run's request as sent, the
    testing criteria's names, types and pass rules, and the model's name as the run reports it."""

    model_config = ConfigDict(extra="ignore")
    eval_id: str | None = None
    request: dict[str, Any] = Field(default_factory=dict)
    criteria: list[dict[str, Any]] = Field(default_factory=list)
    model: str = ""

    @classmethod
    def of(cls, job: Job) -> EvalRunRecord:
        return cls.model_validate((job.resolved_config or {}).get("openai") or {})
