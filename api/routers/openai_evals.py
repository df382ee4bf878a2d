"""OpenAI's Evals API, for code written against the `openai` SDK (`client.evals.*`,
`client.evals.runs.*`, `client.evals.runs.output_items.*`). An eval is a row (store.models.Eval):
its items' schema and its testing criteria, graders in OpenAI's JSON (mathrl/graders.py). A run is
a job of the project, and the run's routes are a view over it (api/openai/eval_views.py): a
`completions` or `responses` run an **eval job** over its items, sampled from its model and
scored by the criteria as one `multi` grader; a `jsonl` run a **grade job** of the given samples
(api/openai/eval_requests.py maps each request to its job). Each output item is one of the job's
samples."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Response
from sqlalchemy import select

from api.deps import CallerDep, SessionDep, SettingsDep
from api.idempotency import commit_or_replay, earlier, replayed, request_hash
from api.openai.eval_requests import (
    EvalCreateParams,
    EvalUpdateParams,
    RunCreateParams,
    check_source_config,
    criteria,
    drop_file,
    run_job,
)
from api.openai.eval_run_counts import tallies
from api.openai.eval_views import (
    NOT_FOUND,
    RUN_NOT_FOUND,
    STATUS,
    eval_object,
    eval_tag,
    job_id_of,
    output_item,
    own_eval,
    own_run,
    run_id_of,
    run_object,
    runs_of,
    samples_after,
)
from api.openai.records import EvalRunRecord
from api.openai.resource import listed
from api.problems import Problem
from api.submit import admit, check_job_refs, job_row, submit_keyed
from mathrl.modelref import uuid_after
from mathrl.specs import model_refs
from mathrl.status import TERMINAL
from store.ids import uuid7
from store.jobs import request_cancel
from store.models import Eval, Job, Sample

router = APIRouter(prefix="/v1/evals", tags=["openai: evals"])
TAG = "openai:eval_run"  # every run's job


@router.post(
    "",
    responses={
        400: {"description": "A field is invalid; the error names it."},
        409: {"description": "This Idempotency-Key was used with a different request."},
    },
)
def create_eval(
    body: EvalCreateParams,
    caller: CallerDep,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    x_stainless_retry_count: Annotated[str | None, Header(max_length=8, include_in_schema=False)] = None,
) -> Any:
    """An eval: its items' schema and the testing criteria its runs are scored by. A retry with the
    same Idempotency-Key (or the SDK's own retry, which sends none) returns the same eval."""
    digest = request_hash(body.model_dump(mode="json"))
    if existing := earlier(session, Eval, caller.project_id, idempotency_key, digest, x_stainless_retry_count):
        replayed(response)
        return eval_object(existing)
    config = check_source_config(dict(body.data_source_config))
    criteria([dict(c) for c in body.testing_criteria], settings.fine_tuning.model_aliases)  # checked now, not per run
    row = Eval(
        id="eval_" + uuid7().replace("-", ""),
        project_id=caller.project_id,
        name=body.name or "",
        data_source_config=config,
        testing_criteria=[dict(c) for c in body.testing_criteria],
        meta=body.metadata,
        idempotency_key=idempotency_key,
        request_hash=digest,
    )
    session.add(row)
    return eval_object(commit_or_replay(session, row, response)[0])


@router.get("", responses={400: {"description": "`after` is not an eval id."}})
def list_evals(
    caller: CallerDep,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], Query()] = "asc",
    order_by: Annotated[Literal["created_at", "updated_at"], Query()] = "created_at",
) -> dict[str, Any]:
    """The project's evals, oldest first by default (OpenAI's order); `after` an eval id of the
    previous page. An eval is not changed but by name and metadata: updated_at orders as created_at."""
    q = select(Eval).where(Eval.project_id == caller.project_id)
    if after is not None:
        if not after.startswith("eval_"):
            raise Problem(400, "Bad cursor", "query:/after: an eval id from a previous page")
        q = q.where(Eval.id > after if order == "asc" else Eval.id < after)
    q = q.order_by(Eval.id.asc() if order == "asc" else Eval.id.desc())
    rows = list(session.scalars(q.limit(limit + 1)))
    return listed([eval_object(r) for r in rows[:limit]], len(rows) > limit)


@router.get("/{eval_id}", responses={404: {"description": NOT_FOUND}})
def retrieve_eval(eval_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    return eval_object(own_eval(session, caller.project_id, eval_id))


@router.post("/{eval_id}", responses={404: {"description": NOT_FOUND}})
def update_eval(eval_id: str, body: EvalUpdateParams, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    """A new name or metadata (OpenAI's update); the criteria and schema stay as created."""
    row = own_eval(session, caller.project_id, eval_id)
    if body.name is not None:
        row.name = body.name
    if body.metadata is not None:
        row.meta = body.metadata
    session.commit()
    return eval_object(row)


@router.delete("/{eval_id}", responses={404: {"description": NOT_FOUND}, 409: {"description": "A run is under way."}})
def delete_eval(eval_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    """The eval goes; its runs stay as the project's jobs (tagged with its id). A 409 while a run
    has not ended: cancel it first."""
    row = own_eval(session, caller.project_id, eval_id)
    going = session.scalars(runs_of(session, caller.project_id, eval_id).where(Job.status.not_in(TERMINAL))).first()
    if going is not None:
        detail = f"run {run_id_of(going.id)} of this eval has not ended: cancel it first"
        raise Problem(409, "Conflict", detail)
    session.delete(row)
    session.commit()
    return {"object": "eval.deleted", "deleted": True, "eval_id": eval_id}


@router.post(
    "/{eval_id}/runs",
    responses={400: {"description": "A field is invalid; the error names it."}, 404: {"description": NOT_FOUND}},
)
def create_run(
    eval_id: str,
    body: RunCreateParams,
    caller: CallerDep,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    x_stainless_retry_count: Annotated[str | None, Header(max_length=8, include_in_schema=False)] = None,
) -> dict[str, Any]:
    """A run: a job of the project that samples the run's model on the items (or takes the given
    samples) and scores each by the eval's testing criteria."""
    row = own_eval(session, caller.project_id, eval_id)
    if body.data_source is None:
        raise Problem.at(
            "/data_source",
            "this field is required: {type: completions, ...}, {type: responses, ...} or {type: jsonl, ...}",
            status=400,
        )
    request = body.model_dump(mode="json", exclude_none=True)
    digest = request_hash({"eval": eval_id, **request})
    if (
        existing := earlier(session, Job, caller.project_id, idempotency_key, digest, x_stainless_retry_count)
    ) is not None:
        replayed(response)
        return run_object(session, existing)
    grader, rules = criteria(row.testing_criteria, settings.fine_tuning.model_aliases)
    tags = [TAG, eval_tag(eval_id)]
    spec, model, inline = run_job(session, settings, caller.project_id, dict(body.data_source), grader, tags, body.name)
    record = EvalRunRecord(eval_id=eval_id, request=request, criteria=rules, model=model)
    try:
        check_job_refs(session, caller.project_id, model_refs(spec))
        config = admit({"": spec}, settings)[""]
        config.openai = record.model_dump(mode="json")
        job = job_row(caller.project_id, spec, config, settings, idempotency_key=idempotency_key, request_hash=digest)
        message = f"queued on '{job.queue}' by POST /v1/evals/{eval_id}/runs"
        return run_object(session, submit_keyed(session, settings, caller.project_id, job, message, response))
    except BaseException:
        if inline is not None:
            drop_file(session, inline)
        raise


@router.get("/{eval_id}/runs", responses={404: {"description": NOT_FOUND}, 400: {"description": "Bad cursor."}})
def list_runs(
    eval_id: str,
    caller: CallerDep,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], Query()] = "asc",
    status: Annotated[Literal["queued", "in_progress", "completed", "canceled", "failed"] | None, Query()] = None,
) -> dict[str, Any]:
    own_eval(session, caller.project_id, eval_id)
    q = runs_of(session, caller.project_id, eval_id)
    if status is not None:
        q = q.where(Job.status.in_([k for k, v in STATUS.items() if v == status]))
    if after is not None:
        before = job_id_of(after)
        if before is None:
            raise Problem(400, "Bad cursor", "query:/after: a run id from a previous page")
        q = q.where(Job.id > before if order == "asc" else Job.id < before)
    rows = list(session.scalars(q.order_by(Job.id.asc() if order == "asc" else Job.id.desc()).limit(limit + 1)))
    page = rows[:limit]
    counts = tallies(session, page)  # one query per job kind for the page, not a read of every sample
    return listed([run_object(session, j, counts[j.id]) for j in page], len(rows) > limit)


@router.get("/{eval_id}/runs/{run_id}", responses={404: {"description": RUN_NOT_FOUND}})
def retrieve_run(eval_id: str, run_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    return run_object(session, own_run(session, caller.project_id, eval_id, run_id))


@router.post("/{eval_id}/runs/{run_id}/cancel", responses={404: {"description": RUN_NOT_FOUND}})
@router.post("/{eval_id}/runs/{run_id}", responses={404: {"description": RUN_NOT_FOUND}})  # OpenAI's reference's
def cancel_run(eval_id: str, run_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    """Cancel the run (OpenAI's cancel): its job is cancelled, at once if it has not started."""
    job = own_run(session, caller.project_id, eval_id, run_id)
    if job.status not in TERMINAL:
        request_cancel(session, job)
        session.commit()
        session.refresh(job)
    return run_object(session, job)


@router.delete(
    "/{eval_id}/runs/{run_id}",
    responses={404: {"description": RUN_NOT_FOUND}, 409: {"description": "The run is under way."}},
)
def delete_run(eval_id: str, run_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    """The run leaves the eval (a 409 while it runs); its job stays among the project's jobs, as
    every job does, tagged `openai:eval-deleted=<eval id>`."""
    job = own_run(session, caller.project_id, eval_id, run_id)
    if job.status not in TERMINAL:
        raise Problem(409, "Conflict", "the run has not ended: cancel it first")
    job.tags = [t if t != eval_tag(eval_id) else f"openai:eval-deleted={eval_id}" for t in job.tags or []]
    session.commit()
    return {"object": "eval.run.deleted", "deleted": True, "run_id": run_id}


@router.get("/{eval_id}/runs/{run_id}/output_items", responses={404: {"description": RUN_NOT_FOUND}})
def list_output_items(
    eval_id: str,
    run_id: str,
    caller: CallerDep,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], Query()] = "asc",
    status: Annotated[Literal["pass", "fail"] | None, Query()] = None,
) -> dict[str, Any]:
    """The run's output items, one per item (its sample and each criterion's result), once it has
    ended; `status` keeps the passed or the failed ones."""
    job = own_run(session, caller.project_id, eval_id, run_id)
    start = None
    if after is not None:
        sample_id = uuid_after("outputitem_", after)
        start = session.get(Sample, sample_id) if sample_id else None
        if start is None or start.job_id != job.id:
            raise Problem(400, "Bad cursor", "query:/after: an output item id from a previous page")
    items: list[dict[str, Any]] = []
    for sample in samples_after(session, job, order == "desc", start):
        item = output_item(job, sample, eval_id)
        if status is None or item["status"] == status:
            items.append(item)
            if len(items) > limit:
                break
    return listed(items[:limit], len(items) > limit)


@router.get("/{eval_id}/runs/{run_id}/output_items/{output_item_id}", responses={404: {"description": "No such item."}})
def retrieve_output_item(
    eval_id: str, run_id: str, output_item_id: str, caller: CallerDep, session: SessionDep
) -> dict[str, Any]:
    job = own_run(session, caller.project_id, eval_id, run_id)
    sample_id = uuid_after("outputitem_", output_item_id)
    sample = session.get(Sample, sample_id) if sample_id else None
    if sample is None or sample.job_id != job.id:
        raise Problem(404, "Not found", "no output item with this id in this run")
    return output_item(job, sample, eval_id)
