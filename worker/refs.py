"""Resolving model references: 'job:<id>[@step-N|@final]' becomes a checkpoint path; a hub id
stays one, once it is known to load from the hub only."""

from __future__ import annotations

import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from mathrl.errors import RefError as RefError  # raised here; its callers import it from here
from mathrl.modelref import is_hub_id, split_job_ref
from store.models import Checkpoint, Job


def check_hub_adapter(ref: str) -> None:
    """Refuse a hub repository that is a LoRA adapter on a base that is not a hub model.

    transformers loads a hub repository holding adapter_config.json (with or without a
    config.json) by loading the base that file names, `base_model_name_or_path`, and that may be
    any path on the worker: a repository of the caller's own with a zero adapter on
    /var/lib/mathrl/artifacts/jobs/<another project's job>/train/final gave the caller that
    project's fine-tuned model to sample, evaluate and train, past every check a path meets at
    submit. Its base must be a hub id too. This is the early answer, when the job resolves its
    model (a repository that cannot be read now fails here, as its load would); its owner can
    change it afterwards, so every load checks what it loaded too
    (evaluator.models.check_loaded_from_hub)."""
    from transformers.utils.peft_utils import find_adapter_config_file

    try:
        found = find_adapter_config_file(ref)
    except OSError as exc:  # no such repository, or no access: what the load would say, sooner
        raise RefError(f"{ref}: {exc}") from None
    if found is None:
        return
    try:
        with open(found, encoding="utf-8") as f:
            base = json.load(f).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        base = None
    if not isinstance(base, str) or not is_hub_id(base):
        raise RefError(
            f"{ref}: a LoRA adapter on the hub loads with the base its adapter_config.json names, and that base is "
            "not a hub model: name the base by its hub id there, or give a model under the server's model roots"
        )


def resolve_model_ref(session: Session, project_id: str, ref: str) -> tuple[str, str | None]:
    """Return (path or hub id to load, checkpoint label or None)."""
    job_id, suffix = split_job_ref(ref)
    if not job_id:
        if is_hub_id(ref):
            check_hub_adapter(ref)
        return ref, None
    which = suffix.removeprefix("@")
    job = session.get(Job, job_id)
    if job is None or job.project_id != project_id:
        raise RefError(f"{ref}: no job {job_id} in this project")
    q = select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.kind.in_(("checkpoint", "final")))
    if which.startswith("step-"):
        step = int(which[5:])
        ckpt = session.scalar(q.where(Checkpoint.step == step))
        if ckpt is None:
            raise RefError(f"{ref}: job {job_id} has no checkpoint at step {step}")
    elif which in ("", "final", "latest"):
        if which in ("", "final"):
            ckpt = session.scalar(q.where(Checkpoint.kind == "final"))
            if ckpt is None and job.status != "succeeded" and which == "final":
                raise RefError(f"{ref}: job {job_id} is {job.status} and has no final model yet")
        else:
            ckpt = None
        if ckpt is None:
            ckpt = session.scalar(q.order_by(Checkpoint.step.desc()))
        if ckpt is None:
            raise RefError(f"{ref}: job {job_id} ({job.kind}, {job.status}) has saved no model")
    else:
        raise RefError(f"{ref}: write 'job:<id>', 'job:<id>@step-N' or 'job:<id>@final'")
    return ckpt.uri, f"{job_id}@{'final' if ckpt.kind == 'final' else f'step-{ckpt.step}'}"
