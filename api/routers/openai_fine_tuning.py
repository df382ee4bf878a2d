"""OpenAI's fine-tuning jobs, for code written against the `openai` SDK
(`client.fine_tuning.jobs.create(...)`): a view over mathrl's jobs, not a second system. A
reinforcement job is a GRPO job and a supervised one an SFT job, on an uploaded file
(`dataset: {file, format: messages}`), in the one job store and state machine; they also show in
/v1/jobs and the status pages, tagged 'openai:fine_tuning'. The OpenAI request and how each of
its hyperparameters was mapped are stored with the job (resolved_config.openai). docs/openai-rft.md
has the mapping table and what differs."""

from __future__ import annotations

import math
import re
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.deps import CallerDep, SessionDep, SettingsDep
from api.idempotency import earlier, replayed, request_hash
from api.job_control import pause_job, resume_job
from api.openai.files import own_file
from api.openai.models import grading_models_mapped, trainable_model
from api.openai.records import FineTuningRecord
from api.openai.resource import JobResource, listed
from api.problems import Problem
from api.submit import admit, check_job_refs, job_row, submit_keyed
from mathrl.graders import Grader
from mathrl.modelref import (
    FINE_TUNING_TAG,
    OPENAI_METRICS,
    SESSION_SUFFIX,
    ft_model_name,
    ftjob_id,
    results_file_id,
)
from mathrl.shallow import JsonObject
from mathrl.specs import GRPOSpec, SFTSpec, model_refs, parse_spec
from mathrl.specs.base import knob_defaults
from mathrl.specs.generate import REASONING_TOKENS
from store.jobs import request_cancel
from store.models import Checkpoint, Event, Job, Metric
from store.models import File as FileRow

router = APIRouter(prefix="/v1/fine_tuning/jobs", tags=["openai: fine-tuning"])

TAG = FINE_TUNING_TAG
NOT_FOUND = "no fine-tuning job with this id in your project"
# OpenAI's hyperparameters -> mathrl's: the values 'auto' takes, and the bases the multipliers scale
AUTO_EPOCHS = 1
AUTO_BATCH = 4  # prompts (OpenAI's examples) per step
# OpenAI's multipliers scale the specs' own defaults, declared once there: TRL's knobs (GRPO's group
# size, learning rate and completion length) and mathrl's SFT learning rate
_GRPO = knob_defaults(GRPOSpec)
GROUP = int(_GRPO["num_generations"])  # completions per prompt, times compute_multiplier
RL_LEARNING_RATE = float(_GRPO["learning_rate"])  # GRPO, times learning_rate_multiplier
SFT_LEARNING_RATE = float(SFTSpec.model_fields["learning_rate"].default)  # SFT, times learning_rate_multiplier
COMPLETION_TOKENS = int(_GRPO["max_completion_length"])  # what a GRPO job generates unless reasoning_effort says
METADATA_SCAN = 10_000  # jobs one metadata-filtered list request reads at most (the rest: its next page)
# metadata keys the database filters by (a JSON path of them binds safely on PostgreSQL and SQLite); a
# filter on another key reads the jobs here, METADATA_SCAN at most a request
SQL_METADATA_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_VALIDATION = 5000  # validation items scored each time (HeldoutEval.limit's cap)


class _Open(BaseModel):
    model_config = ConfigDict(extra="forbid")


Auto = Literal["auto"]


def auto_or(kind: type[int] | type[float], low: int, high: int, *, above: bool = False) -> Any:
    """'auto' or a number in bounds. Its one error names both: pydantic's own, of the union's first
    member ("Input should be 'auto' (and 1 more)", at param 'n_epochs.literal['auto']'), named neither
    the field nor its bounds."""
    bounds = Field(gt=low, le=high) if above else Field(ge=low, le=high)
    what = "an integer" if kind is int else "a number"
    message = f"use 'auto' or {what} {f'above {low} and at most {high}' if above else f'from {low} to {high}'}"

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(message) from None

    return Annotated[Auto | Annotated[kind, bounds], WrapValidator(check)]


class Hyperparameters(_Open):
    batch_size: auto_or(int, 1, 4096) | None = None  # type: ignore[valid-type]
    learning_rate_multiplier: auto_or(float, 0, 100, above=True) | None = None  # type: ignore[valid-type]
    n_epochs: auto_or(int, 1, 50) | None = None  # type: ignore[valid-type]


class ReinforcementHyperparameters(Hyperparameters):
    compute_multiplier: auto_or(float, 0, 16, above=True) | None = None  # type: ignore[valid-type]
    eval_interval: auto_or(int, 1, 100_000) | None = None  # type: ignore[valid-type]
    eval_samples: auto_or(int, 1, 100) | None = None  # type: ignore[valid-type]
    reasoning_effort: Literal["default", "low", "medium", "high"] | None = None


class Reinforcement(_Open):
    grader: Grader
    hyperparameters: ReinforcementHyperparameters | None = None
    response_format: JsonObject | None = None


class Supervised(_Open):
    hyperparameters: Hyperparameters | None = None


class Method(_Open):
    type: Literal["supervised", "reinforcement", "dpo"]
    reinforcement: Reinforcement | None = None
    supervised: Supervised | None = None
    dpo: JsonObject | None = None


class JobCreateParams(_Open):
    model: str = Field(..., min_length=1, max_length=512, description="A model mathrl can load (a path, hub id, job:).")
    training_file: str = Field(..., max_length=64, description="An uploaded file's id (POST /v1/files).")
    validation_file: str | None = Field(None, max_length=64)
    suffix: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    seed: int | None = Field(None, ge=0, le=2**32 - 1)
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        None, max_length=16
    )
    hyperparameters: Hyperparameters | None = None  # OpenAI's older top-level form (supervised)
    method: Method | None = None
    integrations: list[JsonObject] | None = None


def _value(v: Any, auto: Any) -> Any:
    return auto if v is None or v == "auto" else v


def to_spec(
    body: JobCreateParams, lines: int, generation_backend: str = "auto", validation_lines: int = 0
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The mathrl spec of an OpenAI fine-tuning request, and how each hyperparameter was mapped."""
    method = body.method or Method(type="supervised", supervised=Supervised(hyperparameters=body.hyperparameters))
    if method.type == "dpo":
        raise Problem.at("/method/type", "'dpo' is not trained here: use 'reinforcement' (GRPO) or 'supervised' (SFT)")
    common: dict[str, Any] = {
        "model": body.model,
        "dataset": {"file": body.training_file, "format": "messages"},
        "tags": [TAG],
    }
    if body.suffix:
        common["name"] = body.suffix
    if body.seed is not None:
        common["seed"] = body.seed
    if method.type == "reinforcement":
        if method.reinforcement is None:
            raise Problem.at("/method/reinforcement", "a reinforcement job needs method.reinforcement.grader")
        if method.reinforcement.response_format is not None:  # taken and dropped, every sample scored 0: refused
            raise Problem.at(
                "/method/reinforcement/response_format",
                "structured outputs are not enforced here: the policy generates free text, and a grader's "
                "{{sample.output_json}} is that text parsed as JSON. Leave response_format out and ask for the JSON "
                "in the training file's prompts",
            )
        hp = method.reinforcement.hyperparameters or ReinforcementHyperparameters()
        epochs, batch = _value(hp.n_epochs, AUTO_EPOCHS), _value(hp.batch_size, AUTO_BATCH)
        group = max(2, round(GROUP * _value(hp.compute_multiplier, 1.0)))
        steps = max(1, math.ceil(epochs * lines / batch))
        spec: dict[str, Any] = {
            **common,
            "kind": "grpo",
            "rewards": [{"name": "grader", "grader": method.reinforcement.grader.model_dump(mode="json")}],
            "learning_rate": RL_LEARNING_RATE * _value(hp.learning_rate_multiplier, 1.0),
            "num_generations": group,
            "global_batch_size": batch * group,
            "per_device_train_batch_size": batch * group,
            "max_steps": steps,
            "logging_steps": 1,
            "save_steps": _value(hp.eval_interval, max(1, steps // 4)),
            "generation": {"backend": generation_backend},
        }
        effort = hp.reasoning_effort
        if effort in REASONING_TOKENS:
            spec["max_completion_length"] = REASONING_TOKENS[effort]
        if body.validation_file is not None:  # scored by the job's rewards every eval_interval steps
            spec["eval"] = {
                "file": body.validation_file,
                "every": spec["save_steps"],
                "limit": max(1, min(validation_lines, _value(hp.eval_samples, MAX_VALIDATION))),
                # scored at the length the policy is trained to write (a fixed 256 cut it at half of TRL's 512)
                "max_new_tokens": spec.get("max_completion_length", COMPLETION_TOKENS),
            }
        mapping = {
            "n_epochs": epochs,
            "batch_size": batch,
            "learning_rate_multiplier": _value(hp.learning_rate_multiplier, 1.0),
            "compute_multiplier": _value(hp.compute_multiplier, 1.0),
            "eval_interval": spec["save_steps"],
            "eval_samples": spec["eval"]["limit"] if "eval" in spec else None,
            "reasoning_effort": effort or "default",
        }
        return spec, mapping
    hp_s = (method.supervised.hyperparameters if method.supervised else None) or body.hyperparameters
    hp_s = hp_s or Hyperparameters()
    epochs, batch = _value(hp_s.n_epochs, AUTO_EPOCHS), _value(hp_s.batch_size, AUTO_BATCH)
    steps = max(1, math.ceil(epochs * lines / batch))
    spec = {
        **common,
        "kind": "sft",
        "learning_rate": SFT_LEARNING_RATE * _value(hp_s.learning_rate_multiplier, 1.0),
        "per_device_train_batch_size": batch,
        "max_steps": steps,
        "logging_steps": 1,
        "save_steps": max(1, steps // 4),
    }
    if body.validation_file is not None:  # its loss at each checkpoint: OpenAI's full_valid_loss
        spec["eval"] = {
            "file": body.validation_file,
            "every": spec["save_steps"],
            "limit": max(1, min(validation_lines, MAX_VALIDATION)),
        }
    mapping = {
        "n_epochs": epochs,
        "batch_size": batch,
        "learning_rate_multiplier": _value(hp_s.learning_rate_multiplier, 1.0),
    }
    return spec, mapping


FT_JOBS = JobResource(  # (its ids: mathrl.modelref.ftjob_id)
    "ftjob-", TAG, NOT_FOUND, "fine-tuning job",
    statuses={"waiting": "queued", "queued": "queued", "paused": "paused", "running": "running",
              "succeeded": "succeeded", "failed": "failed", "cancelled": "cancelled"},
    stopping="cancelled",  # accepted: no further step starts (worker/sink.py)
    pausing="paused",  # accepted: it checkpoints at this step's end
)  # fmt: skip


# OpenAI's own models: a script migrating from OpenAI names one of these, which no hub serves


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


@router.post(
    "",
    responses={
        404: {"description": "A file is not in your project."},
        409: {"description": "This Idempotency-Key was used with a different request."},
        422: {"description": "The request is invalid (the detail names the field)."},
        429: {"description": "Over the project's quota of active jobs."},
    },
)
def create(
    body: JobCreateParams,
    caller: CallerDep,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    x_stainless_retry_count: Annotated[str | None, Header(max_length=8, include_in_schema=False)] = None,
) -> dict[str, Any]:
    """Start a fine-tuning job: a GRPO job (reinforcement) or an SFT job (supervised) on the file.
    A retry with the same Idempotency-Key, or the openai SDK's own retry of this request (which
    sends no key), returns the same job (api/idempotency.py)."""
    digest = request_hash(body.model_dump(mode="json", exclude_none=True))
    retry = x_stainless_retry_count
    if (existing := earlier(session, Job, caller.project_id, idempotency_key, digest, retry)) is not None:
        replayed(response)
        return job_object(session, existing)
    if body.integrations:
        raise Problem.at("/integrations", "integrations (Weights & Biases) are not supported here: leave it out")
    try:
        training = own_file(session, caller.project_id, body.training_file)
    except Problem:
        raise Problem.at("/training_file", f"{body.training_file!r}: no file with this id in your project") from None
    validation_lines = 0
    if body.validation_file is not None:
        try:
            validation = own_file(session, caller.project_id, body.validation_file)
        except Problem:
            raise Problem.at(
                "/validation_file", f"{body.validation_file!r}: no file with this id in your project"
            ) from None
        validation_lines = int((validation.data or {}).get("lines", 0))
        rl = (validation.data or {}).get("reinforcement_lines", 0)
        sl = (validation.data or {}).get("supervised_lines", 0)
        if body.method is not None and body.method.type == "reinforcement" and rl != validation_lines:
            detail = f"{validation_lines - rl} of its {validation_lines} lines do not end with a user message"
            raise Problem.at("/validation_file", detail)
        if (body.method is None or body.method.type == "supervised") and sl != validation_lines:
            detail = (
                f"{validation_lines - sl} of its {validation_lines} lines do not end with a user message and the "
                "assistant's answer (a supervised line's last message is what its loss is taken on)"
            )
            raise Problem.at("/validation_file", detail)
    stats = training.data or {}
    lines = int(stats.get("lines", 0))
    kind = body.method.type if body.method else "supervised"
    if kind == "reinforcement":
        if stats.get("reinforcement_lines", 0) != lines:
            raise Problem.at(
                "/training_file",
                f"{lines - stats.get('reinforcement_lines', 0)} of its {lines} lines do not end with a user message: "
                "a reinforcement file's messages are the prompt the model answers",
            )
    if kind == "supervised" and stats.get("supervised_lines", 0) != lines:
        raise Problem.at(
            "/training_file",
            f"{lines - stats.get('supervised_lines', 0)} of its {lines} lines do not end with a user message and "
            "the assistant's answer to learn (a supervised line's last message is its target)",
        )
    spec_dict, mapping = to_spec(body, lines, settings.fine_tuning.generation_backend, validation_lines)
    aliases = settings.fine_tuning.model_aliases
    spec_dict["model"] = trainable_model(body.model, aliases)
    if kind == "reinforcement" and body.method is not None and body.method.reinforcement is not None:
        judged = grading_models_mapped(body.method.reinforcement.grader, aliases, "/method/reinforcement/grader")
        spec_dict["rewards"][0]["grader"] = judged.model_dump(mode="json")
    try:
        spec = parse_spec(spec_dict)
    except ValidationError as e:  # e.g. a model reference mathrl cannot load
        err = e.errors()[0]
        where = "/" + "/".join(str(p) for p in err["loc"] if not str(p).startswith(("grpo", "sft")))
        pointer = {"/model": "/model", "/rewards/0/grader": "/method/reinforcement/grader"}.get(where, where)
        raise Problem.at(pointer, err["msg"]) from None
    check_job_refs(session, caller.project_id, model_refs(spec))
    config = admit({"": spec}, settings)[""]
    config.openai = FineTuningRecord(
        request=body.model_dump(mode="json", exclude_none=True), mapping=mapping
    ).model_dump(mode="json")
    job = job_row(caller.project_id, spec, config, settings, idempotency_key=idempotency_key, request_hash=digest)
    message = f"queued on '{job.queue}' by POST /v1/fine_tuning/jobs"
    return job_object(session, submit_keyed(session, settings, caller.project_id, job, message, response))


def metadata_filter(request: Request) -> dict[str, str]:
    """The `metadata[key]=value` query parameters, as a dict (a 400 naming one that is not)."""
    wanted: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name.startswith("metadata"):
            key = name.removeprefix("metadata[").removesuffix("]")
            if not name.startswith("metadata[") or not name.endswith("]") or not key or len(key) > 64:
                raise Problem.at(f"query:/{name}", "filter by metadata as metadata[key]=value", status=400)
            wanted[key] = value
    return wanted


def _metadata(job: Job) -> dict[str, Any]:
    return dict(FineTuningRecord.of(job).request.get("metadata") or {})


@router.get("", responses={400: {"description": "`after` is not a fine-tuning job id."}})
def list_jobs(
    request: Request,
    caller: CallerDep,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    """The project's fine-tuning jobs, newest first; `after` a job id of the previous page;
    `metadata[key]=value` (what the SDK's `metadata={...}` sends): only jobs created with those."""
    wanted = metadata_filter(request)
    q = FT_JOBS.newest_first(session, caller.project_id, after)
    # filtered by the database, no scan ('null' would be SQL's NULL in PostgreSQL's path array)
    for key in [k for k in wanted if SQL_METADATA_KEY.fullmatch(k) and k.lower() != "null"]:
        stored = Job.resolved_config[("openai", "request", "metadata", key)].as_string()
        q = q.where(stored == wanted.pop(key))
    capped = False
    if wanted:  # the request's metadata is in the stored config: read in batches until the page is full,
        # by the id (OFFSET read every skipped row again) and at most METADATA_SCAN rows a request
        rows, batch, scanned, last = [], 500, 0, None
        while True:
            chunk = list(session.scalars((q if last is None else q.where(Job.id < last)).limit(batch)))
            rows += [j for j in chunk if wanted.items() <= _metadata(j).items()]
            scanned, last = scanned + len(chunk), chunk[-1].id if chunk else last
            if len(rows) > limit or len(chunk) < batch:
                break
            if scanned >= METADATA_SCAN:  # the page so far, and has_more: the next page reads on from it
                capped = True
                break
    else:
        rows = list(session.scalars(q.limit(limit + 1)))
    page = rows[:limit]
    tokens = trained_tokens(session, page)
    return listed([job_object(session, j, tokens) for j in page], len(rows) > limit or capped, cursors=False)


@router.get("/{fine_tuning_job_id}", responses={404: {"description": NOT_FOUND}})
def retrieve(fine_tuning_job_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    return job_object(session, FT_JOBS.own(session, caller.project_id, fine_tuning_job_id))


@router.post("/{fine_tuning_job_id}/cancel", responses={404: {"description": NOT_FOUND}})
def cancel(fine_tuning_job_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    """Cancel it: at once if it has not started; a running one is `cancelled` from now on, as OpenAI
    answers, and its worker starts no further step (the step under way ends, then it stops)."""
    return job_object(session, request_cancel(session, FT_JOBS.own(session, caller.project_id, fine_tuning_job_id)))


@router.post(
    "/{fine_tuning_job_id}/pause",
    responses={404: {"description": NOT_FOUND}, 409: {"description": "Neither queued nor running."}},
)
def pause(fine_tuning_job_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    """Pause it: a queued job at once; a running one is `paused` from now on, as OpenAI answers, and
    saves a checkpoint at the end of the step under way and stops (no further step starts)."""
    return job_object(session, pause_job(session, FT_JOBS.own(session, caller.project_id, fine_tuning_job_id)))


@router.post(
    "/{fine_tuning_job_id}/resume",
    responses={
        404: {"description": NOT_FOUND},
        409: {"description": "Not paused."},
        429: {"description": "Over the project's quotas."},
    },
)
def resume_paused(fine_tuning_job_id: str, caller: CallerDep, session: SessionDep, settings: SettingsDep) -> Any:
    """Resume it: queued again, it goes on from its newest checkpoint."""
    job = FT_JOBS.own(session, caller.project_id, fine_tuning_job_id)
    return job_object(session, resume_job(session, settings, job))


LEVELS = {"info": "info", "warning": "warn", "error": "error"}


@router.get("/{fine_tuning_job_id}/events", responses={404: {"description": NOT_FOUND}})
def events(
    fine_tuning_job_id: str,
    caller: CallerDep,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> dict[str, Any]:
    """The job's events, newest first (OpenAI's order); `after` an event id of the previous page."""
    job = FT_JOBS.own(session, caller.project_id, fine_tuning_job_id)
    q = select(Event).where(Event.job_id == job.id)
    if after is not None:
        m = re.match(r"^ftevent-(\d{1,18})$", after)
        if m is None:
            raise Problem(400, "Bad cursor", "query:/after: an event id from a previous page")
        q = q.where(Event.seq < int(m.group(1)))
    rows = list(session.scalars(q.order_by(Event.seq.desc()).limit(limit + 1)))
    data = [
        {
            "id": f"ftevent-{e.seq}",
            "object": "fine_tuning.job.event",
            "created_at": int(e.time.timestamp()),
            "level": LEVELS.get(e.level, "info"),
            "message": e.message,
            # a training step's metrics (trainer/callbacks.py), as OpenAI lists them: scripts plot the loss from these
            "type": "metrics" if e.type == "metrics" else "message",
            "data": dict(e.data or {}) if e.type == "metrics" else {"type": e.type, **(e.data or {})},
        }
        for e in rows[:limit]
    ]
    return listed(data, len(rows) > limit, cursors=False)


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


@router.get("/{fine_tuning_job_id}/checkpoints", responses={404: {"description": NOT_FOUND}})
def checkpoints(
    fine_tuning_job_id: str,
    caller: CallerDep,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
) -> dict[str, Any]:
    """The job's checkpoints, newest first, each with the training metrics at its step."""
    job = FT_JOBS.own(session, caller.project_id, fine_tuning_job_id)
    q = select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.kind == "checkpoint")
    if after is not None:
        m = re.match(r"^ftckpt-([0-9a-f]{32})$", after)
        if m is None:
            raise Problem(400, "Bad cursor", "query:/after: a checkpoint id from a previous page")
        mark_id = str(uuid.UUID(m.group(1)))
        mark = session.get(Checkpoint, mark_id)
        if mark is not None and mark.job_id == job.id:
            q = q.where(Checkpoint.step < mark.step)
        else:
            # the cursor's checkpoint was deleted since (models.delete while paging: the SDK's iterator goes
            # on from the page's last id): ids are uuid7s, made in the order the job saved its checkpoints,
            # so the older ones are those with smaller ids. An id of no checkpoint of this job ends no page early.
            q = q.where(Checkpoint.id < mark_id)
    rows = list(session.scalars(q.order_by(Checkpoint.step.desc()).limit(limit + 1)))
    steps = [c.step for c in rows[:limit]]
    values: dict[int, dict[str, float]] = {s: {} for s in steps}
    if steps:
        q_metrics = select(Metric.step, Metric.name, Metric.value).where(
            Metric.job_id == job.id, Metric.step.in_(steps), Metric.name.in_(OPENAI_METRICS)
        )
        for step, name, value in session.execute(q_metrics).all():
            values[step][name] = value
    data = []
    for c in rows[:limit]:
        data.append(
            {
                "id": f"ftckpt-{c.id.replace('-', '')}",
                "object": "fine_tuning.job.checkpoint",
                "created_at": int(c.created_at.timestamp()),
                "fine_tuned_model_checkpoint": fine_tuned_model(job, c.step),
                "fine_tuning_job_id": ftjob_id(job.id),
                "step_number": c.step,
                "metrics": _checkpoint_metrics(c.step, values[c.step]),
            }
        )
    return listed(data, len(rows) > limit, cursors=False)
