"""Generation jobs (`kind: generate`): a chat or a prompt answered (the OpenAI-shaped sampling routes)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from mathrl.errors import FieldError
from mathrl.modelref import ModelRef
from mathrl.specs.base import Dtype, GenerationBackend, JobBase, StrictModel

MAX_TOKENS = 32_768  # new tokens one call may ask for


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant"] = Field(..., description="Who said it.")
    content: str = Field(..., max_length=100_000, description="What was said.")

    @model_validator(mode="after")
    def _developer_is_system(self) -> ChatMessage:
        if self.role == "developer":  # OpenAI's newer name for the system message
            self.role = "system"
        return self


DEFAULT_MAX_TOKENS = 256  # a chat, a response or an eval run that names no length
MAX_CHOICES = 128  # OpenAI's bound on a chat's `n`
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs
# log-probabilities stored per call at most (choices x new tokens x (1 + alternatives)): a
# sample row holds them as JSON, ~60 bytes each
MAX_LOGPROB_ENTRIES = 1_000_000


class GenerateSpec(JobBase):
    """Answer one chat (through the model's chat template) or one plain prompt: what
    POST /v1/chat/completions and /v1/completions submit for an `ft:` model, and relay. The
    choices are stored as the job's samples; with `stream`, the text also as 'delta' events
    while it is generated (evaluator/chat.py)."""

    kind: Literal["generate"] = Field("generate", description="Answering a chat or a prompt.")
    model: ModelRef
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=256, description="The chat to answer.")
    prompt: str | None = Field(None, max_length=100_000, description="A plain prompt to continue (no chat template).")
    max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1, le=MAX_TOKENS, description="New tokens per choice at most.")
    temperature: float = Field(1.0, ge=0, le=2, description="0: greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="Choices.")
    stop: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None, max_length=4, description="Strings that end a choice (cut off)."
    )
    seed: int | None = Field(None, ge=0, le=2**32 - 1, description="Sampling seed.")
    logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="Store each new token's log-probability and this many most likely alternatives "
        "(OpenAI's logprobs and top_logprobs); unset: none.",
    )
    stream: bool = Field(False, description="Store the text as 'delta' events while it is generated.")
    backend: GenerationBackend | Literal["auto"] = Field(
        "hf", description="vllm: the worker's warm vLLM engine; auto: that engine where the worker has vLLM, else hf."
    )
    dtype: Dtype = Field("auto", description="Model weights dtype.")

    @model_validator(mode="after")
    def _one_input(self) -> GenerateSpec:
        if (self.messages is None) == (self.prompt is None):
            raise FieldError("messages", "give either messages (a chat) or prompt (plain text), not both or neither")
        if self.logprobs is not None and self.n * self.max_tokens * (1 + self.logprobs) > MAX_LOGPROB_ENTRIES:
            raise FieldError(
                "logprobs",
                f"n x max_tokens x (1 + alternatives) is {self.n * self.max_tokens * (1 + self.logprobs):,}, "
                f"over the {MAX_LOGPROB_ENTRIES:,} log-probabilities a call may return: ask for fewer choices, "
                "tokens or alternatives",
            )
        if self.resources.nodes > 1 or (self.resources.processes or 1) > 1:
            raise FieldError(
                "resources", "a generate job runs as one process on one node: drop resources.nodes/processes"
            )
        return self
