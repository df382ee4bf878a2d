"""Grading a call's items the way the graders routes do (api/routers/graders.py, and OpenAI's in
api/routers/openai_graders.py): in the API, each call in its own short-lived processes within the
`graders` limits and the project's slots (`run_isolated`), a python grader only where its sandbox
can run (`require_sandbox`); or, for a grader with a model (`grades_on_worker`), as a short 'grade'
job on a worker (`grade_on_worker`), its scores read back when it ends (`grade_result`, `pending`
while it runs)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import defaultdict
from typing import Any

from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.deps import owned
from api.problems import Problem
from api.submit import admit, check_job_refs, commit_and_dispatch, job_row
from config.settings import Settings
from evaluator import similarity
from evaluator.bounded import CPU, DEADLINE, run_bounded
from mathrl.graders import needs_model, runs_code, uses_similarity
from mathrl.schemas import GraderRunPending
from mathrl.specs import GradeSpec, Resources, model_refs
from store.db import get_sessionmaker
from store.models import Job, Sample

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
        answer = await run_in_threadpool(grade_result, settings, project_id, job_id)
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


def grade_result(settings: Settings, project_id: str, job_id: str) -> dict[str, Any] | None:
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


def pending(settings: Settings, project_id: str, job_id: str) -> JSONResponse:
    """The 202 of a grade job that has not finished: its status, and where to read its scores."""
    with get_sessionmaker(settings.database.url)() as session:
        job = _grade_job(session, project_id, job_id)
        status = job.status
    where = f"/v1/graders/runs/{job_id}"
    body = GraderRunPending(job_id=job_id, status=status, detail=f"the grading job is {status}: GET {where}")
    return JSONResponse(body.model_dump(), status_code=202, headers={"Location": where, "Retry-After": "2"})
