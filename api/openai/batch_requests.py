"""A batch's request (OpenAI's Batch API, api/routers/openai_batches.py), checked before its job is
stored: `BatchCreateParams`, and each line of its input file checked as its route checks a call
(api/openai/chat_params.py), as the job will run it (the default length, the operator's limits),
all of one model; a bad line a 400 naming the line and the field."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.admission import check_job_limits
from api.openai.chat_params import ChatCompletionParams, CompletionParams
from api.problems import Problem, validation_errors
from config.settings import Settings
from kinds import home
from mathrl.shallow import JsonObject
from mathrl.specs.generate import CHAT_ENDPOINT, GenerateSpec, sampling_fields


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


def read_lines(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def check_lines(lines: list[dict[str, Any]], endpoint: str, settings: Settings, budget: int) -> None:
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
