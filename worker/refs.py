"""Resolving model references: 'job:<id>[@step-N|@final]' becomes a checkpoint path; a hub id
stays one, once it is known to load from the hub only."""

from __future__ import annotations

import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from mathrl.modelref import FINAL_DELETED_TAG, is_hub_id, split_job_ref
from runtime.errors import RefError as RefError  # raised here; its callers import it from here
from store.models import Checkpoint, Job

HUB_PROBE_SECONDS = 5.0
HUB_UNREACHABLE = (
    "{ref}: this model is not in the worker's model cache and the hub ({endpoint}) cannot be reached from it"
    " ({why}): name a model under the server's model roots, or ask the operator to make the hub reachable"
    " (or to put the model in the cache, with HF_HUB_OFFLINE=1)"
)


def hub_unreachable(ref: str) -> str | None:
    """Why the hub cannot be reached, for a repository whose config.json is not in the cache; else None.
    One request, no retries: huggingface_hub retries a failed connection five times (about 23 s here),
    and a load reads several files, so an unknown id on a machine with no hub failed after 119 s."""
    import httpx
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE or try_to_load_from_cache(ref, "config.json") is not None:
        return None
    try:  # no token: hub_access sends it only through huggingface_hub's own client
        httpx.head(constants.ENDPOINT, timeout=HUB_PROBE_SECONDS)
    except httpx.TransportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def check_hub_model(ref: str) -> None:
    """Refuse a hub repository that sends its load to a base that is not a hub model.

    Two files of a hub repository name another model that the libraries then load in its place,
    and that may be any path on the worker (another project's fine-tuned model under
    /var/lib/mathrl/artifacts/jobs/<job>/train/final, past every check a path meets at submit):
    - adapter_config.json's `base_model_name_or_path`: transformers loads that base, with or
      without a config.json beside it, and the repository's zero adapter on top;
    - config.json's `speculators_config.verifier.name_or_path`: vLLM serves that verifier, with
      the repository as its draft model (vllm.transformers_utils.config.maybe_override_with_speculators).
    Each must be a hub id. This is the early answer, when the job resolves its model (a repository
    that cannot be read now fails here, as its load would); its owner can change it afterwards, so
    each load in a job's process checks what it loaded too (evaluator.models.check_loaded_from_hub)."""
    from huggingface_hub import constants
    from transformers.utils.hub import cached_file

    why = hub_unreachable(ref)
    if why is not None:
        raise RefError(HUB_UNREACHABLE.format(ref=ref, endpoint=constants.ENDPOINT, why=why))
    named: list[object] = []
    for name, key in (
        ("adapter_config.json", ("base_model_name_or_path",)),
        ("config.json", ("speculators_config", "verifier", "name_or_path")),
    ):
        try:
            found = cached_file(
                ref, name, _raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False
            )
        except OSError as exc:  # no such repository, or no access: what the load would say, sooner
            raise RefError(f"{ref}: {exc}") from None
        if found is None:
            continue
        try:
            with open(found, encoding="utf-8") as f:
                value: object = json.load(f)
        except (OSError, ValueError):
            continue  # not JSON: the load fails on it
        for k in key:
            value = value.get(k) if isinstance(value, dict) else None
        if name == "adapter_config.json" or value is not None:
            named.append(value)
    if any(not isinstance(v, str) or not is_hub_id(v) for v in named):
        raise RefError(
            f"{ref}: the repository names another model to load in its place (adapter_config.json's base, or "
            "config.json's speculators verifier) that is not a hub model: name it by its hub id there, or give a "
            "model under the server's model roots"
        )


def resolve_model_ref(session: Session, project_id: str, ref: str) -> tuple[str, str | None]:
    """Return (path or hub id to load, checkpoint label or None)."""
    job_id, suffix = split_job_ref(ref)
    if not job_id:
        if is_hub_id(ref):
            check_hub_model(ref)
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
            if FINAL_DELETED_TAG in (job.tags or []):
                raise RefError(f"{ref}: job {job_id}'s final model was deleted (DELETE /v1/models)")
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
