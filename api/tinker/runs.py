"""The Tinker SDK's `RestClient` reads (api/routers/tinker_runs.py), read off the project's session
jobs and their checkpoint rows: the SDK's shapes (`TrainingRun`, `TinkerCheckpoint`, their pages,
`WeightsInfo`), a project's training runs and saves a page at a time (`list_runs`, `list_saves`),
one run with its saves (`get_run`, `training_run`), and the 400 for what is not served
(`not_served`)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, TypeAdapter
from sqlalchemy import func, select

from api.problems import Problem
from api.tinker.common import SAVE_KINDS, TinkerCaller, sessions_of
from config.settings import Settings
from mathrl.schemas import datetime
from store.db import get_sessionmaker
from store.models import Checkpoint, Job

CHECKPOINT_TYPES = {"state": "training", "sampler": "sampler"}  # a save's `what` -> the SDK's checkpoint_type
SEGMENTS = {what: segment for segment, what in SAVE_KINDS.items()}  # a save's `what` -> its path's segment
UTC_TIME = TypeAdapter(datetime)  # the API's times: a naive one from SQLite is UTC


# --- the SDK's shapes (tinker.types) ------------------------------------------------------------


class TinkerCheckpoint(BaseModel):
    checkpoint_id: str
    checkpoint_type: Literal["training", "sampler"]
    time: datetime
    tinker_path: str
    public: bool = False


class TrainingRun(BaseModel):
    training_run_id: str
    base_model: str
    model_owner: str
    is_lora: bool = True
    corrupted: bool = False
    lora_rank: int | None
    last_request_time: datetime
    last_checkpoint: TinkerCheckpoint | None
    last_sampler_checkpoint: TinkerCheckpoint | None
    user_metadata: dict[str, str] | None


class Cursor(BaseModel):
    offset: int
    limit: int
    total_count: int


class TrainingRuns(BaseModel):
    training_runs: list[TrainingRun]
    cursor: Cursor


class Checkpoints(BaseModel):
    checkpoints: list[TinkerCheckpoint]
    cursor: Cursor | None


class WeightsInfo(BaseModel):
    base_model: str
    is_lora: bool = True
    lora_rank: int | None
    train_unembed: bool | None
    train_mlp: bool | None
    train_attn: bool | None


# --- reading the store --------------------------------------------------------------------------


def _checkpoint(row: Checkpoint) -> TinkerCheckpoint:
    """A session job's checkpoint row (each is a save, trainer/session_server.py) as the SDK's `Checkpoint`."""
    data = row.data or {}
    what = str(data.get("what"))
    return TinkerCheckpoint(
        checkpoint_id=f"{SEGMENTS.get(what, what)}/{data.get('name')}",
        checkpoint_type=CHECKPOINT_TYPES.get(what, "training"),
        time=row.created_at,
        tinker_path=str(data.get("tinker_path")),
    )


def _saves(s: Any, job_ids: list[str]) -> dict[str, list[TinkerCheckpoint]]:
    """Each job's saves, oldest first."""
    out: dict[str, list[TinkerCheckpoint]] = {j: [] for j in job_ids}
    if job_ids:
        rows = s.scalars(select(Checkpoint).where(Checkpoint.job_id.in_(job_ids)).order_by(Checkpoint.created_at))
        for row in rows:
            out[row.job_id].append(_checkpoint(row))
    return out


def training_run(job: Job, saves: list[TinkerCheckpoint]) -> TrainingRun:
    spec = job.spec or {}
    times = [UTC_TIME.validate_python(t) for t in (job.finished_at, job.started_at, job.created_at) if t is not None]

    def latest(kind: str) -> TinkerCheckpoint | None:
        return next((c for c in reversed(saves) if c.checkpoint_type == kind), None)

    return TrainingRun(
        training_run_id=str(job.name),
        base_model=str(spec.get("model")),
        model_owner=job.project_id,
        lora_rank=spec.get("lora_rank"),
        last_request_time=max(times + [c.time for c in saves]),
        last_checkpoint=latest("training"),
        last_sampler_checkpoint=latest("sampler"),
        user_metadata=spec.get("user_metadata") or None,
    )


def _training_runs(project_id: str) -> Any:
    return sessions_of(project_id).where(Job.name.like("%:train:%"))


def _page(s: Any, q: Any, limit: int, offset: int) -> tuple[list[Any], Cursor]:
    """One page of a query's rows, and the cursor with the count of all of them."""
    total = s.scalar(select(func.count()).select_from(q.subquery())) or 0
    return list(s.scalars(q.offset(offset).limit(limit))), Cursor(offset=offset, limit=limit, total_count=total)


def list_runs(settings: Settings, project_id: str, limit: int, offset: int) -> TrainingRuns:
    with get_sessionmaker(settings.database.url)() as s:
        jobs, cursor = _page(s, _training_runs(project_id).order_by(Job.created_at.desc()), limit, offset)
        saves = _saves(s, [j.id for j in jobs])
        return TrainingRuns(training_runs=[training_run(j, saves[j.id]) for j in jobs], cursor=cursor)


def _run_job(s: Any, project_id: str, run_id: str) -> Job:
    q = _training_runs(project_id).where(Job.name == run_id).order_by(Job.created_at.desc()).limit(1)
    job: Job | None = s.scalars(q).first()
    if job is None:
        raise Problem(404, "Not found", f"training_run_id: no training run {run_id!r} in this project")
    return job


def get_run(settings: Settings, project_id: str, run_id: str) -> tuple[Job, list[TinkerCheckpoint]]:
    with get_sessionmaker(settings.database.url)() as s:
        job = _run_job(s, project_id, run_id)
        return job, _saves(s, [job.id])[job.id]


def _check_run(settings: Settings, project_id: str, run_id: str) -> None:
    with get_sessionmaker(settings.database.url)() as s:
        _run_job(s, project_id, run_id)


def list_saves(settings: Settings, project_id: str, limit: int, offset: int) -> Checkpoints:
    with get_sessionmaker(settings.database.url)() as s:
        jobs = select(Job.id).where(Job.project_id == project_id, Job.kind == "session")
        q = select(Checkpoint).where(Checkpoint.job_id.in_(jobs)).order_by(Checkpoint.created_at.desc())
        rows, cursor = _page(s, q, limit, offset)
        return Checkpoints(checkpoints=[_checkpoint(r) for r in rows], cursor=cursor)


NOT_SERVED = "a save is a checkpoint of its session job and stays with the job's record"


async def not_served(settings: Settings, caller: TinkerCaller, run_id: str, what: str) -> None:
    """A 404 for a run outside the project, else a 400 that says what is not served."""
    await run_in_threadpool(_check_run, settings, str(caller.project_id), run_id)
    raise Problem(400, "Not served", f"{what} is not served: {NOT_SERVED}")
