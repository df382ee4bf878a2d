"""OpenAI's grader routes, for code written against the `openai` SDK
(`client.fine_tuning.alpha.graders.run(...)` and `.validate(...)`): POST
/v1/fine_tuning/alpha/graders/run and /validate. The graders are mathrl's (mathrl/graders.py, in
OpenAI's JSON: string_check, text_similarity, python, score_model, label_model, multi), graded in
the call's own processes within the `graders` limits as POST /v1/graders:run grades
(api/grading.py), with python graders in their sandbox (evaluator/sandbox.py). A grader
with a model in it (score_model, label_model), or a text_similarity grader where the API lacks its
libraries (the API image), is a short 'grade' job on a worker, as there, awaited up to MODEL_WAIT
seconds. Responses are shaped as OpenAI's: the reward, each named grader's
reward, and metadata with its error kinds."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.deps import CallerDep, SettingsDep
from api.grading import grade_on_worker, grades_on_worker, require_sandbox, run_isolated
from api.openai.generation_calls import under_client_timeout
from api.openai.models import grading_models_mapped
from api.problems import Problem
from config.settings import Settings
from evaluator.bounded import TIMED_OUT
from evaluator.graders import grade_openai
from mathrl.graders import Grader, GraderItem
from mathrl.shallow import JsonObject

router = APIRouter(prefix="/v1/fine_tuning/alpha/graders", tags=["openai: graders"])
ROUTE = "fine_tuning/alpha/graders/run"
MODEL_WAIT = 300.0  # seconds a call waits for the 'grade' job of a grader with a model

ERROR_KINDS = (
    "formula_parse_error",
    "invalid_variable_error",
    "model_grader_parse_error",
    "model_grader_refusal_error",
    "model_grader_server_error",
    "other_error",
    "python_grader_runtime_error",
    "python_grader_server_error",
    "sample_parse_error",
    "truncated_observation_error",
    "unresponsive_reward_error",
)


class GraderRunParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grader: Grader
    model_sample: str = Field(..., max_length=100_000, description="The model's output: `sample.output_text`.")
    item: JsonObject | None = Field(None, description="The dataset item: `item` in templates.")


class GraderValidateParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grader: Grader


@router.post("/validate", responses={422: {"description": "The grader is invalid: the detail names the field."}})
def validate(body: GraderValidateParams, caller: CallerDep, settings: SettingsDep) -> dict[str, Any]:
    """The grader as it will run, when it is valid (else a 422 naming the field): its grading models
    as the operator's aliases map them."""
    grader = grading_models_mapped(body.grader, settings.fine_tuning.model_aliases, "/grader")
    return {"grader": grader.model_dump(mode="json", exclude_none=True)}


@router.post(
    "/run",
    responses={
        422: {"description": "The grader is invalid (the detail names the field)."},
        429: {"description": "Over the project's grading calls in flight (see Retry-After)."},
        503: {"description": "The API is grading as many calls as it may at once (see Retry-After)."},
        504: {"description": "The call took over its time or CPU limit, or a grading model's job over MODEL_WAIT."},
    },
)
async def run(body: GraderRunParams, caller: CallerDep, settings: SettingsDep, request: Request) -> dict[str, Any]:
    """The reward of `model_sample` for `item` under the grader, with OpenAI's metadata. A grader
    error (a missing template variable, a python grader that raised) is a 200 with reward 0 and
    its error kind set, as OpenAI answers it."""
    limits = settings.graders
    start = time.monotonic()
    body.grader = grading_models_mapped(body.grader, settings.fine_tuning.model_aliases, "/grader")
    if grades_on_worker(body.grader):
        result = await _on_worker(body, caller.project_id, settings, under_client_timeout(request, MODEL_WAIT))
    else:
        require_sandbox(body.grader, limits)
        grader = json.dumps(body.grader.model_dump(mode="json"))
        (outcome,) = await run_isolated(
            caller.project_id, limits, grade_openai, [(grader, body.model_sample, body.item or {}, limits.sandbox())]
        )
        if outcome.error is None:
            result = outcome.value
        else:  # the item's process was killed (TIMED_OUT) or broke
            what = f"over {limits.item_timeout_seconds:g} s" if outcome.error == TIMED_OUT else outcome.error
            result = {"reward": 0.0, "error": "unresponsive_reward_error", "detail": what, "sub": {}}
    elapsed = time.monotonic() - start
    errors: dict[str, Any] = {kind: False for kind in ERROR_KINDS}
    errors |= {"model_grader_server_error_details": None, "python_grader_runtime_error_details": None}
    errors["python_grader_server_error_type"] = None
    kind = result["error"]
    if kind:
        errors[kind if kind in ERROR_KINDS else "other_error"] = True
        if kind == "python_grader_runtime_error":
            errors["python_grader_runtime_error_details"] = result["detail"]
        if kind == "python_grader_server_error":
            errors["python_grader_server_error_type"] = (result["detail"] or "").split(":")[0] or "error"
        if kind.startswith("model_grader"):  # the one field OpenAI's schema has for a grading model's why
            errors["model_grader_server_error_details"] = result["detail"]
    name = getattr(body.grader, "name", None) or body.grader.type
    sub = result["sub"] or {name: result["reward"]}
    return {
        "reward": result["reward"],
        "sub_rewards": sub,
        "metadata": {
            "name": name,
            "type": body.grader.type,
            "errors": errors,
            "execution_time": round(elapsed, 4),
            "scores": sub,
            "token_usage": None,
            "sampled_model_name": None,
        },
        "model_grader_token_usage_per_model": {},
    }


def _item(sample: str, answer: str | None, item: dict[str, Any]) -> GraderItem:
    """The one sample as a grade job's item; a 422 at the request's own field where it is over a limit."""
    try:
        return GraderItem(completion=sample, answer=answer, fields=item)
    except ValidationError as exc:  # e.g. an answer over 10,000 characters, an item of over 256 fields
        where = {"completion": ("model_sample",), "answer": ("item", "answer"), "fields": ("item",)}
        errors = [{**e, "loc": ("body", *where.get(str(e["loc"][0]), ()), *e["loc"][1:])} for e in exc.errors()]
        raise RequestValidationError(errors) from None


async def _on_worker(body: GraderRunParams, project_id: str, settings: Settings, wait: float) -> dict[str, Any]:
    """The grade job's result for the one sample, as grade_openai gives it; 504 past `wait` (MODEL_WAIT, under
    the client's own read timeout: a client that timed out first would send the call again as a new job)."""
    item = body.item or {}
    answer = item.get("answer") if isinstance(item.get("answer"), str) else None
    one = _item(body.model_sample, answer, item)
    job_id, done = await grade_on_worker(project_id, settings, body.grader, [one], None, wait, ROUTE)
    if done is None:
        detail = f"the grading job {job_id} did not finish in {wait:g} s: GET /v1/graders/runs/{job_id} later"
        raise Problem(504, "Grader timed out", detail)
    (row,) = done["rows"]
    return {"reward": row["score"], "error": row.get("error"), "detail": row["reason"], "sub": row.get("sub") or {}}
