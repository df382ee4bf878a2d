"""What a job-backed OpenAI resource keeps of its request in its job's `resolved_config.openai`, typed:
written once at create, read by the resource's views."""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

from store.models import Job


class Record(BaseModel):
    """What a resource keeps: `of(job)` reads it back, fields the job lacks at their defaults."""

    model_config = ConfigDict(extra="ignore")
    request: dict[str, Any] = Field(default_factory=dict)  # the create request, as sent

    @classmethod
    def of(cls, job: Job) -> Self:
        return cls.model_validate((job.resolved_config or {}).get("openai") or {})


class BatchRecord(Record):
    """A batch's (api/routers/openai_batches.py): the model its lines name and how many lines it has."""

    model: str | None = None
    total: int = 0


class ResponseRecord(Record):
    """A response's (api/routers/openai_responses.py): its conversation's turns, the model as asked."""

    model: str = ""
    turns: list[dict[str, Any]] = Field(default_factory=list)


class FineTuningRecord(Record):
    """A fine-tuning job's (api/routers/openai_fine_tuning.py): how its hyperparameters were mapped."""

    mapping: dict[str, Any] = Field(default_factory=dict)


class EvalRunRecord(Record):
    """An eval run's (api/routers/openai_evals.py): its eval, the testing criteria's names, types and
    pass rules, and the model's name as the run reports it."""

    eval_id: str | None = None
    criteria: list[dict[str, Any]] = Field(default_factory=list)
    model: str = ""
