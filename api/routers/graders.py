"""POST /v1/graders:run: try a grader (mathrl/graders.py) on given completions and answers, without
starting a job; and GET /v1/graders/runs/{job_id}.

A grader that needs no model is scored here, in the API, each call in its own short-lived processes
(evaluator/bounded.py), under the `graders` settings' limits. A grader that loads a model
(reward_model, score_model, label_model), or a text_similarity grader where this API lacks its
metrics' libraries, becomes a short 'grade' job (mathrl.specs.GradeSpec) that a worker runs, and the
route waits for it up to `wait` seconds: 200 with the scores, else 202 with the job's id. The
limits, and why math-verify runs in the API: docs/using.md, "Graders"; RELIABILITY.md."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from collections import defaultdict
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.deps import CallerDep, SettingsDep, owned
from api.problems import Problem
from api.submit import admit, check_job_refs, commit_and_dispatch, job_row
from config.settings import Settings
from evaluator import similarity
from evaluator.bounded import CPU, DEADLINE, TIMED_OUT, run_bounded, warm
from evaluator.graders import grade_item
from mathrl.graders import needs_model, runs_code, uses_similarity
from mathrl.schemas import GraderRunPending, GraderRunRequest, GraderRunResponse
from mathrl.specs import GradeSpec, Resources, model_refs
from store.db import get_sessionmaker
from store.models import Job, Sample


def _warm() -> None:
    warm()  # the zygote imports math-verify while the API starts, not on the first call


router = APIRouter(prefix="/v1", tags=["graders"], on_startup=[_warm])

_lock = threading.Lock()
_in_flight: dict[str, int] = defaultdict(int)  # project -> grading calls running in this API process
_supervisors: concurrent.futures.ThreadPoolExecutor | None = None  # the threads that watch the calls' processes


def _take_slot(project_id: str, limits: Any) -> None:
    """Count one more call in flight for the project, or refuse it (429; 503 when all are busy)."""
    with _lock:
        if _in_flight[project_id] >= limits.max_concurrent_per_project:
            detail = (
                f"your project already has {limits.max_concurrent_per_project} grading calls in flight (the limit "
                "per project): wait for one to finish, or send more items per call"
            )
            raise Problem(429, "Too many grading calls", detail, headers={"Retry-After": "1"})
        if sum(_in_flight.values()) >= limits.max_concurrent:
            detail = "the API is grading as many calls as it may at once: retry"
            raise Problem(503, "Graders busy", detail, headers={"Retry-After": "1"})
        _in_flight[project_id] += 1


def _give_slot(project_id: str) -> None:
    with _lock:
        _in_flight[project_id] -= 1
        if _in_flight[project_id] <= 0:
            del _in_flight[project_id]


def _executor(size: int) -> concurrent.futures.ThreadPoolExecutor:
    """Threads of their own (not the request threadpool, which the other routes need): at most
    `max_concurrent` calls are admitted, so none waits here."""
    global _supervisors
    with _lock:
        if _supervisors is None:
            _supervisors = concurrent.futures.ThreadPoolExecutor(max_workers=size, thread_name_prefix="grader")
        return _supervisors


async def run_isolated(project_id: str, limits: Any, fn: Any, items: list[tuple[Any, ...]]) -> list[Any]:
    """`fn(*item)` for each item in the call's own processes (evaluator/bounded.py), within the
    `graders` limits and the project's slots: the outcomes, or the problem (503, 504) that
    stopped the call."""
    _take_slot(project_id, limits)
    try:
        future = _executor(limits.max_concurrent).submit(
            run_bounded,
            fn,
            items,
            item_seconds=limits.item_timeout_seconds,
            deadline_seconds=limits.timeout_seconds,
            cpu_seconds=limits.cpu_seconds_per_call,
            memory_mb=limits.memory_mb_per_call,
        )
    except BaseException:
        _give_slot(project_id)
        raise
    future.add_done_callback(lambda _: _give_slot(project_id))  # when its processes are gone, however it ends
    try:
        batch = await asyncio.wrap_future(future)
    except OSError:  # no grading process could be started (evaluator/bounded.py starts its zygote again)
        raise Problem(
            503, "Grader unavailable", "no grading process could be started: retry", headers={"Retry-After": "1"}
        ) from None
    if batch.stopped == DEADLINE:
        raise Problem(504, "Grader timed out", f"grading took over {limits.timeout_seconds:g} s: send fewer items")
    if batch.stopped == CPU:
        detail = f"grading took over {limits.cpu_seconds_per_call:g} CPU seconds: send fewer items"
        raise Problem(504, "Grader timed out", detail)
    return list(batch.outcomes)


@router.post(
    "/graders:run",
    response_model=GraderRunResponse,
    responses={
        202: {
            "model": GraderRunPending,
            "description": "The job of a grader with a model has not finished within `wait`.",
        },
        422: {},
        429: {
            "description": "Over the project's grading calls in flight (see Retry-After), or a model "
            "grader's job is over the project's quota."
        },
        503: {"description": "The API is grading as many calls as it may at once (see Retry-After)."},
        504: {"description": "The call took over its time or CPU limit: send fewer items."},
    },
)
async def run(
    body: GraderRunRequest,
    caller: CallerDep,
    settings: SettingsDep,
    wait: Annotated[
        float, Query(ge=0, le=300, description="Graders with a model: seconds to wait for the worker's job.")
    ] = 60.0,
) -> Any:
    """Each item's score and the reason for it, and their mean. Nothing is stored, except for a
    grader that loads a model, which runs as a 'grade' job on a worker (see the module's text)."""
    if grades_on_worker(body.grader):
        job_id, answer = await grade_on_worker(
            caller.project_id, settings, body.grader, body.items, body.resources, wait
        )
        if answer:
            return answer
        return await run_in_threadpool(_pending, settings, caller.project_id, job_id)
    if body.resources is not None:
        detail = "resources is for graders that run on a worker (with a model); this one runs here: remove it"
        raise Problem.at("/resources", detail, "Invalid field")
    limits = settings.graders
    require_sandbox(body.grader, limits)
    grader = json.dumps(body.grader.model_dump(mode="json"))
    sandbox = limits.sandbox()
    outcomes = await run_isolated(
        caller.project_id,
        limits,
        grade_item,
        [(grader, i.completion, i.answer, i.prompt, i.fields, sandbox) for i in body.items],
    )
    results = []
    for o in outcomes:
        if o.error is None:
            score, reason = o.value
            results.append((float(score), str(reason)))
        elif o.error == TIMED_OUT:
            results.append((0.0, f"not scored: grading this item took over {limits.item_timeout_seconds:g} s"))
        else:
            results.append((0.0, f"not scored: {o.error}"))
    data = [{"score": s, "reason": r} for s, r in results]
    return {"data": data, "mean": sum(s for s, _ in results) / len(results)}


def grades_on_worker(grader: Any) -> bool:
    """Whether a call with this grader becomes a 'grade' job: it loads a model, or it measures text
    similarity and this API has not the libraries for it."""
    return needs_model(grader) or (uses_similarity(grader) and not similarity.available())


def require_sandbox(grader: Any, limits: Any) -> None:
    """503 where the grader runs a user's source and this server cannot sandbox it in the
    configured mode (evaluator/sandbox.py fails closed): the detail says why and what to install."""
    from evaluator.sandbox import SandboxUnavailable, check_available

    if runs_code(grader) and not limits.pool_url:  # a grading pool answers for itself (503 per call)
        try:
            check_available(limits.python_sandbox)
        except SandboxUnavailable as e:
            # a refusal of this machine's: the same answer until the operator changes it (no SDK retries)
            raise Problem(503, "Python graders unavailable", str(e), headers={"x-should-retry": "false"}) from None


@router.get(
    "/graders/runs/{job_id}",
    response_model=GraderRunResponse,
    responses={202: {"model": GraderRunPending}, 404: {}, 409: {}, 422: {}},
)
def run_result(job_id: str, caller: CallerDep, settings: SettingsDep) -> Any:
    """The results of a grader with a model, once its 'grade' job has finished (202 until then)."""
    return _grade_result(settings, caller.project_id, job_id) or _pending(settings, caller.project_id, job_id)


async def grade_on_worker(
    project_id: str,
    settings: Settings,
    grader: Any,
    items: list[Any],
    resources: Any,
    wait: float,
    route: str = "graders:run",
) -> tuple[str, dict[str, Any] | None]:
    """A grader that runs on a worker (grades_on_worker), as a 'grade' job: its id, and the scores
    when it finished within `wait` seconds (None if not yet)."""
    try:
        spec = GradeSpec(
            grader=grader,
            items=items,
            resources=resources or Resources(),
            backend=settings.fine_tuning.inference_backend,  # where grading models answer
        )
    except ValidationError as exc:  # the grade job's own rules (one process, one node): a 422 naming the field
        raise RequestValidationError(exc.errors(include_url=False)) from None
    job_id = await run_in_threadpool(_submit, spec, project_id, settings, route)
    deadline = time.monotonic() + wait
    while True:
        answer = await run_in_threadpool(_grade_result, settings, project_id, job_id)
        if answer is not None or time.monotonic() >= deadline:
            return job_id, answer
        await asyncio.sleep(0.25)


def _submit(spec: GradeSpec, project_id: str, settings: Settings, route: str) -> str:
    with get_sessionmaker(settings.database.url)() as session:
        check_job_refs(session, project_id, model_refs(spec))  # the grader's models: this project's jobs
        config = admit({"": spec}, settings)[""]
        job = job_row(project_id, spec, config, settings, name=route)
        session.add(job)
        commit_and_dispatch(session, settings, project_id, [(job, f"queued on '{job.queue}' by POST /v1/{route}")])
        return job.id


def _grade_job(session: Session, project_id: str, job_id: str) -> Job:
    job = owned(session, Job, project_id, job_id, "no grading run with this id in your project")
    if job.kind != "grade":
        raise Problem(404, "Not found", "no grading run with this id in your project")
    return job


def _grade_result(settings: Settings, project_id: str, job_id: str) -> dict[str, Any] | None:
    """The scores of a finished grade job; None while it has not finished; a problem if it failed."""
    with get_sessionmaker(settings.database.url)() as session:
        job = _grade_job(session, project_id, job_id)
        if job.status == "succeeded":
            rows = session.scalars(select(Sample).where(Sample.job_id == job_id).order_by(Sample.index)).all()
            data = [r.data for r in rows if r.data]
            mean = sum(d["score"] for d in data) / max(len(data), 1)
            return {
                "data": [{"score": d["score"], "reason": d["reason"]} for d in data],
                "mean": mean,
                "job_id": job_id,
                "rows": data,
            }
        if job.status == "failed":
            detail = f"the grading job {job_id} failed: {job.error}"
            raise Problem.at("/grader", detail, "Grading failed")
        if job.status in ("cancelled", "paused"):  # a paused one is waited on no longer (mathrl.status.WAIT_ENDS)
            raise Problem(409, f"Grading {job.status}", f"the grading job {job_id} was {job.status}")
        return None


def _pending(settings: Settings, project_id: str, job_id: str) -> JSONResponse:
    with get_sessionmaker(settings.database.url)() as session:
        job = _grade_job(session, project_id, job_id)
        status = job.status
    where = f"/v1/graders/runs/{job_id}"
    body = GraderRunPending(job_id=job_id, status=status, detail=f"the grading job is {status}: GET {where}")
    return JSONResponse(body.model_dump(), status_code=202, headers={"Location": where, "Retry-After": "2"})
