"""POST /v1/graders:run: try a grader (mathrl/graders.py) on given completions and answers, without
starting a job; and GET /v1/graders/runs/{job_id}.

A grader that needs no model is scored here, in the API, each call in its own short-lived processes
(evaluator/bounded.py), under the `graders` settings' limits. A grader that loads a model
(reward_model, score_model, label_model), or a text_similarity grader where this API lacks its
metrics' libraries, becomes a short 'grade' job (mathrl.specs.GradeSpec) that a worker runs, and the
route waits for it up to `wait` seconds: 200 with the scores, else 202 with the job's id (both ways:
api/grading.py). The limits, and why math-verify runs in the API: docs/using.md, "Graders"; RELIABILITY.md."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from api.deps import CallerDep, SettingsDep
from api.grading import grade_on_worker, grade_result, grades_on_worker, pending, require_sandbox, run_isolated
from api.problems import Problem
from evaluator.bounded import TIMED_OUT, warm
from evaluator.graders import grade_item
from mathrl.schemas import GraderRunPending, GraderRunRequest, GraderRunResponse


def _warm() -> None:
    warm()  # the zygote imports math-verify while the API starts, not on the first call


router = APIRouter(prefix="/v1", tags=["graders"], on_startup=[_warm])


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
        return await run_in_threadpool(pending, settings, caller.project_id, job_id)
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


@router.get(
    "/graders/runs/{job_id}",
    response_model=GraderRunResponse,
    responses={202: {"model": GraderRunPending}, 404: {}, 409: {}, 422: {}},
)
def run_result(job_id: str, caller: CallerDep, settings: SettingsDep) -> Any:
    """The results of a grader with a model, once its 'grade' job has finished (202 until then)."""
    return grade_result(settings, caller.project_id, job_id) or pending(settings, caller.project_id, job_id)
