"""OpenAI's chat and text completion requests as the routes read them (POST /v1/chat/completions and
/v1/completions, and a batch's lines): every field OpenAI's SDK sends, each bounded; what is not served
is a 400 naming it. `mathrl.specs.generate.sampling_fields` turns one into a generate job's fields."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mathrl.errors import FieldError
from mathrl.specs.generate import MAX_CHOICES, MAX_TOKENS, MAX_TOP_LOGPROBS, FunctionTool, ToolCall
from mathrl.specs.response_format import ResponseFormat


class _Open(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Open):
    type: Literal["text"]
    text: str = Field(..., max_length=100_000)


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[str, Field(max_length=100_000)] | list[TextPart] | None = Field(
        None, description="The text; an assistant's may be null (read as empty)."
    )
    name: str | None = Field(None, max_length=64)
    # what an assistant message the SDK returned carries, sent back as it is by a multi-turn script
    # (messages.append(response.choices[0].message))
    refusal: str | None = Field(None, max_length=100_000, description="Accepted; not used.")
    tool_calls: Annotated[list[ToolCall], Field(max_length=64)] | None = Field(
        None, description="An assistant's: the functions it called (each answered by a tool message)."
    )
    tool_call_id: str | None = Field(None, max_length=128, description="A tool message's: the call it answers.")
    function_call: None = Field(None, description="The deprecated form: use tools and tool_calls.")
    audio: None = Field(None, description="No audio here: null.")
    annotations: Annotated[list[Any], Field(max_length=0)] | None = Field(None, description="Accepted empty.")

    @model_validator(mode="after")
    def _has_text(self) -> Message:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content)


class StreamOptions(_Open):
    include_usage: bool | None = None
    include_obfuscation: bool | None = Field(None, description="Accepted; no obfuscation field is sent.")


# what clients (LangChain, litellm, lm-eval) send at their neutral values: accepted as no-ops; any
# other value is a 400 naming the field, since nothing here would honour it
Neutral = Annotated[float, Field(ge=0, le=0)]


StopString = Annotated[str, Field(min_length=1, max_length=200)]


class SamplingParams(_Open):
    model: str = Field(..., min_length=1, max_length=512, description="An 'ft:' model of your project.")
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1, description="0: only the most likely token (greedy), as OpenAI's.")
    n: int | None = Field(None, ge=1, le=MAX_CHOICES)
    stop: StopString | Annotated[list[StopString], Field(max_length=4)] | None = None
    seed: int | None = Field(None, ge=0, le=2**32 - 1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256, description="Accepted; not used.")
    frequency_penalty: Neutral | None = Field(None, description="Only 0: no penalties here.")
    presence_penalty: Neutral | None = Field(None, description="Only 0: no penalties here.")
    logit_bias: Annotated[dict[str, float], Field(max_length=0)] | None = Field(None, description="Only empty.")
    service_tier: Annotated[str, Field(max_length=32)] | None = Field(None, description="Accepted; not used.")


class ChatCompletionParams(SamplingParams):
    messages: list[Message] = Field(..., min_length=1, max_length=256)

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionParams:
        if self.top_logprobs and not self.logprobs:  # (0 with logprobs false: a client's neutral values)
            raise FieldError("top_logprobs", "needs logprobs: true (as OpenAI's): send both, or drop top_logprobs")
        return self

    logprobs: bool | None = Field(None, description="Return each new token's log-probability (the model's own).")
    top_logprobs: int | None = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS, description="And this many most likely tokens in its place (needs logprobs)."
    )
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        None, max_length=16, description="Accepted; not stored."
    )
    store: bool | None = Field(None, description="Accepted; completions are kept as the job's samples either way.")
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None,
        description="A completion-length budget where max_completion_tokens is not given, as for fine-tuning "
        "(the models here have no reasoning-effort control): none, minimal and low 256, medium 1024, high and "
        "xhigh 4096 tokens.",
    )
    response_format: ResponseFormat | None = Field(
        None, description="text, json_object or json_schema (structured outputs: the answer decoded under the schema)."
    )
    tools: Annotated[list[FunctionTool], Field(min_length=1, max_length=128)] | None = Field(
        None,
        description="Functions the model may call, through its chat template (one that carries tools: Qwen2.5, "
        "Qwen3, SmolLM3); a call comes back as the message's tool_calls, finish_reason 'tool_calls'. Not streamed.",
    )
    tool_choice: Literal["none", "auto"] | None = Field(
        None, description="auto (the default with tools) or none; 'required' and a named function are not served."
    )
    parallel_tool_calls: bool | None = Field(None, description="Accepted: a model may write several calls.")
    prompt_cache_key: Annotated[str, Field(max_length=256)] | None = Field(None, description="Accepted; not used.")
    safety_identifier: Annotated[str, Field(max_length=256)] | None = Field(None, description="Accepted; not used.")


class CompletionParams(SamplingParams):
    prompt: Annotated[str, Field(max_length=100_000)] | list[Annotated[str, Field(max_length=100_000)]] = Field(
        ..., description="One prompt (a list of one is accepted)."
    )
    echo: Literal[False] | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionParams:
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise FieldError("prompt", "one prompt per call here: send a string (or a list of one)")
        return self

    logprobs: int | None = Field(
        None, ge=0, le=5, description="Return each new token's log-probability and this many most likely tokens."
    )
