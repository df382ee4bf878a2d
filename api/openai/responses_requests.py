"""A response's request (OpenAI's Responses API, api/routers/openai_responses.py), checked and submitted
as the generate job it is: `ResponseParams` (text only: no tools, files, images or reasoning items,
a 400 naming the field), the conversation it answers with the previous responses' turns, and
`submit_response`, a refused field named as this request names it (`input`, `max_output_tokens`,
`text.format`), not as the generate spec does."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.openai.generation_calls import TAG, submit_generation
from api.openai.records import ResponseRecord
from api.openai.responses_views import RESPONSE_JOBS, RESPONSES_TAG, UNSTORED_TAG
from api.problems import Problem
from config.settings import Settings
from mathrl.errors import FieldError
from mathrl.specs.generate import MAX_TOKENS, MAX_TOP_LOGPROBS, effort_budget
from store.db import get_sessionmaker
from store.models import Sample

MAX_TURNS = 256  # messages in one conversation, previous responses' included


class _Open(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputText(_Open):
    type: Literal["input_text", "output_text"]
    text: str = Field(..., max_length=100_000)
    annotations: Annotated[list[Any], Field(max_length=0)] | None = Field(None, description="Accepted empty.")
    # an output text sent back as the SDK returned it: its log-probabilities, where asked for, are not read
    logprobs: Annotated[list[Any], Field(max_length=MAX_TOKENS)] | None = Field(None, description="Accepted; not used.")


class InputMessage(_Open):
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[str, Field(max_length=100_000)] | Annotated[list[InputText], Field(min_length=1, max_length=64)]
    type: Literal["message"] | None = None
    # what an output message the SDK returned carries, sent back as it is by a multi-turn script
    id: str | None = Field(None, max_length=128, description="Accepted; not used.")
    status: str | None = Field(None, max_length=32, description="Accepted; not used.")

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class TextFormat(_Open):
    """The Responses API's format: chat's response_format with its json_schema's fields flattened."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)

    type: Literal["text", "json_object", "json_schema"] = Field(..., description="What the answer must be.")
    name: str | None = Field(None, max_length=64, description="json_schema: the format's name.")
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="json_schema: the JSON Schema.")
    description: str | None = Field(None, max_length=10_000, description="json_schema: what it is for.")
    strict: bool | None = Field(None, description="json_schema: OpenAI's strict mode.")

    def as_response_format(self) -> dict[str, Any]:
        """The same format as a chat's response_format (mathrl/specs/response_format.py checks it)."""
        if self.type != "json_schema":
            return {"type": self.type}
        schema = {"name": self.name, "schema": self.schema_, "description": self.description, "strict": self.strict}
        return {"type": "json_schema", "json_schema": {k: v for k, v in schema.items() if v is not None}}


class TextConfig(_Open):
    format: TextFormat | None = None
    verbosity: str | None = Field(None, max_length=16, description="Accepted; not used.")


class Reasoning(_Open):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None, description="A length budget where max_output_tokens is not given, as for chat completions."
    )
    summary: Literal["auto", "concise", "detailed"] | None = Field(None, description="Accepted; none is written.")


class ResponseParams(_Open):
    model: str = Field(..., min_length=1, max_length=512, description="An 'ft:' model of your project, or an alias.")
    input: (
        Annotated[str, Field(max_length=100_000)]
        | Annotated[list[InputMessage], Field(min_length=1, max_length=MAX_TURNS)]
    )
    instructions: str | None = Field(None, max_length=100_000, description="A system message first; not carried on.")
    previous_response_id: str | None = Field(None, max_length=64, description="A response of yours to go on from.")
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    stream: bool | None = None
    store: bool | None = Field(
        None, description="false: the response is not retrievable once answered (its job stays, as every job does)."
    )
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        None, max_length=16
    )
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    tools: Annotated[list[Any], Field(max_length=0)] | None = Field(None, description="No tools here: only empty.")
    tool_choice: Literal["none", "auto"] | None = Field(None, description="No tools here.")
    parallel_tool_calls: bool | None = Field(None, description="Accepted; no tools here.")
    truncation: Literal["disabled"] | None = None
    include: Annotated[list[Literal["message.output_text.logprobs"]], Field(max_length=1)] | None = Field(
        None, description="Only the output text's log-probabilities (the model's own, as chat completions')."
    )
    top_logprobs: int | None = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS, description="With them, this many most likely tokens in each token's place."
    )
    user: str | None = Field(None, max_length=256, description="Accepted; not used.")
    service_tier: str | None = Field(None, max_length=32, description="Accepted; not used.")
    prompt_cache_key: str | None = Field(None, max_length=256, description="Accepted; not used.")
    safety_identifier: str | None = Field(None, max_length=256, description="Accepted; not used.")
    background: bool | None = Field(
        None, description="true: answered at once, queued; retrieve it until it ends, or cancel it (not streamed)."
    )

    @model_validator(mode="after")
    def _background_is_stored(self) -> ResponseParams:
        if self.background and self.store is False:
            raise FieldError("store", "a background response is retrieved when it ends: it needs store (true)")
        if self.background and self.stream:
            raise FieldError("stream", "a background response is not streamed here: retrieve it until it ends")
        return self


def _turns(session: Session, project_id: str, body: ResponseParams) -> list[dict[str, str]]:
    """The conversation this response answers: the previous response's (its turns and its answer),
    then this input."""
    turns: list[dict[str, str]] = []
    if body.previous_response_id is not None:
        try:
            previous = RESPONSE_JOBS.own(session, project_id, body.previous_response_id)
        except Problem:
            raise Problem.at("/previous_response_id", "no response with this id in your project", status=400) from None
        if previous.status != "succeeded":
            detail = f"that response is {previous.status}: go on from one that completed"
            raise Problem.at("/previous_response_id", detail, status=400)
        q = select(Sample.completion).where(Sample.job_id == previous.id).order_by(Sample.index).limit(1)
        answer = session.scalar(q)
        turns = [*ResponseRecord.of(previous).turns, {"role": "assistant", "content": answer or ""}]
    if isinstance(body.input, str):
        turns.append({"role": "user", "content": body.input})
    else:
        turns += [{"role": m.role, "content": m.text()} for m in body.input]
    if len(turns) > MAX_TURNS:
        raise Problem.at(
            "/input", f"{len(turns)} messages with the previous responses': at most {MAX_TURNS}", status=400
        )
    return turns


def _request(body: ResponseParams) -> dict[str, Any]:
    """What a response object repeats of its request."""
    return {
        "instructions": body.instructions,
        "metadata": body.metadata or {},
        "previous_response_id": body.previous_response_id,
        "max_output_tokens": body.max_output_tokens,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
        "user": body.user,
        "top_logprobs": body.top_logprobs or 0,
        "background": bool(body.background),
        "text": {"format": _format(body).model_dump(mode="json", exclude_none=True)},
    }


def _format(body: ResponseParams) -> TextFormat:
    return body.text.format if body.text is not None and body.text.format is not None else TextFormat(type="text")


def submit_response(project_id: str, settings: Settings, body: ResponseParams) -> str:
    """The response's generate job (its id), its conversation and what it repeats of its request kept
    in the job's config (ResponseRecord)."""
    with get_sessionmaker(settings.database.url)() as session:
        turns = _turns(session, project_id, body)
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + turns
    fields: dict[str, Any] = {
        "messages": messages,
        "max_tokens": body.max_output_tokens or effort_budget(body.reasoning.effort if body.reasoning else None),
        "temperature": 0.0 if body.top_p == 0 else 1.0 if body.temperature is None else body.temperature,
        "top_p": body.top_p or 1.0,
        "n": 1,
        "logprobs": (body.top_logprobs or 0) if body.include else None,
        "response_format": _format(body).as_response_format(),
        "stream": bool(body.stream),
        "backend": settings.fine_tuning.inference_backend,
        "name": "responses",
        "tags": [TAG, RESPONSES_TAG if body.store is not False else UNSTORED_TAG],
        "max_attempts": 1,
    }
    info = ResponseRecord(turns=turns, model=body.model, request=_request(body)).model_dump(mode="json")
    try:
        return submit_generation(project_id, settings, body.model, fields, info)
    except Problem as e:  # the generate spec's fields, named as this request names them
        first = (e.errors or [{}])[0]
        pointer, detail = str(first.get("pointer", "")), str(first.get("detail", e.detail))
        named = (
            "/input" if pointer.startswith("/messages") else "/max_output_tokens" if pointer == "/max_tokens" else None
        )
        for theirs in ("/response_format/json_schema", "/response_format"):  # flattened in text.format
            if named is None and pointer.startswith(theirs):
                named = "/text/format" + pointer.removeprefix(theirs)
        if named is None:
            raise
        raise Problem.at(named, detail.replace("response_format", "text.format"), status=400) from None
