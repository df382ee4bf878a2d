"""The Tinker SDK's `RestClient` reads (`list_training_runs`, `get_training_run[_by_tinker_path]`,
`list_checkpoints`, `list_user_checkpoints`, `get_weights_info_by_tinker_path`): a view over the
project's session jobs and their checkpoint rows, as api/routers/tinker.py keeps them (the shapes
and reads: api/tinker/runs.py).

- A training run is a training client's job (kind `session`, `train: true`); its id is the job's
  name, the model id the SDK derives (`<session id>:train:<n>`). Its `user_metadata` is what the
  client gave `create_lora_training_client`.
- A checkpoint is a save of that job: `weights/<name>` (save_state, type `training`) or
  `sampler_weights/<name>` (type `sampler`), with its `tinker://` path.
- Deleting, publishing a save or setting its TTL are not served (400, saying so): a save is a
  checkpoint of its job and stays with the job's record."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool

from api.deps import SettingsDep
from api.problems import Problem
from api.tinker.common import RESPONSES, TinkerCaller, find_save, json_body
from api.tinker.runs import (
    Checkpoints,
    TrainingRun,
    TrainingRuns,
    WeightsInfo,
    get_run,
    list_runs,
    list_saves,
    not_served,
    training_run,
)

router = APIRouter(prefix="/api/v1", tags=["tinker"], responses=RESPONSES)


Limit = Query(20, ge=1, le=1000, description="How many to return.")
Offset = Query(0, ge=0, le=1_000_000, description="How many to skip.")


@router.get("/training_runs")
async def list_training_runs(
    caller: TinkerCaller, settings: SettingsDep, limit: int = Limit, offset: int = Offset
) -> TrainingRuns:
    """The project's training runs, newest first (`access_scope` is always the project's own)."""
    return await run_in_threadpool(list_runs, settings, str(caller.project_id), limit, offset)


@router.get("/training_runs/{training_run_id}")
async def get_training_run(training_run_id: str, caller: TinkerCaller, settings: SettingsDep) -> TrainingRun:
    job, saves = await run_in_threadpool(get_run, settings, str(caller.project_id), training_run_id)
    return training_run(job, saves)


@router.get("/training_runs/{training_run_id}/checkpoints")
async def list_checkpoints(training_run_id: str, caller: TinkerCaller, settings: SettingsDep) -> Checkpoints:
    _, saves = await run_in_threadpool(get_run, settings, str(caller.project_id), training_run_id)
    return Checkpoints(checkpoints=saves, cursor=None)


@router.get("/checkpoints")
async def list_user_checkpoints(
    caller: TinkerCaller, settings: SettingsDep, limit: int = Query(100, ge=1, le=1000), offset: int = Offset
) -> Checkpoints:
    """Every save of the project's sessions, newest first."""
    return await run_in_threadpool(list_saves, settings, str(caller.project_id), limit, offset)


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


# the publish and TTL routes come before the delete route, whose `checkpoint_id:path` would take them


@router.post("/training_runs/{training_run_id}/checkpoints/{checkpoint_id:path}/publish")
@router.delete("/training_runs/{training_run_id}/checkpoints/{checkpoint_id:path}/publish")
async def publish_checkpoint(
    training_run_id: str, checkpoint_id: str, caller: TinkerCaller, settings: SettingsDep
) -> None:
    await not_served(settings, caller, training_run_id, "publishing a save (saves are the project's own)")


@router.put("/training_runs/{training_run_id}/checkpoints/{checkpoint_id:path}/ttl")
async def set_checkpoint_ttl(
    training_run_id: str, checkpoint_id: str, caller: TinkerCaller, settings: SettingsDep
) -> None:
    await not_served(settings, caller, training_run_id, "a save's TTL")


@router.delete("/training_runs/{training_run_id}/checkpoints/{checkpoint_id:path}")
async def delete_checkpoint(
    training_run_id: str, checkpoint_id: str, caller: TinkerCaller, settings: SettingsDep
) -> None:
    await not_served(settings, caller, training_run_id, "deleting a save")
