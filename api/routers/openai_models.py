"""OpenAI's models routes: GET /v1/models (the project's `ft:` models: each fine-tuning job's final
model and checkpoints, each Tinker session's saves; and the operator's aliases of base models),
GET and DELETE /v1/models/{model}. What a call's `model` samples, and its default length: api/openai/models.py."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from sqlalchemy import select

from api.deps import CallerDep, SettingsDep
from api.openai.fine_tuning_views import fine_tuned_model
from api.openai.models import own_ft_model
from api.problems import Problem
from mathrl.modelref import FINAL_DELETED_TAG, FINE_TUNING_TAG, split_job_ref
from store.db import get_sessionmaker
from store.jobs import has_tag, readers_of
from store.models import Checkpoint, Event, Job

router = APIRouter(prefix="/v1", tags=["openai: models and completions"])

MAX_MODELS = 1000  # GET /v1/models lists the newest this many


def _model_object(name: str, created: Any, owner: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(created.timestamp()), "owned_by": owner}


@router.get("/models")
def list_models(caller: CallerDep, settings: SettingsDep) -> dict[str, Any]:
    """The project's fine-tuned models, as OpenAI lists them: each succeeded fine-tuning job's model
    and its checkpoints, newest first (a running, failed or cancelled job's checkpoints are not
    listed; a checkpoint's own name still answers while its job runs), then the Tinker sessions' saves
    (`save_state`, `save_weights_for_sampler`), newest first, whatever their session's status."""
    with get_sessionmaker(settings.database.url)() as session:
        q = select(Job).where(
            Job.project_id == caller.project_id, has_tag(session, FINE_TUNING_TAG), Job.status == "succeeded"
        )
        jobs = list(session.scalars(q.order_by(Job.id.desc()).limit(MAX_MODELS)))
        ids = [j.id for j in jobs]
        ckpts = session.execute(
            select(Checkpoint.job_id, Checkpoint.step, Checkpoint.created_at)
            .where(Checkpoint.job_id.in_(ids), Checkpoint.kind == "checkpoint")
            .order_by(Checkpoint.step.desc())
        ).all()
        by_job: dict[str, list[Any]] = {}
        for job_id, step, created in ckpts:
            by_job.setdefault(job_id, []).append((step, created))
        data = []
        for job in jobs:
            if FINAL_DELETED_TAG not in (job.tags or []):
                data.append(_model_object(fine_tuned_model(job), job.finished_at or job.created_at, caller.project_id))
            for step, created in by_job.get(job.id, []):
                data.append(_model_object(fine_tuned_model(job, step), created, caller.project_id))
        saves = session.execute(  # Tinker sessions' saves, whatever the session's status: each is stored
            select(Job, Checkpoint.step, Checkpoint.created_at)
            .join(Checkpoint, Checkpoint.job_id == Job.id)
            .where(Job.project_id == caller.project_id, Job.kind == "session", Checkpoint.kind == "checkpoint")
            .order_by(Checkpoint.created_at.desc())
            .limit(MAX_MODELS)
        ).all()
        for job, step, created in saves:
            data.append(_model_object(fine_tuned_model(job, step), created, caller.project_id))
    # the base models the operator serves under OpenAI's names (fine_tuning.model_aliases): a script checks
    # `name in [m.id for m in client.models.list()]` before it samples one
    data = data[: MAX_MODELS - len(settings.fine_tuning.model_aliases)]
    data += [_alias_object(name) for name in sorted(settings.fine_tuning.model_aliases)]
    return {"object": "list", "data": data}


def _alias_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "system"}


# `{model:path}`: a name with a slash ('openai/gpt-oss-20b', which the SDK sends as openai%2Fgpt-oss-20b and the
# server decodes) is one model, not a path below another
@router.get("/models/{model:path}", responses={404: {"description": "No such model in your project."}})
def retrieve_model(model: str, caller: CallerDep, settings: SettingsDep) -> dict[str, Any]:
    if model in settings.fine_tuning.model_aliases:  # a base model the operator serves under OpenAI's name
        return _alias_object(model)
    with get_sessionmaker(settings.database.url)() as session:
        ref = own_ft_model(session, caller.project_id, model)
        job = session.get(Job, split_job_ref(ref)[0])
        assert job is not None  # own_ft_model found it
        return _model_object(model, job.finished_at or job.created_at, caller.project_id)


@router.delete(
    "/models/{model:path}",
    responses={404: {"description": "No such model in your project."}, 409: {"description": "A job uses it."}},
)
def delete_model(model: str, caller: CallerDep, settings: SettingsDep) -> dict[str, Any]:
    """Delete a fine-tuned model (a job's final model, or one of its checkpoints): its weights leave the
    artifact directory and its name answers 404 from then on. A 409 while a job of the project that has
    not ended names the job's models ('job:<id>...'), which would then fail to load."""
    with get_sessionmaker(settings.database.url)() as session:
        ref = own_ft_model(session, caller.project_id, model)
        job_id, at = split_job_ref(ref)
        users = readers_of(session, caller.project_id, f"job:{job_id}")
        if users:
            detail = (
                f"{model!r} is read by {len(users)} job(s) of your project that have not ended "
                f"({', '.join(users[:5])}): cancel them or wait for them to end, then delete it"
            )
            raise Problem(409, "Model in use", detail)
        rows = select(Checkpoint).where(Checkpoint.job_id == job_id)
        if at == "@final":
            rows = rows.where(Checkpoint.kind == "final")
        else:  # the rows own_ft_model finds a checkpoint's name by: a final model's step is one of them
            step = int(at.removeprefix("@step-"))
            rows = rows.where(Checkpoint.kind.in_(("checkpoint", "final")), Checkpoint.step == step)
        gone = list(session.scalars(rows))
        if at == "@final" or any(row.kind == "final" for row in gone):  # the final model's name goes with it
            job = session.get(Job, job_id)
            assert job is not None  # own_ft_model found it
            job.tags = [*(job.tags or []), FINAL_DELETED_TAG]
        for row in gone:
            session.delete(row)
        session.add(Event(job_id=job_id, type="model_deleted", message=f"{model} deleted by DELETE /v1/models"))
        session.commit()
    artifacts = Path(settings.artifact_dir).expanduser().resolve()
    for row in gone:  # after the commit: a failed removal leaves files, never a row without them
        where = Path(row.uri).expanduser().resolve()
        if where.is_relative_to(artifacts) and where != artifacts:
            shutil.rmtree(where, ignore_errors=True)
    return {"id": model, "object": "model", "deleted": True}
