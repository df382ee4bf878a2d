"""Sampling fine-tuned models the way the `openai` SDK does: GET /v1/models, POST
/v1/chat/completions and POST /v1/completions, for the `ft:` models of this project's fine-tuning
jobs (a job's final model, or any checkpoint: `...:ckpt-step-N`) and of its Tinker sessions (each save:
`ft:<base>:tinker:ftjob-<id>:ckpt-step-<save number>`).

Each call is a short 'generate' job (mathrl.specs.GenerateSpec) in the one job store, under the
project's quotas, tagged 'openai:inference': a worker answers it on its warm vLLM engine or with
transformers (evaluator/chat.py; `fine_tuning.inference_backend`), and the route waits for it.
With `stream`, the job stores the text as 'delta' events while it is generated and the route
relays them as OpenAI's server-sent chunks, then `data: [DONE]`. A call that outlives
`fine_tuning.inference_timeout_seconds`, or whose client goes away while streaming, cancels its
job."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.admission import QuotaProblem
from api.deps import CallerDep, SettingsDep
from api.job_wakeups import KEEPALIVE_SECONDS  # a quiet stream sends a comment line this often, as event streams do
from api.problems import Problem, validation_errors
from api.routers.openai_fine_tuning import TAG as FINE_TUNING
from api.routers.openai_fine_tuning import fine_tuned_model
from api.submit import admit, commit_and_dispatch, job_row
from config.settings import Settings
from evaluator.logprobs import as_completion_logprobs
from mathrl.errors import FieldError
from mathrl.modelref import FINAL_DELETED_TAG, ft_model_ref, split_job_ref
from mathrl.specs import GenerateSpec
from mathrl.specs.generate import MAX_CHOICES, MAX_TOKENS, MAX_TOP_LOGPROBS, FunctionTool, sampling_fields
from mathrl.specs.response_format import ResponseFormat
from mathrl.status import WAIT_ENDS
from store.db import get_sessionmaker
from store.jobs import has_tag, readers_of, request_cancel
from store.models import Checkpoint, Event, Job, Sample

router = APIRouter(prefix="/v1", tags=["openai: models and completions"])

TAG = "openai:inference"
POLL_SECONDS = 0.2
MAX_MODELS = 1000  # GET /v1/models lists the newest this many


def _not_found(name: str) -> Problem:
    detail = f"The model '{name}' does not exist or you do not have access to it."
    return Problem.at("/model", detail, "Model not found", status=404)


class _Open(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Open):
    type: Literal["text"]
    text: str = Field(..., max_length=100_000)


class CalledFunction(_Open):
    name: str = Field(..., min_length=1, max_length=64)
    arguments: str = Field(..., max_length=100_000, description="JSON text, as the model wrote it.")


class ToolCall(_Open):
    id: str = Field(..., min_length=1, max_length=128)
    type: Literal["function"]
    function: CalledFunction


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[str, Field(max_length=100_000)] | list[TextPart] | None = Field(
        None, description="The text; an assistant's may be null (read as empty)."
    )
    name: str | None = Field(None, max_length=64)
    # what an assistant message the SDK returned carries, sent back as it is by a multi-turn script
    # (messages.append(response.choices[0].message))
    refusal: str | None = Field(None, max_length=100_000, description="Accepted; not used.")
    tool_calls: Annotated[list[ToolCall], Field(max_length=64)] | None = Field(
        None, description="An assistant's: the functions it called (each answered by a tool message)."
    )
    tool_call_id: str | None = Field(None, max_length=128, description="A tool message's: the call it answers.")
    function_call: None = Field(None, description="The deprecated form: use tools and tool_calls.")
    audio: None = Field(None, description="No audio here: null.")
    annotations: Annotated[list[Any], Field(max_length=0)] | None = Field(None, description="Accepted empty.")

    @model_validator(mode="after")
    def _has_text(self) -> Message:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content)


class StreamOptions(_Open):
    include_usage: bool | None = None
    include_obfuscation: bool | None = Field(None, description="Accepted; no obfuscation field is sent.")


# what clients (LangChain, litellm, lm-eval) send at their neutral values: accepted as no-ops; any
# other value is a 400 naming the field, since nothing here would honour it
Neutral = Annotated[float, Field(ge=0, le=0)]


StopString = Annotated[str, Field(min_length=1, max_length=200)]


class _Sampling(_Open):
    model: str = Field(..., min_length=1, max_length=512, description="An 'ft:' model of your project.")
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1, description="0: only the most likely token (greedy), as OpenAI's.")
    n: int | None = Field(None, ge=1, le=MAX_CHOICES)
    stop: StopString | Annotated[list[StopString], Field(max_length=4)] | None = None
    seed: int | None = Field(None, ge=0, le=2**32 - 1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256, description="Accepted; not used.")
    frequency_penalty: Neutral | None = Field(None, description="Only 0: no penalties here.")
    presence_penalty: Neutral | None = Field(None, description="Only 0: no penalties here.")
    logit_bias: Annotated[dict[str, float], Field(max_length=0)] | None = Field(None, description="Only empty.")
    service_tier: Annotated[str, Field(max_length=32)] | None = Field(None, description="Accepted; not used.")


class ChatCompletionParams(_Sampling):
    messages: list[Message] = Field(..., min_length=1, max_length=256)

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionParams:
        if self.top_logprobs and not self.logprobs:  # (0 with logprobs false: a client's neutral values)
            raise FieldError("top_logprobs", "needs logprobs: true (as OpenAI's): send both, or drop top_logprobs")
        return self

    logprobs: bool | None = Field(None, description="Return each new token's log-probability (the model's own).")
    top_logprobs: int | None = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS, description="And this many most likely tokens in its place (needs logprobs)."
    )
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        None, max_length=16, description="Accepted; not stored."
    )
    store: bool | None = Field(None, description="Accepted; completions are kept as the job's samples either way.")
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None,
        description="A completion-length budget where max_completion_tokens is not given, as for fine-tuning "
        "(the models here have no reasoning-effort control): none, minimal and low 256, medium 1024, high and "
        "xhigh 4096 tokens.",
    )
    response_format: ResponseFormat | None = Field(
        None, description="text, json_object or json_schema (structured outputs: the answer decoded under the schema)."
    )
    tools: Annotated[list[FunctionTool], Field(min_length=1, max_length=128)] | None = Field(
        None,
        description="Functions the model may call, through its chat template (one that carries tools: Qwen2.5, "
        "Qwen3, SmolLM3); a call comes back as the message's tool_calls, finish_reason 'tool_calls'. Not streamed.",
    )
    tool_choice: Literal["none", "auto"] | None = Field(
        None, description="auto (the default with tools) or none; 'required' and a named function are not served."
    )
    parallel_tool_calls: bool | None = Field(None, description="Accepted: a model may write several calls.")
    prompt_cache_key: Annotated[str, Field(max_length=256)] | None = Field(None, description="Accepted; not used.")
    safety_identifier: Annotated[str, Field(max_length=256)] | None = Field(None, description="Accepted; not used.")


class CompletionParams(_Sampling):
    prompt: Annotated[str, Field(max_length=100_000)] | list[Annotated[str, Field(max_length=100_000)]] = Field(
        ..., description="One prompt (a list of one is accepted)."
    )
    echo: Literal[False] | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionParams:
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise FieldError("prompt", "one prompt per call here: send a string (or a list of one)")
        return self

    logprobs: int | None = Field(
        None, ge=0, le=5, description="Return each new token's log-probability and this many most likely tokens."
    )


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


QUOTA_RETRY_SECONDS = 2  # a completion call over its project's active-jobs quota: try again this soon


def sampled_model(session: Session, project_id: str, settings: Settings, model: str) -> str:
    """What a call's `model` samples: an operator's alias, its base model (a script's baseline before
    fine-tuning, under the same name it fine-tunes from); any other name an 'ft:' model of the project."""
    aliases = settings.fine_tuning.model_aliases
    return str(aliases[model]) if model in aliases else own_ft_model(session, project_id, model)


def default_budget(session: Session, ref: str) -> int | None:
    """A chat that names no max_tokens: what the model was trained to write, its fine-tuning job's
    completion budget (a reinforcement job's max_completion_length), else the generate spec's default.
    OpenAI sets no cap of its own; a fixed 256 cut a trained model's answers short."""
    job_id = split_job_ref(ref)[0]
    job = session.get(Job, job_id) if job_id else None  # (an operator's alias names a base model)
    budget = (job.resolved_config or {}).get("max_completion_length") if job is not None else None
    return budget if isinstance(budget, int) and 0 < budget <= MAX_TOKENS else None


def _names_ft_models(job: Job) -> bool:
    """A fine-tuning job's model and checkpoints, and a Tinker session's saves, have `ft:` names."""
    return job.kind == "session" or FINE_TUNING in (job.tags or [])


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
            Job.project_id == caller.project_id, has_tag(session, FINE_TUNING), Job.status == "succeeded"
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


RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "The model is not an 'ft:' model of your project (or not finished)."},
    422: {"description": "The request is invalid (the detail names the field)."},
    429: {"description": "Over the project's quota of active jobs."},
    502: {"description": "The worker could not answer (its job failed; the detail says why)."},
    504: {"description": "No answer within fine_tuning.inference_timeout_seconds (the job is cancelled)."},
}


@router.post("/chat/completions", responses=RESPONSES)
async def chat_completions(
    body: ChatCompletionParams, caller: CallerDep, settings: SettingsDep, request: Request
) -> Any:
    """The model's answer to the chat (`chat.completion`, or `chat.completion.chunk`s with `stream`)."""
    return await _answer(body, caller.project_id, settings, True, request)


@router.post("/completions", responses=RESPONSES)
async def completions(body: CompletionParams, caller: CallerDep, settings: SettingsDep, request: Request) -> Any:
    """The model's continuation of the prompt (`text_completion`), no chat template."""
    return await _answer(body, caller.project_id, settings, False, request)


async def _answer(body: _Sampling, project_id: str, settings: Settings, chat: bool, request: Request) -> Any:
    fields: dict[str, Any] = {
        **sampling_fields(body.model_dump(), chat),  # the one reading of the knobs (a batch's lines' too)
        "stream": bool(body.stream),
        "backend": settings.fine_tuning.inference_backend,
        "name": "chat.completions" if chat else "completions",
        "tags": [TAG],
        "max_attempts": 1,
    }
    job_id = await run_in_threadpool(submit_generation, project_id, settings, body.model, fields)
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = _stream(settings, job_id, body.model, chat, fields["n"], usage)
        return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    await wait_answer(settings, job_id, request)
    rows = await run_in_threadpool(choices_of, settings, job_id)
    return completion_object(job_id, body.model, rows, chat)


def submit_generation(
    project_id: str, settings: Settings, model: str, fields: dict[str, Any], openai: dict[str, Any] | None = None
) -> str:
    """The generate job of one call (its id); `openai`: what the call's route keeps of its request
    in the job's config (a response's turns, say)."""
    with get_sessionmaker(settings.database.url)() as session:
        ref = sampled_model(session, project_id, settings, model)
        if fields["max_tokens"] is None:
            fields = {**fields, "max_tokens": default_budget(session, ref)}
        try:
            spec = GenerateSpec(model=ref, **{k: v for k, v in fields.items() if v is not None})
        except ValidationError as exc:
            err = validation_errors(exc.errors())[0]
            pointer = str(err["pointer"])  # the job's field, named as OpenAI's request names it
            pointer = (
                "/tools" + pointer.removeprefix("/function_tools") if pointer.startswith("/function_tools") else pointer
            )
            raise Problem.at(pointer, err["detail"]) from None
        config = admit({"": spec}, settings)[""]
        if openai is not None:
            config.openai = openai
        job = job_row(project_id, spec, config, settings)
        session.add(job)
        where = f"/v1/{'chat/completions' if spec.messages is not None else 'completions'}"
        where = "/v1/responses" if spec.name == "responses" else where
        try:
            commit_and_dispatch(session, settings, project_id, [(job, f"queued on '{job.queue}' by POST {where}")])
        except QuotaProblem as e:
            # each call is a job: a burst of calls (asyncio.gather) meets the active-jobs quota, and a slot
            # frees within seconds. A rate limit the SDK retries after Retry-After, not a final quota.
            raise Problem(
                429, "Too many requests", f"{e.detail} (each completion call is a job of your project)",
                e.errors, {"Retry-After": str(QUOTA_RETRY_SECONDS)},
            ) from None  # fmt: skip
        return str(job.id)


def _status(settings: Settings, job_id: str) -> tuple[str, str | None]:
    with get_sessionmaker(settings.database.url)() as session:
        job = session.get(Job, job_id)
        assert job is not None  # the job this request submitted
        return job.status, job.error


def cancel_call(settings: Settings, job_id: str) -> None:
    with get_sessionmaker(settings.database.url)() as session:
        job = session.get(Job, job_id)
        if job is not None:
            request_cancel(session, job)


def wait_limit(settings: Settings, request: Request) -> float:
    """How long a completion call waits: fine_tuning.inference_timeout_seconds, under the client's own."""
    return under_client_timeout(request, float(settings.fine_tuning.inference_timeout_seconds))


def under_client_timeout(request: Request, limit: float) -> float:
    """`limit`, and under the client's own read timeout where the openai SDK says it
    (x-stainless-read-timeout), so that the client reads a 504 it does not retry instead of timing out
    itself and sending the call again as a new job."""
    try:
        theirs = float(request.headers.get("x-stainless-read-timeout", "inf"))
    except ValueError:
        return limit
    return max(1.0, min(limit, theirs - 5.0)) if math.isfinite(theirs) else limit


async def wait_answer(settings: Settings, job_id: str, request: Request) -> None:
    """Back once the job has succeeded; a 504 (job cancelled) past the wait limit, a 502 if it did not
    succeed. A client that has gone away cancels the job: no one would read its answer."""
    limit = wait_limit(settings, request)
    deadline = time.monotonic() + limit
    while True:
        status, error = await run_in_threadpool(_status, settings, job_id)
        if status in WAIT_ENDS:
            break
        if await request.is_disconnected():
            await run_in_threadpool(cancel_call, settings, job_id)
            raise Problem(499, "Client closed request", f"job {job_id} cancelled: the client went away")
        if time.monotonic() >= deadline:
            await run_in_threadpool(cancel_call, settings, job_id)
            raise Problem(504, "Completion timed out", f"job {job_id} did not answer in {limit:g} s: cancelled")
        await asyncio.sleep(POLL_SECONDS)
    if status == "paused":
        raise Problem(409, "Completion paused", f"job {job_id} was paused before it answered: call again")
    if status != "succeeded":
        raise Problem(502, "Completion failed", f"job {job_id} {status}: {error or 'no error recorded'}")


def choices_of(settings: Settings, job_id: str) -> list[dict[str, Any]]:
    with get_sessionmaker(settings.database.url)() as session:
        rows = session.scalars(select(Sample).where(Sample.job_id == job_id).order_by(Sample.index)).all()
        return [{"text": r.completion, **(r.data or {})} for r in rows]


def _usage(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """OpenAI's usage object, its token details included (the prompt's tokens a warm engine's prefix cache
    held, and zeros: no reasoning split, no audio): the SDK types them optional, and scripts read
    `usage.completion_tokens_details.reasoning_tokens`."""
    prompt = int(rows[0].get("prompt_tokens", 0)) if rows else 0
    cached = int(rows[0].get("cached_tokens", 0)) if rows else 0
    completion = sum(int(r.get("completion_tokens", 0)) for r in rows)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
    }


def _completion_id(job_id: str, chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + job_id.replace("-", "")


def logprobs_of(row: dict[str, Any], chat: bool) -> dict[str, Any] | None:
    """A choice's `logprobs`, in the shape of its route, where the call asked for them (else None)."""
    tokens = row.get("logprobs")
    if tokens is None:
        return None
    return {"content": tokens, "refusal": None} if chat else as_completion_logprobs(tokens)


def _message(row: dict[str, Any]) -> dict[str, Any]:
    """A choice's assistant message: its text, and the functions it called (content null where it only called)."""
    calls = row.get("tool_calls")
    if not calls:
        return {"role": "assistant", "content": row["text"], "refusal": None}
    return {"role": "assistant", "content": row["text"] or None, "refusal": None, "tool_calls": calls}


def completion_object(job_id: str, model: str, rows: list[dict[str, Any]], chat: bool) -> dict[str, Any]:
    """A call's answer as OpenAI's chat.completion or text_completion object (its choices: the job's samples)."""
    base = {"id": _completion_id(job_id, chat), "created": int(time.time()), "model": model, "usage": _usage(rows)}
    if chat:
        choices = [
            {
                "index": r["index"],
                "message": _message(r),
                "finish_reason": r["finish_reason"],
                "logprobs": logprobs_of(r, chat),
            }
            for r in rows
        ]
        return {**base, "object": "chat.completion", "choices": choices, "system_fingerprint": None}
    choices = [
        {"index": r["index"], "text": r["text"], "finish_reason": r["finish_reason"], "logprobs": logprobs_of(r, chat)}
        for r in rows
    ]
    return {**base, "object": "text_completion", "choices": choices}


def progress_of(
    settings: Settings, job_id: str, after: int
) -> tuple[str, str | None, list[tuple[int, dict[str, Any]]]]:
    """The job's status and error, then its 'delta' events after `after`: one session a poll
    (read in that order, so a job seen ended has all its deltas read too)."""
    with get_sessionmaker(settings.database.url)() as session:
        job = session.get(Job, job_id)
        assert job is not None  # the job this request submitted
        q = select(Event.seq, Event.data).where(Event.job_id == job_id, Event.type == "delta", Event.seq > after)
        deltas = [(seq, data or {}) for seq, data in session.execute(q.order_by(Event.seq)).all()]
        return job.status, job.error, deltas


class FollowedCall:
    """A streamed call's job, followed as it answers: `async with FollowedCall(...) as call`, then
    `async for data in call` gives each stored delta's data, and None where a keep-alive is due (a
    comment line: a client's read timeout, the SDK's timeout=60, is per read, and a first token can
    be minutes away while an engine starts). It ends when the job ends (`status`, `error`) or the
    call's time runs out (the job cancelled, `status` 'timeout'). Left before either (the client went
    away, whatever the stream was sending), the job is cancelled: no one would read its answer."""

    def __init__(self, settings: Settings, job_id: str) -> None:
        self.settings, self.job_id = settings, job_id
        self.status = ""
        self.error: str | None = None

    async def __aenter__(self) -> FollowedCall:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.status:
            await asyncio.shield(run_in_threadpool(cancel_call, self.settings, self.job_id))

    async def __aiter__(self) -> AsyncIterator[dict[str, Any] | None]:
        last = 0
        deadline = time.monotonic() + self.settings.fine_tuning.inference_timeout_seconds
        sent = time.monotonic()
        while True:
            status, error, deltas = await run_in_threadpool(progress_of, self.settings, self.job_id, last)
            for seq, data in deltas:
                last, sent = seq, time.monotonic()
                yield data
            if status in WAIT_ENDS:
                self.status, self.error = status, error
                return
            if time.monotonic() - sent >= KEEPALIVE_SECONDS:
                sent = time.monotonic()
                yield None
            if time.monotonic() >= deadline:
                await run_in_threadpool(cancel_call, self.settings, self.job_id)
                self.status = "timeout"
                return
            await asyncio.sleep(POLL_SECONDS)


async def _stream(settings: Settings, job_id: str, model: str, chat: bool, n: int, usage: bool) -> AsyncIterator[str]:
    """OpenAI's server-sent chunks of the job's text as it is stored, the finish reasons, the
    usage if asked, then [DONE]; an error chunk if the job fails or times out."""
    created = int(time.time())
    head = {"id": _completion_id(job_id, chat), "created": created, "model": model}
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(index: int, text: str | None, finish: str | None = None, role: bool = False, logprobs: Any = None) -> str:
        if chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        else:
            choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
        return "data: " + json.dumps({**head, "object": kind, "choices": [choice]}) + "\n\n"

    def error(message: str, code: str) -> str:
        return "data: " + json.dumps({"error": {"message": message, "type": "server_error", "code": code}}) + "\n\n"

    async with FollowedCall(settings, job_id) as call:
        if chat:
            for i in range(n):
                yield chunk(i, "", role=True)
        async for data in call:
            yield ": keep-alive\n\n" if data is None else chunk(int(data.get("index", 0)), str(data.get("text", "")))
    if call.status == "timeout":
        yield error(f"job {job_id} did not answer in time: cancelled", "timeout")
        return
    if call.status == "paused":
        yield error(f"job {job_id} was paused before it answered: call again", "job_paused")
        return
    if call.status != "succeeded":
        yield error(f"job {job_id} {call.status}: {call.error or 'no error recorded'}", "job_failed")
        return
    rows = await run_in_threadpool(choices_of, settings, job_id)
    for r in rows:  # the choice's log-probabilities, asked for, come whole with its last chunk
        yield chunk(r["index"], None if chat else "", r["finish_reason"], logprobs=logprobs_of(r, chat))
    if usage:
        yield "data: " + json.dumps({**head, "object": kind, "choices": [], "usage": _usage(rows)}) + "\n\n"
    yield "data: [DONE]\n\n"
