"""The Tinker SDK's `RestClient` reads (`list_training_runs`, `get_training_run[_by_tinker_path]`,
`list_checkpoints`, `list_user_checkpoints`, `get_weights_info_by_tinker_path`): a view over the
project's session jobs and their checkpoint rows, as api/routers/tinker.py keeps them.

- A training run is a training client's job (kind `session`, `train: true`); its id is the job's
  name, the model id the SDK derives (`<session id>:train:<n>`). Its `user_metadata` is what the
  client gave `create_lora_training_client`.
- A checkpoint is a save of that job: `weights/<name>` (save_state, type `training`) or
  `sampler_weights/<name>` (type `sampler`), with its `tinker://` path.
- Deleting, publishing a save or setting its TTL are not served (400, saying so): a save is a
  checkpoint of its job and stays with the job's record."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, TypeAdapter
from sqlalchemy import func, select

from api.deps import SettingsDep
from api.problems import Problem
from api.tinker_common import RESPONSES, SAVE_KINDS, TinkerCaller, find_save, json_body, sessions_of
from config.settings import Settings
from mathrl.schemas import datetime
from store.db import get_sessionmaker
from store.models import Checkpoint, Job

router = APIRouter(prefix="/api/v1", tags=["tinker"], responses=RESPONSES)
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


def _run(job: Job, saves: list[TinkerCheckpoint]) -> TrainingRun:
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


def _list_runs(settings: Settings, project_id: str, limit: int, offset: int) -> TrainingRuns:
    with get_sessionmaker(settings.database.url)() as s:
        jobs, cursor = _page(s, _training_runs(project_id).order_by(Job.created_at.desc()), limit, offset)
        saves = _saves(s, [j.id for j in jobs])
        return TrainingRuns(training_runs=[_run(j, saves[j.id]) for j in jobs], cursor=cursor)


def _run_job(s: Any, project_id: str, run_id: str) -> Job:
    q = _training_runs(project_id).where(Job.name == run_id).order_by(Job.created_at.desc()).limit(1)
    job: Job | None = s.scalars(q).first()
    if job is None:
        raise Problem(404, "Not found", f"training_run_id: no training run {run_id!r} in this project")
    return job


def _get_run(settings: Settings, project_id: str, run_id: str) -> tuple[Job, list[TinkerCheckpoint]]:
    with get_sessionmaker(settings.database.url)() as s:
        job = _run_job(s, project_id, run_id)
        return job, _saves(s, [job.id])[job.id]


def _check_run(settings: Settings, project_id: str, run_id: str) -> None:
    with get_sessionmaker(settings.database.url)() as s:
        _run_job(s, project_id, run_id)


def _list_saves(settings: Settings, project_id: str, limit: int, offset: int) -> Checkpoints:
    with get_sessionmaker(settings.database.url)() as s:
        jobs = select(Job.id).where(Job.project_id == project_id, Job.kind == "session")
        q = select(Checkpoint).where(Checkpoint.job_id.in_(jobs)).order_by(Checkpoint.created_at.desc())
        rows, cursor = _page(s, q, limit, offset)
        return Checkpoints(checkpoints=[_checkpoint(r) for r in rows], cursor=cursor)


Limit = Query(20, ge=1, le=1000, description="How many to return.")
Offset = Query(0, ge=0, le=1_000_000, description="How many to skip.")


@router.get("/training_runs")
async def list_training_runs(
    caller: TinkerCaller, settings: SettingsDep, limit: int = Limit, offset: int = Offset
) -> TrainingRuns:
    """The project's training runs, newest first (`access_scope` is always the project's own)."""
    return await run_in_threadpool(_list_runs, settings, str(caller.project_id), limit, offset)


@router.get("/training_runs/{training_run_id}")
async def get_training_run(training_run_id: str, caller: TinkerCaller, settings: SettingsDep) -> TrainingRun:
    job, saves = await run_in_threadpool(_get_run, settings, str(caller.project_id), training_run_id)
    return _run(job, saves)


@router.get("/training_runs/{training_run_id}/checkpoints")
async def list_checkpoints(training_run_id: str, caller: TinkerCaller, settings: SettingsDep) -> Checkpoints:
    _, saves = await run_in_threadpool(_get_run, settings, str(caller.project_id), training_run_id)
    return Checkpoints(checkpoints=saves, cursor=None)


@router.get("/checkpoints")
async def list_user_checkpoints(
    caller: TinkerCaller, settings: SettingsDep, limit: int = Query(100, ge=1, le=1000), offset: int = Offset
) -> Checkpoints:
    """Every save of the project's sessions, newest first."""
    return await run_in_threadpool(_list_saves, settings, str(caller.project_id), limit, offset)


@router.post("/weights_info")
async def weights_info(caller: TinkerCaller, settings: SettingsDep, request: Request) -> WeightsInfo:
    """What a save was trained as: its base model and LoRA options."""
    path = json_body(await request.body()).get("tinker_path")
    if not isinstance(path, str):
        raise Problem.at("/tinker_path", "give the save's tinker:// path", status=400)
    at, _ = await run_in_threadpool(find_save, settings, str(caller.project_id), path)
    spec = at.job.spec or {}
    return WeightsInfo(
        base_model=str(spec.get("model")),
        lora_rank=spec.get("lora_rank"),
        train_unembed=spec.get("train_unembed"),
        train_mlp=spec.get("train_mlp"),
        train_attn=spec.get("train_attn"),
    )


NOT_SERVED = "a save is a checkpoint of its session job and stays with the job's record"
# the publish and TTL routes come before the delete route, whose `checkpoint_id:path` would take them


@router.post("/training_runs/{training_run_id}/checkpoints/{checkpoint_id:path}/publish")
@router.delete("/training_runs/{training_run_id}/checkpoints/{checkpoint_id:path}/publish")
async def publish_checkpoint(
    training_run_id: str, checkpoint_id: str, caller: TinkerCaller, settings: SettingsDep
) -> None:
    await _not_served(settings, caller, training_run_id, "publishing a save (saves are the project's own)")


@router.put("/training_runs/{training_run_id}/checkpoints/{checkpoint_id:path}/ttl")
async def set_checkpoint_ttl(
    training_run_id: str, checkpoint_id: str, caller: TinkerCaller, settings: SettingsDep
) -> None:
    await _not_served(settings, caller, training_run_id, "a save's TTL")


@router.delete("/training_runs/{training_run_id}/checkpoints/{checkpoint_id:path}")
async def delete_checkpoint(
    training_run_id: str, checkpoint_id: str, caller: TinkerCaller, settings: SettingsDep
) -> None:
    await _not_served(settings, caller, training_run_id, "deleting a save")


async def _not_served(settings: Settings, caller: TinkerCaller, run_id: str, what: str) -> None:
    """A 404 for a run outside the project, else a 400 that says what is not served."""
    await run_in_threadpool(_check_run, settings, str(caller.project_id), run_id)
    raise Problem(400, "Not served", f"{what} is not served: {NOT_SERVED}")
