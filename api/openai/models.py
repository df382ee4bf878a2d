"""Which model a request's `model` means (OpenAI's routers share these): an operator's alias, a
model this server runs, or an `ft:` model of the project; an OpenAI model's name with no alias a
400 that says what runs here. And what a call that names no max_tokens may write (`default_budget`)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.problems import Problem
from config.settings import Settings
from mathrl.graders import Grader
from mathrl.modelref import FINAL_DELETED_TAG, FINE_TUNING_TAG, ft_model_ref, split_job_ref
from mathrl.specs.generate import MAX_TOKENS
from store.models import Checkpoint, Job

OPENAI_MODEL = re.compile(r"^(gpt-|o\d|chatgpt-|davinci|babbage|text-|ft:gpt-|ft:o\d|computer-use-)", re.IGNORECASE)


def trainable_model(name: str, aliases: dict[str, str], pointer: str = "/model", what: str = "train") -> str:
    """The model mathrl trains (or grades with) for a request's `model`: the operator's alias for
    it, else the name itself (a hub id, a path, 'job:' or an 'ft:' model); an OpenAI model's name
    with no alias is a 400 at `pointer` that says what this server runs, before a job is stored."""
    if name in aliases:
        return aliases[name]
    if OPENAI_MODEL.match(name):
        listed = ", ".join(f"{k!r} (-> {v})" for k, v in sorted(aliases.items())) or "none are configured"
        detail = (
            f"{name!r} is an OpenAI model, which this server cannot {what}. It runs Hugging Face models: give a "
            f"hub id ('org/name', e.g. 'Qwen/Qwen2.5-1.5B-Instruct'), a model path under the operator's model roots, "
            f"or an 'ft:' model of your project; or ask the operator to map the name (fine_tuning.model_aliases; "
            f"aliases here: {listed})"
        )
        raise Problem.at(pointer, detail, status=400)
    return name


def grading_models_mapped(grader: Any, aliases: dict[str, str], pointer: str) -> Any:
    """`grader` with each grading model (score_model, label_model, inside a multi or weighted grader
    too) named as a job's model is (trainable_model): an OpenAI judge's name ('gpt-4o-2024-08-06')
    was taken for a hub id and failed on the worker."""
    data = grader.model_dump(mode="json", exclude_none=True)

    def walk(node: dict[str, Any], at: str) -> None:
        if node.get("type") in ("score_model", "label_model"):
            node["model"] = trainable_model(str(node["model"]), aliases, f"{at}/model", "grade with")
        subs = node.get("graders")
        for key, sub in subs.items() if isinstance(subs, dict) else enumerate(subs or []):
            inner = sub.get("grader", sub) if isinstance(subs, list) else sub  # weighted: [{grader, weight}]
            walk(inner, f"{at}/graders/{key}" + ("/grader" if isinstance(subs, list) else ""))

    walk(data, pointer)
    return TypeAdapter(Grader).validate_python(data)


def _not_found(name: str) -> Problem:
    detail = f"The model '{name}' does not exist or you do not have access to it."
    return Problem.at("/model", detail, "Model not found", status=404)


def own_ft_model(session: Session, project_id: str, name: str) -> str:
    """The 'job:' reference of an `ft:` model of the project that exists now, else a 404."""
    ref = ft_model_ref(name)
    if ref is None:
        raise _not_found(name)
    job_id, at = split_job_ref(ref)
    job = session.get(Job, job_id)
    if job is None or job.project_id != project_id or not _names_ft_models(job):
        raise _not_found(name)
    if at == "@final":
        if job.status != "succeeded" or job.kind == "session" or FINAL_DELETED_TAG in (job.tags or []):
            raise _not_found(name)  # (a session's models are its saves)
    else:
        step = int(at.removeprefix("@step-"))
        q = select(Checkpoint.id).where(Checkpoint.job_id == job_id, Checkpoint.step == step)
        if session.scalar(q.where(Checkpoint.kind.in_(("checkpoint", "final")))) is None:
            raise _not_found(name)
    return ref


def sampled_model(session: Session, project_id: str, settings: Settings, model: str) -> str:
    """What a call's `model` samples: an operator's alias, its base model (a script's baseline before
    fine-tuning, under the same name it fine-tunes from); any other name an 'ft:' model of the project."""
    aliases = settings.fine_tuning.model_aliases
    return str(aliases[model]) if model in aliases else own_ft_model(session, project_id, model)


def _names_ft_models(job: Job) -> bool:
    """A fine-tuning job's model and checkpoints, and a Tinker session's saves, have `ft:` names."""
    return job.kind == "session" or FINE_TUNING_TAG in (job.tags or [])


def default_budget(session: Session, ref: str) -> int | None:
    """A chat that names no max_tokens: what the model was trained to write, its fine-tuning job's
    completion budget (a reinforcement job's max_completion_length), else the generate spec's default.
    OpenAI sets no cap of its own; a fixed 256 cut a trained model's answers short."""
    job_id = split_job_ref(ref)[0]
    job = session.get(Job, job_id) if job_id else None  # (an operator's alias names a base model)
    budget = (job.resolved_config or {}).get("max_completion_length") if job is not None else None
    return budget if isinstance(budget, int) and 0 < budget <= MAX_TOKENS else None
