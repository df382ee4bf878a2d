"""Response schemas of the REST API (what the SDK receives)."""

from __future__ import annotations

from datetime import UTC
from datetime import datetime as _datetime
from typing import Annotated, Any, Generic, Literal, TypeVar, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from mathrl.graders import Grader
from mathrl.graders import GraderItem as GraderItem  # the SDK's users import it from here
from mathrl.specs import Resources
from mathrl.status import TERMINAL
from mathrl.status import JobStatus as JobStatus

TERMINAL_STATUSES = TERMINAL  # the name the SDK has exported

# SQLite hands back naive datetimes; every time the service stores is UTC.
datetime = Annotated[_datetime, AfterValidator(lambda d: d if d.tzinfo else d.replace(tzinfo=UTC))]

T = TypeVar("T")


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class JobResponse(_Out):
    id: str
    project_id: str
    kind: str
    name: str | None
    status: JobStatus
    tags: list[str]
    spec: dict[str, Any] = Field(description="The spec as submitted (validated, defaults filled).")
    resolved_config: dict[str, Any] | None = Field(description="Every hyperparameter as the run uses it.")
    queue: str
    attempts: int
    max_attempts: int
    drains: int = Field(
        0, description="Attempts handed back by a worker shutting down (checkpointed, re-queued): not failures."
    )
    cancel_requested: bool
    error: str | None
    pipeline_id: str | None = Field(None, description="The pipeline this job belongs to, if any.")
    pipeline_step: str | None = Field(None, description="Its step name in that pipeline.")
    depends_on: list[str] = Field(default_factory=list, description="Job ids that must succeed before it starts.")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class PipelineJob(_Out):
    step: str
    job_id: str
    kind: str
    status: JobStatus
    depends_on: list[str] = Field(description="Step names this step waits for.")
    error: str | None


class PipelineResponse(_Out):
    id: str
    project_id: str
    name: str | None
    tags: list[str]
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    spec: dict[str, Any] = Field(description="The pipeline as submitted.")
    jobs: list[PipelineJob]
    created_at: datetime
    finished_at: datetime | None


class Page(_Out, Generic[T]):
    data: list[T]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null at the end.")


class EventResponse(_Out):
    seq: int
    job_id: str
    time: datetime
    level: Literal["debug", "info", "warning", "error"]
    type: str
    message: str
    data: dict[str, Any] | None


class MetricPoint(_Out):
    step: int
    value: float
    time: datetime


class MetricSeries(_Out):
    name: str
    points: list[MetricPoint]


class SampleResponse(_Out):
    id: str
    job_id: str
    step: int | None
    index: int
    prompt: str
    completion: str
    data: dict[str, Any] | None


class CheckpointResponse(_Out):
    id: str
    job_id: str
    step: int
    uri: str
    kind: str
    created_at: datetime
    data: dict[str, Any] | None


class ScoreResponse(_Out):
    id: str
    job_id: str
    model_ref: str
    checkpoint: str | None
    benchmark: str
    benchmark_version: str
    metric: str
    value: float
    ci_low: float | None
    ci_high: float | None
    n: int
    sampling: dict[str, Any]
    backend: str
    backend_version: str
    prompt_hash: str | None
    recipe: str | None = None
    recipe_config: dict[str, Any] | None = None
    seed: int | None
    created_at: datetime


KeyScope = Literal["read", "submit", "keys"]
KEY_SCOPES: tuple[str, ...] = get_args(KeyScope)


class KeyResponse(_Out):
    id: str
    project_id: str
    project: str
    name: str | None
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    scopes: list[str] = Field(
        description="What the key may do: 'read' (GET routes), 'submit' (create jobs and pipelines, cancel), "
        "'keys' (create, list and revoke the project's keys).",
    )
    parent_id: str | None = Field(
        None,
        description="The key that created this one (null: the operator's admin token). Revoking a key revokes "
        "every key below it.",
    )


class KeyCreated(KeyResponse):
    key: str = Field(description="The secret. Shown once; only its hash is stored.")


class KeyCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, max_length=200)
    project: str | None = Field(
        None,
        max_length=100,
        pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="Another project (created if new): needs the operator's admin token.",
    )
    expires_in_days: int | None = Field(
        None,
        ge=1,
        le=3650,
        strict=True,  # a JSON integer: not true (read as 1), "2" or 2.0
        description="Default: the server's auth.default_key_days (90 unless the operator "
        "changed it; 0 there means no expiry). Never past the creating key's own expiry: asked for "
        "longer, 422; not asked, the new key expires with the creating key at the latest.",
    )
    scopes: list[KeyScope] | None = Field(
        None,
        min_length=1,
        description="Default: the creating key's own scopes (all three with the admin token). "
        "A key cannot grant a scope it does not hold.",
    )


class GraderRunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grader: Grader
    items: list[GraderItem] = Field(..., min_length=1, max_length=1000, description="At most 1000 per call.")
    resources: Resources | None = Field(
        None,
        description="For a grader that loads a model, which a worker runs as a short 'grade' job: the pool it "
        "runs on (default: the CPU pool).",
    )


class GraderResult(BaseModel):
    score: float
    reason: str


class GraderRunResponse(BaseModel):
    data: list[GraderResult] = Field(description="One per item, in order.")
    mean: float = Field(description="The mean score.")
    job_id: str | None = Field(
        None, description="The 'grade' job a worker ran it in (graders that load a model); none when run here."
    )


class GraderRunPending(BaseModel):
    job_id: str = Field(description="The 'grade' job; its results: GET /v1/graders/runs/{job_id}.")
    status: JobStatus
    detail: str
