"""Tables. The database is the source of truth for every job; Celery only delivers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, validates

from mathrl.status import check_move
from store.ids import uuid7


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(when: datetime) -> datetime:
    """A stored time, aware: SQLite gives it back naive (it was stored in UTC); PostgreSQL gives it
    aware, in the connection's time zone, which replacing its tzinfo with UTC would shift."""
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    type_annotation_map = {
        dict[str, Any]: JSON,
        list[str]: JSON,
        datetime: DateTime(timezone=True),
    }


class Project(Base):
    __tablename__ = "projects"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=uuid7)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # the project's jobs in an active status (mathrl.status.ACTIVE) and the GPUs they hold: kept by
    # triggers on jobs (migration 0007) in the transaction of every insert and status change, read
    # by the quota check at submit (one row, however many jobs are active)
    active_jobs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    active_gpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


def quota_gpus(context: Any) -> int:
    """A new job's `gpus`, from its spec: what it holds against the project's GPU quota."""
    spec = context.get_current_parameters().get("spec") or {}
    resources = spec.get("resources") or {}
    return int(resources.get("gpus") or 0) * int(resources.get("nodes") or 1)  # Resources.total_gpus


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=uuid7)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    name: Mapped[str | None] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16))
    hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the secret
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column()
    revoked_at: Mapped[datetime | None] = mapped_column()
    # what the key may do (mathrl.schemas.KEY_SCOPES): read, submit (jobs, pipelines, cancels), keys
    scopes: Mapped[list[str]] = mapped_column(default=lambda: ["read", "submit", "keys"])
    # the key that minted this one (None: the admin token did): revoking a key revokes its subtree
    parent_id: Mapped[str | None] = mapped_column(String(36), index=True)


class Pipeline(Base):
    """Named job specs submitted together; a job waits until the jobs it refers to succeed.
    Its status is derived from its jobs' (store/pipelines.py), never stored twice."""

    __tablename__ = "pipelines"
    __table_args__ = (
        Index("ix_pipelines_project_id_id", "project_id", "id"),
        Index("uq_pipelines_project_idempotency", "project_id", "idempotency_key", unique=True),
    )
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=uuid7)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str | None] = mapped_column(String(200))
    tags: Mapped[list[str]] = mapped_column(default=list)
    spec: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))  # api/idempotency.py
    request_hash: Mapped[str | None] = mapped_column(String(64))


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_project_id_id", "project_id", "id"),
        Index("ix_jobs_project_id_name", "project_id", "name"),  # the Tinker API's model ids (migration 0014)
        Index("ix_jobs_status_lease", "status", "lease_expires_at"),
        UniqueConstraint("project_id", "idempotency_key", name="uq_jobs_project_idempotency"),
    )
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=uuid7)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    name: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default="queued")  # mathrl.status
    tags: Mapped[list[str]] = mapped_column(default=list)
    spec: Mapped[dict[str, Any]] = mapped_column()
    resolved_config: Mapped[dict[str, Any] | None] = mapped_column()
    queue: Mapped[str] = mapped_column(String(32), default="cpu")
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    # attempts that ended in a drain (the worker stopped for shutdown, checkpointed the job and
    # handed it back): they are not failures, so they do not count against max_attempts
    drains: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # GPUs the job counts against its project's quota while active (Project.active_gpus)
    gpus: Mapped[int] = mapped_column(Integer, default=quota_gpus, server_default="0")
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column()
    celery_task_id: Mapped[str | None] = mapped_column(String(64))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # a pause asked of a running job: its supervisor drains it to a checkpoint and hands it back as
    # paused (store.jobs.request_pause); cleared when it is resumed
    pause_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    pipeline_id: Mapped[str | None] = mapped_column(ForeignKey("pipelines.id", ondelete="CASCADE"), index=True)
    pipeline_step: Mapped[str | None] = mapped_column(String(64))
    depends_on: Mapped[list[str]] = mapped_column(default=list)  # job ids that must succeed first
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    dispatched_at: Mapped[datetime | None] = mapped_column()
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    @validates("status")
    def _check_status_move(self, _key: str, value: str) -> str:
        """A status set on a loaded job (the reconciler, pipeline settling) must be a move
        mathrl.status allows; bulk UPDATEs go through store.jobs.move."""
        check_move(self.status, value)
        return value


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job_seq", "job_id", "seq"),)
    seq: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    time: Mapped[datetime] = mapped_column(default=utcnow)
    level: Mapped[str] = mapped_column(String(16), default="info")
    type: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any] | None] = mapped_column()


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("job_id", "name", "step", name="uq_metrics_job_name_step"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    step: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Float)
    time: Mapped[datetime] = mapped_column(default=utcnow)


class Sample(Base):
    __tablename__ = "samples"
    __table_args__ = (Index("ix_samples_job_step", "job_id", "step", "index"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=uuid7)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int | None] = mapped_column(Integer)
    index: Mapped[int] = mapped_column(Integer)
    prompt: Mapped[str] = mapped_column(Text)
    completion: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any] | None] = mapped_column()


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step", "kind", name="uq_checkpoints_job_step_kind"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=uuid7)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32), default="checkpoint")  # checkpoint | final | results
    uri: Mapped[str] = mapped_column(String(2048))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    data: Mapped[dict[str, Any] | None] = mapped_column()


class Endpoint(Base):
    """Where a running session job (kind `session`) serves its client's calls: the API's Tinker
    routes (api/routers/tinker.py, through api/tinker/forwarding.py) forward each call there with
    the token. The job writes it once its server is up and removes it when it ends; the token never
    leaves the server side."""

    __tablename__ = "endpoints"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    url: Mapped[str] = mapped_column(String(300))
    token: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class BenchmarkScore(Base):
    __tablename__ = "benchmark_scores"
    __table_args__ = (
        Index("ix_scores_project_benchmark", "project_id", "benchmark", "model_ref"),
        # a job scores a model on a benchmark metric once: a re-run attempt replaces the value
        UniqueConstraint("job_id", "model_ref", "benchmark", "metric", name="uq_scores_natural_key"),
    )
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=uuid7)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    model_ref: Mapped[str] = mapped_column(String(512))
    checkpoint: Mapped[str | None] = mapped_column(String(512))
    benchmark: Mapped[str] = mapped_column(String(128))
    benchmark_version: Mapped[str] = mapped_column(String(64))
    metric: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    ci_low: Mapped[float | None] = mapped_column(Float)
    ci_high: Mapped[float | None] = mapped_column(Float)
    n: Mapped[int] = mapped_column(Integer)
    sampling: Mapped[dict[str, Any]] = mapped_column()
    backend: Mapped[str] = mapped_column(String(32))
    backend_version: Mapped[str] = mapped_column(String(64))
    prompt_hash: Mapped[str | None] = mapped_column(String(64))  # the recipe's digest (with the chat template)
    recipe: Mapped[str | None] = mapped_column(String(128))  # a registered name, or 'inline'
    recipe_config: Mapped[dict[str, Any] | None] = mapped_column()  # the recipe as resolved (overrides applied)
    seed: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Eval(Base):
    """An OpenAI eval (POST /v1/evals): its items' schema and the testing criteria (graders) its
    runs are scored by. A run is an eval job of the project, tagged with the eval's id
    (api/routers/openai_evals.py)."""

    __tablename__ = "evals"
    __table_args__ = (
        Index("ix_evals_project_id_id", "project_id", "id"),
        Index("uq_evals_project_idempotency", "project_id", "idempotency_key", unique=True),
    )
    id: Mapped[str] = mapped_column(String(48), primary_key=True)  # 'eval_' + a uuid7's hex: ordered by creation
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(256))
    data_source_config: Mapped[dict[str, Any]] = mapped_column()
    testing_criteria: Mapped[list[Any]] = mapped_column(JSON)
    meta: Mapped[dict[str, Any] | None] = mapped_column("metadata")  # OpenAI's metadata, as sent
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))  # api/idempotency.py
    request_hash: Mapped[str | None] = mapped_column(String(64))


class File(Base):
    """An uploaded file (POST /v1/files): its bytes live under the artifact directory
    (`path`), its line count and what its lines hold in `data` (mathrl/jsonl_files.py)."""

    __tablename__ = "files"
    __table_args__ = (
        Index("ix_files_project_id_id", "project_id", "id"),
        Index("uq_files_project_idempotency", "project_id", "idempotency_key", unique=True),
        Index("ix_files_expires_at", "expires_at"),
    )
    id: Mapped[str] = mapped_column(String(48), primary_key=True)  # 'file-' + a uuid7's hex: ordered by creation
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    path: Mapped[str] = mapped_column(String(2048))
    data: Mapped[dict[str, Any] | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # OpenAI's expires_after: from then the file is gone to the API, and the reconciler deletes it once no
    # job that reads it is left (store.files.delete_expired)
    expires_at: Mapped[datetime | None] = mapped_column()
    idempotency_key: Mapped[str | None] = mapped_column(String(200))  # api/idempotency.py
    request_hash: Mapped[str | None] = mapped_column(String(64))
