"""OpenAI's Batch API (`client.batches.create`, `.retrieve`, `.list`, `.cancel`): a file of requests
(purpose 'batch', a request per line) answered off-line, the answers as an output file and the
failures as an error file, both files of the project.

A batch is a generate job of the project (mathrl.specs.GenerateSpec `batch`), tagged
'openai:batches', under the project's quotas. Every line is checked at create as its route checks a
call (api/routers/openai_inference.py), and all lines sample one model. The job answers each line as
a call of its own (evaluator/chat.py `run_batch`); `finish` writes the files at the first look after
the job ended. docs/openai-rft.md, "What each route is here"."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.admission import check_job_limits
from api.deps import CallerDep, SessionDep, SettingsDep
from api.idempotency import earlier, replayed, request_hash
from api.openai.chat_params import ChatCompletionParams, CompletionParams
from api.openai.files import own_file, store_jsonl
from api.openai.models import sampled_model
from api.openai.records import BatchRecord
from api.openai.resource import JobResource, listed
from api.problems import Problem, validation_errors
from api.routers.openai_inference import completion_object
from api.routers.openai_models import default_budget
from api.submit import admit, job_row, submit_keyed
from config.settings import Settings
from kinds import home
from mathrl.jsonl_files import BATCH_PURPOSE
from mathrl.modelref import results_file_id
from mathrl.shallow import JsonObject
from mathrl.specs.generate import CHAT_ENDPOINT, GenerateSpec, sampling_fields
from mathrl.status import TERMINAL
from store.files import OverQuota
from store.jobs import request_cancel
from store.models import File, Job, Sample

router = APIRouter(prefix="/v1/batches", tags=["openai: batches"])

TAG = "openai:batches"
NOT_FOUND = "No batch with this id in your project."
OUTPUT_PURPOSE = "batch_output"  # OpenAI's purpose of a batch's output and error files
WINDOW = timedelta(hours=24)


class _Open(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BatchCreateParams(_Open):
    input_file_id: str = Field(..., max_length=64, description="A file of this project of purpose 'batch'.")
    endpoint: Literal["/v1/chat/completions", "/v1/completions"]
    completion_window: Literal["24h"] = Field(..., description="OpenAI's only value; the job runs until it ends.")
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        None, max_length=16
    )
    output_expires_after: JsonObject | None = Field(None, description="Accepted; the output files do not expire.")


BATCHES = JobResource(
    "batch_", TAG, NOT_FOUND, "batch",
    statuses={"waiting": "validating", "queued": "validating", "paused": "validating", "running": "in_progress",
              "succeeded": "completed", "failed": "failed", "cancelled": "cancelled"},
    stopping="cancelling",
)  # fmt: skip


def _output_ids(job_id: str) -> tuple[str, str]:
    """The output and error files' ids: 'file-' and the job's id (as a fine-tuning job's results
    file: never another file's), and one drawn from it."""
    return results_file_id(job_id), "file-" + uuid.uuid5(uuid.UUID(job_id), "errors").hex


def _lines(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _check_lines(lines: list[dict[str, Any]], endpoint: str, settings: Settings, budget: int) -> None:
    """Each line's request as its route would check it (a 400 naming the line and the field), as
    the job will run it (`budget`: max_tokens where a line names none), all of one model."""
    chat = endpoint == CHAT_ENDPOINT
    params: type[BaseModel] = ChatCompletionParams if chat else CompletionParams
    model: str | None = None
    for n, line in enumerate(lines, start=1):
        at = f"/input_file_id/line/{n}"
        if line["url"] != endpoint:
            detail = f"{line['url']!r}: every line asks the batch's endpoint, {endpoint}"
            raise Problem.at(f"{at}/url", detail, status=400)
        try:
            body: Any = params.model_validate(line["body"])
        except ValidationError as exc:
            err = validation_errors(exc.errors())[0]
            raise Problem.at(f"{at}/body{err['pointer']}", err["detail"], status=400) from None
        if body.stream:
            raise Problem.at(f"{at}/body/stream", "a batch's requests are answered whole: drop stream", status=400)
        if model is None:
            model = body.model
        elif body.model != model:
            detail = f"{body.model!r}, where line 1 asks {model!r}: a batch samples one model"
            raise Problem.at(f"{at}/body/model", detail, status=400)
        try:  # what the job will make of it: the log-probabilities' bound, the operator's limits
            fields = {k: v for k, v in sampling_fields(line["body"], chat).items() if v is not None}
            call = GenerateSpec(model="org/model", **{"max_tokens": budget, **fields})
            check_job_limits(call, home(call).resolve(call), settings)
        except ValidationError as exc:
            err = validation_errors(exc.errors())[0]
            raise Problem.at(f"{at}/body{err['pointer']}", err["detail"], status=400) from None
        except Problem as exc:
            err = (exc.errors or [{}])[0]
            detail = str(err.get("detail", exc.detail))
            raise Problem.at(f"{at}/body{err.get('pointer', '')}", detail, status=400) from None


@router.post(
    "",
    responses={
        400: {"description": "A field or a line of the file is invalid: the error names it."},
        409: {"description": "This Idempotency-Key was used with a different request."},
    },
)
def create(
    body: BatchCreateParams,
    caller: CallerDep,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    x_stainless_retry_count: Annotated[str | None, Header(max_length=8, include_in_schema=False)] = None,
) -> dict[str, Any]:
    """A batch: a generate job that answers each request of the input file."""
    request = body.model_dump(mode="json", exclude_none=True)
    digest = request_hash(request)
    if existing := earlier(session, Job, caller.project_id, idempotency_key, digest, x_stainless_retry_count):
        replayed(response)
        return batch_object(session, existing, settings)
    try:
        row = own_file(session, caller.project_id, body.input_file_id)
    except Problem:
        raise Problem.at("/input_file_id", "no file with this id in your project", status=400) from None
    if row.purpose != BATCH_PURPOSE:
        detail = f"a {row.purpose!r} file: a batch reads a file of requests (upload it with purpose {BATCH_PURPOSE!r})"
        raise Problem.at("/input_file_id", detail, status=400)
    if not Path(row.path).is_file():  # (its bytes lost on the volume: the operator's to mend)
        raise Problem.at("/input_file_id", "the file's content is not readable here: upload it again", status=400)
    lines = _lines(row.path)
    model = str(lines[0]["body"]["model"])
    try:
        ref = sampled_model(session, caller.project_id, settings, model)
    except Problem as exc:
        raise Problem.at("/input_file_id/line/1/body/model", exc.detail, status=400) from None
    budget = default_budget(session, ref) or GenerateSpec.model_fields["max_tokens"].default
    _check_lines(lines, body.endpoint, settings, budget)
    spec = GenerateSpec(
        model=ref,
        batch={"file": row.id, "endpoint": body.endpoint},
        max_tokens=budget,
        backend=settings.fine_tuning.inference_backend,
        name="batch",
        tags=[TAG],
        max_attempts=1,  # a retry would answer every line again
    )
    config = admit({"": spec}, settings)[""]
    config.openai = BatchRecord(request=request, model=model, total=len(lines)).model_dump(mode="json")
    job = job_row(caller.project_id, spec, config, settings, idempotency_key=idempotency_key, request_hash=digest)
    message = f"queued on '{job.queue}' by POST /v1/batches ({len(lines)} requests)"
    return batch_object(session, submit_keyed(session, settings, caller.project_id, job, message, response), settings)


def _counts(session: Session, job: Job) -> tuple[int, int]:
    """Lines stored so far (answered or failed), and of them failed (their sample holds the error)."""
    lines = select(func.count(func.distinct(Sample.step))).where(Sample.job_id == job.id)
    done = session.scalar(lines) or 0
    failed = session.scalar(lines.where(Sample.data[("error", "code")].as_string().is_not(None))) or 0
    return int(done), int(failed)


def finish(
    session: Session, job: Job, settings: Settings, counts: tuple[int, int]
) -> tuple[str | None, str | None, dict[str, Any] | None]:
    """The ended batch's output and error files (ids, None where it has no such line), written from its
    samples by the first look that finds one missing (two looks at once write the same file: the
    second finds it stored); or why they could not be (the project's file quota)."""
    output_id, error_id = _output_ids(str(job.id))
    done, failed = counts
    wanted = {output_id: done - failed > 0, error_id: failed > 0}
    if all(session.get(File, i) is not None for i, want in wanted.items() if want):
        return (output_id if wanted[output_id] else None), (error_id if wanted[error_id] else None), None
    info = BatchRecord.of(job)
    chat = (job.spec.get("batch") or {}).get("endpoint") == CHAT_ENDPOINT
    rows = session.execute(
        select(Sample.id, Sample.step, Sample.index, Sample.completion, Sample.data)
        .where(Sample.job_id == job.id)
        .order_by(Sample.step, Sample.index)
    ).all()
    by_line: dict[int, list[Any]] = {}
    for r in rows:
        by_line.setdefault(int(r.step or 0), []).append(r)
    out, err = [], []
    model = str(info.model or job.spec.get("model") or "")
    for step, got in sorted(by_line.items()):
        data = dict(got[0].data or {})
        custom, request_id = data.get("custom_id"), f"req_{str(job.id).replace('-', '')}_{step}"
        line_id = "batch_req_" + str(got[0].id).replace("-", "")
        if "error" in data:
            err.append({"id": line_id, "custom_id": custom, "response": None, "error": data["error"]})
            continue
        choices = [{"text": r.completion, **(r.data or {})} for r in got]
        answer = completion_object(str(job.id), model, choices, chat)
        answer["id"] = ("chatcmpl-" if chat else "cmpl-") + request_id.removeprefix("req_")
        response = {"status_code": 200, "request_id": request_id, "body": answer}
        out.append({"id": line_id, "custom_id": custom, "response": response, "error": None})
    written: dict[str, str | None] = {}
    for file_id, items, name in ((output_id, out, "batch_output.jsonl"), (error_id, err, "batch_errors.jsonl")):
        if not items:
            written[file_id] = None
            continue
        try:
            store_jsonl(
                session, settings, job.project_id, file_id, items, filename=name, purpose=OUTPUT_PURPOSE,
                data={"lines": len(items)},
            )  # fmt: skip
        except OverQuota as exc:
            message = f"the output files were not stored: {exc}; delete files, then retrieve the batch again"
            return None, None, {"object": "list", "data": [{"code": "file_quota", "message": message}]}
        written[file_id] = file_id
    return written[output_id], written[error_id], None


def batch_object(session: Session, job: Job, settings: Settings) -> dict[str, Any]:
    """The batch as OpenAI's object, its files written once its job has ended."""
    info = BatchRecord.of(job)
    request = info.request
    done, failed = _counts(session, job)
    status = BATCHES.status(job)
    output_id = error_id = None
    errors: dict[str, Any] | None = None
    if job.status in TERMINAL:
        output_id, error_id, errors = finish(session, job, settings, (done, failed))
    if job.status == "failed":
        failure = {"code": "batch_failed", "message": job.error or "its job failed", "param": None, "line": None}
        errors = {"object": "list", "data": [failure, *((errors or {}).get("data") or [])]}

    def at(when: Any, now: bool = True) -> int | None:
        return int(when.timestamp()) if when is not None and now else None

    created = job.created_at
    return {
        "id": BATCHES.id_of(job),
        "object": "batch",
        "endpoint": request.get("endpoint"),
        "model": info.model,
        "errors": errors,
        "input_file_id": request.get("input_file_id"),
        "completion_window": "24h",
        "status": status,
        "output_file_id": output_id,
        "error_file_id": error_id,
        "created_at": at(created),
        "in_progress_at": at(job.started_at),
        "expires_at": at(created + WINDOW),
        "finalizing_at": None,
        "completed_at": at(job.finished_at, job.status == "succeeded"),
        "failed_at": at(job.finished_at, job.status == "failed"),
        "expired_at": None,
        "cancelling_at": at(job.updated_at, bool(job.cancel_requested) and job.status in ("running", "cancelled")),
        "cancelled_at": at(job.finished_at, job.status == "cancelled"),
        "request_counts": {"total": info.total, "completed": done - failed, "failed": failed},
        "metadata": request.get("metadata") or {},
    }


@router.get("", responses={400: {"description": "`after` is not a batch id."}})
def list_batches(
    caller: CallerDep,
    session: SessionDep,
    settings: SettingsDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    """The project's batches, newest first (OpenAI's order)."""
    jobs, more = BATCHES.page(session, caller.project_id, after, limit)
    return listed([batch_object(session, j, settings) for j in jobs], more)


@router.get("/{batch_id}", responses={404: {"description": NOT_FOUND}})
def retrieve(batch_id: str, caller: CallerDep, session: SessionDep, settings: SettingsDep) -> dict[str, Any]:
    return batch_object(session, BATCHES.own(session, caller.project_id, batch_id), settings)


@router.post("/{batch_id}/cancel", responses={404: {"description": NOT_FOUND}})
def cancel(batch_id: str, caller: CallerDep, session: SessionDep, settings: SettingsDep) -> dict[str, Any]:
    """The batch's job is cancelled (at once if it has not started; between lines if it has): what it
    answered by then is its output, as OpenAI's cancelled batches' is."""
    job = BATCHES.own(session, caller.project_id, batch_id)
    if job.status not in TERMINAL:
        request_cancel(session, job)
    return batch_object(session, job, settings)
