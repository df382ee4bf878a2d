"""POST /v1/graders:run: try a grader (mathrl/graders.py) on given completions and answers,
without starting a job, before paying for a run.

math-verify runs here, in the API, on purpose: it is pure Python (sympy and an ANTLR parser, no
torch), and a reward checked in milliseconds is worth more than one queued behind training
jobs. It runs in a one-process pool beside the API process, never in a request thread: its
parse timeouts need a process's main thread, and a pathological input cannot stall the API;
a call that overruns `GRADER_TIMEOUT` seconds is answered 504 and the pool is replaced.

A grader with a reward model in it needs the model loaded, and the API image has no torch: the
call becomes a short 'grade' job (mathrl.specs.GradeSpec; quotas and pools as for any job) that
a worker runs, and the route waits for it up to `wait` seconds: 200 with the scores, or 202 with
the job's id, whose results GET /v1/graders/runs/{job_id} gives when it has finished."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sqlalchemy import select

from api.deps import CallerDep, SettingsDep, owned
from api.problems import Problem
from api.submit import admit, commit_and_dispatch, job_row
from mathrl.graders import needs_model
from mathrl.schemas import GraderRunPending, GraderRunRequest, GraderRunResponse
from mathrl.specs import GradeSpec, Resources
from store.db import get_sessionmaker
from store.models import Job, Sample

router = APIRouter(prefix="/v1", tags=["graders"])

GRADER_TIMEOUT = 30.0
_pool: concurrent.futures.ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


def _get_pool() -> concurrent.futures.ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            import multiprocessing

            spawn = multiprocessing.get_context("spawn")  # not a fork of the API's threads and sockets
            _pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=spawn)
            atexit.register(_drop_pool)  # shut down before the interpreter tears the pool's module down
        return _pool


def _drop_pool() -> None:
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()  # a hung parse: its process goes, a fresh one serves the next call
        pool.shutdown(wait=False, cancel_futures=True)


def run_grader(body: dict[str, Any]) -> list[tuple[float, str]]:
    """In the pool's process: grade the items (the request validated again, from plain data)."""
    from evaluator.graders import grade_items

    req = GraderRunRequest.model_validate(body)
    results = grade_items(
        req.grader,
        [i.completion for i in req.items],
        [i.answer for i in req.items],
        prompts=[i.prompt for i in req.items],
    )
    return [(r.score, r.reason) for r in results]


@router.post(
    "/graders:run",
    response_model=GraderRunResponse,
    responses={
        202: {"model": GraderRunPending, "description": "A reward-model grader's job has not finished within `wait`."},
        422: {},
        429: {"description": "A reward-model grader's job is over the project's quota."},
        504: {},
    },
)
async def run(
    body: GraderRunRequest,
    caller: CallerDep,
    settings: SettingsDep,
    wait: Annotated[
        float, Query(ge=0, le=300, description="Reward-model graders: seconds to wait for the worker's job.")
    ] = 60.0,
) -> Any:
    """Each item's score and the reason for it, and their mean. Nothing is stored, except for a
    grader with a reward model, which runs as a 'grade' job on a worker (see the module's text)."""
    if needs_model(body.grader):
        spec = GradeSpec(grader=body.grader, items=body.items, resources=body.resources or Resources())
        job_id = await run_in_threadpool(_submit, spec, caller.project_id, settings)
        deadline = time.monotonic() + wait
        while True:
            answer = await run_in_threadpool(_grade_result, settings, caller.project_id, job_id)
            if answer is not None or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.25)
        return answer or await run_in_threadpool(_pending, settings, caller.project_id, job_id)
    if body.resources is not None:
        detail = "resources is for graders with a reward model (they run on a worker); this one runs here: remove it"
        raise Problem(422, "Invalid field", f"/resources: {detail}", [{"pointer": "/resources", "detail": detail}])
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(_get_pool(), run_grader, body.model_dump(mode="json"))
    try:
        results = await asyncio.wait_for(future, GRADER_TIMEOUT)
    except TimeoutError:
        _drop_pool()
        raise Problem(504, "Grader timed out", f"grading took over {GRADER_TIMEOUT:g} s: send fewer items") from None
    except concurrent.futures.process.BrokenProcessPool:
        _drop_pool()
        detail = "the grading process died: retry"
        raise Problem(503, "Grader unavailable", detail, headers={"Retry-After": "1"}) from None
    data = [{"score": s, "reason": r} for s, r in results]
    return {"data": data, "mean": sum(s for s, _ in results) / len(results)}


@router.get(
    "/graders/runs/{job_id}",
    response_model=GraderRunResponse,
    responses={202: {"model": GraderRunPending}, 404: {}, 409: {}, 422: {}},
)
def run_result(job_id: str, caller: CallerDep, settings: SettingsDep) -> Any:
    """A reward-model grader's results, once its 'grade' job has finished (202 until then)."""
    return _grade_result(settings, caller.project_id, job_id) or _pending(settings, caller.project_id, job_id)


def _submit(spec: GradeSpec, project_id: str, settings: Any) -> str:
    with get_sessionmaker(settings.database.url)() as session:
        config = admit({"": spec}, settings)[""]
        job = job_row(project_id, spec, config, name="graders:run")
        session.add(job)
        commit_and_dispatch(session, settings, project_id, [(job, f"queued on '{job.queue}' by POST /v1/graders:run")])
        return job.id


def _grade_job(session: Any, project_id: str, job_id: str) -> Job:
    job = owned(session, Job, project_id, job_id, "no grading run with this id in your project")
    if job.kind != "grade":
        raise Problem(404, "Not found", "no grading run with this id in your project")
    return job


def _grade_result(settings: Any, project_id: str, job_id: str) -> dict[str, Any] | None:
    """The scores of a finished grade job; None while it has not finished; a problem if it failed."""
    with get_sessionmaker(settings.database.url)() as session:
        job = _grade_job(session, project_id, job_id)
        if job.status == "succeeded":
            rows = session.scalars(select(Sample).where(Sample.job_id == job_id).order_by(Sample.index)).all()
            data = [{"score": r.data["score"], "reason": r.data["reason"]} for r in rows if r.data]
            return {"data": data, "mean": sum(d["score"] for d in data) / max(len(data), 1), "job_id": job_id}
        if job.status == "failed":
            detail = f"the grading job {job_id} failed: {job.error}"
            raise Problem(422, "Grading failed", f"/grader: {detail}", [{"pointer": "/grader", "detail": detail}])
        if job.status == "cancelled":
            raise Problem(409, "Grading cancelled", f"the grading job {job_id} was cancelled")
        return None


def _pending(settings: Any, project_id: str, job_id: str) -> JSONResponse:
    with get_sessionmaker(settings.database.url)() as session:
        job = _grade_job(session, project_id, job_id)
        status = job.status
    where = f"/v1/graders/runs/{job_id}"
    body = GraderRunPending(job_id=job_id, status=status, detail=f"the grading job is {status}: GET {where}")
    return JSONResponse(body.model_dump(), status_code=202, headers={"Location": where, "Retry-After": "2"})
