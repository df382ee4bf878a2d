"""POST /v1/graders:run: try a grader (mathrl/graders.py) on given completions and answers,
without starting a job, before paying for a run.

math-verify runs here, in the API, on purpose: it is pure Python (sympy and an ANTLR parser, no
torch), and a reward checked in milliseconds is worth more than one queued behind training
jobs. It runs in a one-process pool beside the API process, never in a request thread: its
parse timeouts need a process's main thread, and a pathological input cannot stall the API;
a call that overruns `GRADER_TIMEOUT` seconds is answered 504 and the pool is replaced.
Reward-model graders need a model and are refused here (GRPO and eval jobs run them)."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
from typing import Any

from fastapi import APIRouter

from api.deps import CallerDep
from api.problems import Problem
from mathrl.graders import needs_model
from mathrl.schemas import GraderRunRequest, GraderRunResponse

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


@router.post("/graders:run", response_model=GraderRunResponse, responses={422: {}, 504: {}})
async def run(body: GraderRunRequest, caller: CallerDep) -> dict[str, Any]:
    """Each item's score and the reason for it, and their mean. Nothing is stored."""
    if needs_model(body.grader):
        detail = (
            "reward_model graders need a model loaded on a worker: use them in a GRPO job's rewards or an eval "
            "job's grader; here, try the other graders"
        )
        raise Problem(422, "Grader needs a model", f"/grader: {detail}", [{"pointer": "/grader", "detail": detail}])
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
