"""What OpenAI's fine-tuning objects look like (api/routers/openai_fine_tuning.py), read off the
jobs they are views over (`FT_JOBS`): a job (`job_object`, with the tokens it trained on and the
hyperparameters it runs with), the `ft:` name of its model and of each checkpoint
(`fine_tuned_model`), an event, and a checkpoint with its metrics under OpenAI's names."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.openai.records import FineTuningRecord
from api.openai.resource import JobResource
from mathrl.modelref import FINE_TUNING_TAG, OPENAI_METRICS, SESSION_SUFFIX, ft_model_name, ftjob_id, results_file_id
from store.models import Checkpoint, Event, Job, Metric
from store.models import File as FileRow

NOT_FOUND = "no fine-tuning job with this id in your project"
LEVELS = {"info": "info", "warning": "warn", "error": "error"}

FT_JOBS = JobResource(  # (its ids: mathrl.modelref.ftjob_id)
    "ftjob-", FINE_TUNING_TAG, NOT_FOUND, "fine-tuning job",
    statuses={"waiting": "queued", "queued": "queued", "paused": "paused", "running": "running",
              "succeeded": "succeeded", "failed": "failed", "cancelled": "cancelled"},
    stopping="cancelled",  # accepted: no further step starts (worker/sink.py)
    pausing="paused",  # accepted: it checkpoints at this step's end
)  # fmt: skip


def fine_tuned_model(job: Job, step: int | None = None) -> str:
    """The `ft:` name of the job's model (or of its checkpoint at `step`): ft:<base>:<suffix>:<ftjob id>.
    A Tinker session's saves are its checkpoints, suffixed 'tinker' (its name holds colons)."""
    suffix = SESSION_SUFFIX if job.kind == "session" else job.name or "mathrl"
    base = str(job.spec.get("model", "model"))
    asked = FineTuningRecord.of(job).request.get("model")
    if base.startswith("job:") and isinstance(asked, str) and asked.startswith("ft:"):
        base = asked.split(":")[1]  # trained on from an 'ft:' model: named by that one's base, as OpenAI does
    return ft_model_name(base, suffix, job.id, step)


def trained_tokens(session: Session, jobs: list[Job]) -> dict[str, float]:
    """The tokens each succeeded job trained on (its largest `num_tokens`), in one query."""
    ids = [j.id for j in jobs if j.status == "succeeded"]
    if not ids:
        return {}
    q = (
        select(Metric.job_id, func.max(Metric.value))
        .where(Metric.job_id.in_(ids), Metric.name == "num_tokens")
        .group_by(Metric.job_id)
    )
    return {job_id: value for job_id, value in session.execute(q).all()}


def _method(request: dict[str, Any], mapping: dict[str, Any]) -> dict[str, Any]:
    """The job's `method` with the hyperparameters it runs with (OpenAI fills in what 'auto' became), and
    its block even when the request gave only the older top-level `hyperparameters` (job.method.supervised
    was None, and reading its hyperparameters raised AttributeError)."""
    method = dict(request.get("method") or {"type": "supervised"})
    kind = method.get("type", "supervised")
    block = dict(method.get(kind) or {})
    block["hyperparameters"] = {**(block.get("hyperparameters") or {}), **mapping}
    return {**method, "type": kind, kind: block}


def job_object(session: Session, job: Job, tokens: dict[str, float] | None = None) -> dict[str, Any]:
    """The job as OpenAI's `fine_tuning.job`; `tokens`: trained_tokens of a page of jobs."""
    record = FineTuningRecord.of(job)
    request, mapping = record.request, record.mapping
    trained = (trained_tokens(session, [job]) if tokens is None else tokens).get(job.id)
    status = FT_JOBS.status(job)
    return {
        "id": ftjob_id(job.id),
        "object": "fine_tuning.job",
        "created_at": int(job.created_at.timestamp()),
        "finished_at": int(job.finished_at.timestamp()) if job.finished_at else None,
        "error": {"code": "job_failed", "message": job.error or "failed", "param": None}
        if job.status == "failed"
        else None,
        "fine_tuned_model": fine_tuned_model(job) if job.status == "succeeded" else None,
        "hyperparameters": {k: mapping.get(k) for k in ("batch_size", "learning_rate_multiplier", "n_epochs")},
        "model": request.get("model", job.spec.get("model")),
        "organization_id": job.project_id,
        # the step metrics file the worker wrote when the job succeeded (worker/record.py), while it is kept
        "result_files": [f.id for f in [session.get(FileRow, results_file_id(job.id))] if f is not None]
        if job.status == "succeeded"
        else [],
        "seed": job.spec.get("seed", 42),
        "status": status,
        "trained_tokens": int(trained) if trained is not None and status == "succeeded" else None,
        "training_file": request.get("training_file"),
        "validation_file": request.get("validation_file"),
        "estimated_finish": None,
        "integrations": [],
        "metadata": request.get("metadata"),
        "method": _method(request, mapping),
        "user_provided_suffix": request.get("suffix"),
    }


def event_object(e: Event) -> dict[str, Any]:
    """A job's event as OpenAI's `fine_tuning.job.event`."""
    return {
        "id": f"ftevent-{e.seq}",
        "object": "fine_tuning.job.event",
        "created_at": int(e.time.timestamp()),
        "level": LEVELS.get(e.level, "info"),
        "message": e.message,
        # a training step's metrics (trainer/callbacks.py), as OpenAI lists them: scripts plot the loss from these
        "type": "metrics" if e.type == "metrics" else "message",
        "data": dict(e.data or {}) if e.type == "metrics" else {"type": e.type, **(e.data or {})},
    }


def _checkpoint_metrics(step: int, logged: dict[str, float]) -> dict[str, float | None]:
    """A checkpoint's `metrics` under OpenAI's names: the training metrics at its step, and the
    validation file's (the whole file, up to eval.limit) as both valid_* and full_valid_*."""
    named = {name: logged.get(raw) for raw, name in OPENAI_METRICS.items()}
    return {
        "step": float(step),
        **named,
        "valid_loss": named["full_valid_loss"],
        "valid_mean_token_accuracy": named["full_valid_mean_token_accuracy"],
    }


def checkpoint_object(job: Job, c: Checkpoint, logged: dict[str, float]) -> dict[str, Any]:
    """A checkpoint of the job as OpenAI's `fine_tuning.job.checkpoint`; `logged`: the metrics at its step."""
    return {
        "id": f"ftckpt-{c.id.replace('-', '')}",
        "object": "fine_tuning.job.checkpoint",
        "created_at": int(c.created_at.timestamp()),
        "fine_tuned_model_checkpoint": fine_tuned_model(job, c.step),
        "fine_tuning_job_id": ftjob_id(job.id),
        "step_number": c.step,
        "metrics": _checkpoint_metrics(c.step, logged),
    }
