"""OpenAI's Batch API (`client.batches.create`, `.retrieve`, `.list`, `.cancel`): a file of requests
(purpose 'batch', a request per line) answered off-line, the answers as an output file and the
failures as an error file, both files of the project.

A batch is a generate job of the project (mathrl.specs.GenerateSpec `batch`), tagged
'openai:batches', under the project's quotas. Every line is checked at create as its route checks a
call (api/openai/batch_requests.py), and all lines sample one model. The job answers each line as
a call of its own (evaluator/chat.py `run_batch`); `finish` (api/openai/batch_views.py) writes the
files at the first look after the job ended. docs/openai-rft.md, "What each route is here"."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response

from api.deps import CallerDep, SessionDep, SettingsDep
from api.idempotency import earlier, replayed, request_hash
from api.openai.batch_requests import BatchCreateParams, check_lines, read_lines
from api.openai.batch_views import BATCHES, NOT_FOUND, TAG, batch_object
from api.openai.files import own_file
from api.openai.models import default_budget, sampled_model
from api.openai.records import BatchRecord
from api.openai.resource import listed
from api.problems import Problem
from api.submit import admit, job_row, submit_keyed
from mathrl.jsonl_files import BATCH_PURPOSE
from mathrl.specs.generate import GenerateSpec
from mathrl.status import TERMINAL
from store.jobs import request_cancel
from store.models import Job

router = APIRouter(prefix="/v1/batches", tags=["openai: batches"])


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
    lines = read_lines(row.path)
    model = str(lines[0]["body"]["model"])
    try:
        ref = sampled_model(session, caller.project_id, settings, model)
    except Problem as exc:
        raise Problem.at("/input_file_id/line/1/body/model", exc.detail, status=400) from None
    budget = default_budget(session, ref) or GenerateSpec.model_fields["max_tokens"].default
    check_lines(lines, body.endpoint, settings, budget)
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
