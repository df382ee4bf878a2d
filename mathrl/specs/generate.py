"""Generation jobs (`kind: generate`): a chat or a prompt answered (the OpenAI-shaped sampling routes),
or a batch of them (OpenAI's Batch API: a file of requests). `sampling_fields` is the one reading of
an OpenAI request's sampling knobs as a generate job's fields, for the routes and a batch's lines."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from mathrl.backends import GENERATION_BACKENDS
from mathrl.errors import FieldError
from mathrl.fileref import FILE_ID_PATTERN, NamesAFile
from mathrl.jsonl_files import BATCH_PURPOSE
from mathrl.modelref import ModelRef
from mathrl.specs.base import Dtype, GenerationBackend, JobBase, StrictModel
from mathrl.specs.refs import HoldsAFile
from mathrl.specs.response_format import ResponseFormat
from mathrl.specs.tools import Tools

MAX_TOKENS = 32_768  # new tokens one call may ask for


class CalledFunction(StrictModel):
    name: str = Field(..., min_length=1, max_length=64, description="The function's name.")
    arguments: str = Field(..., max_length=100_000, description="Its arguments, as JSON text (as OpenAI sends them).")


class ToolCall(StrictModel):
    """A function call an assistant message made (OpenAI's `tool_calls` item)."""

    id: str = Field(..., min_length=1, max_length=128, description="The call's id, which the tool message answers.")
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(..., description="Who said it.")
    content: str = Field(..., max_length=100_000, description="What was said.")
    tool_calls: list[ToolCall] | None = Field(
        None, max_length=64, description="An assistant's: the functions it called (answered by tool messages)."
    )
    tool_call_id: str | None = Field(None, max_length=128, description="A tool message's: the call it answers.")

    @model_validator(mode="after")
    def _developer_is_system(self) -> ChatMessage:
        if self.role == "developer":  # OpenAI's newer name for the system message
            self.role = "system"
        if self.tool_calls is not None and self.role != "assistant":
            raise FieldError("tool_calls", "only an assistant message carries tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise FieldError("tool_call_id", "a tool message names the call it answers (tool_call_id), and only it")
        return self

    def for_template(self, names: dict[str, str]) -> dict[str, Any]:
        """The message as chat templates read it (Qwen2.5's, SmolLM3's): a call's arguments as an object, a
        tool message with its function's name (`names`: call id -> name)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"type": "function", "id": c.id, "function": {"name": c.function.name, "arguments": _args(c)}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
            if self.tool_call_id in names:
                out["name"] = names[self.tool_call_id]
        return out


def _args(call: ToolCall) -> Any:
    import json

    try:
        return json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments  # (a model's own malformed JSON, sent back as it came)


class FunctionDef(StrictModel):
    name: str = Field(..., pattern=r"^[a-zA-Z0-9_-]{1,64}$", description="The function's name (letters, digits, _ -).")
    description: str | None = Field(None, max_length=10_000, description="What it does, for the model.")
    parameters: dict[str, Any] | None = Field(
        None, max_length=64, description="Its arguments, as a JSON Schema object (its keywords)."
    )
    strict: bool | None = Field(None, description="Accepted; the arguments are the model's own JSON.")


class FunctionTool(StrictModel):
    """A function the caller runs itself (OpenAI's `tools` item): the model may call it, and the answer
    carries the call for the caller to run and send back as a tool message."""

    type: Literal["function"] = Field(..., description="Only functions.")
    function: FunctionDef


DEFAULT_MAX_TOKENS = 256  # a chat, a response or an eval run that names no length
MAX_CHOICES = 128  # OpenAI's bound on a chat's `n`
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs
# log-probabilities stored per call at most (choices x new tokens x (1 + alternatives)): a
# sample row holds them as JSON, ~60 bytes each
MAX_LOGPROB_ENTRIES = 1_000_000


REASONING_TOKENS = {"low": 256, "medium": 1024, "high": 4096}  # reasoning_effort -> a completion budget
CHAT_ENDPOINT, COMPLETIONS_ENDPOINT = "/v1/chat/completions", "/v1/completions"
MAX_BATCH_REQUESTS = 50_000  # OpenAI's bound on a batch's requests


def effort_budget(given: str | None) -> int | None:
    """A reasoning effort as a completion budget, as for fine-tuning (the models here have no
    reasoning-effort control): none, minimal and low 256 tokens, medium 1024, high and xhigh 4096."""
    effort = {"none": "low", "minimal": "low", "xhigh": "high"}.get(given or "", given)
    return REASONING_TOKENS[effort] if effort else None


def _text(content: Any) -> str:
    if content is None:  # an assistant's message may be null
        return ""
    return content if isinstance(content, str) else "\n".join(str(p["text"]) for p in content)


def _message(m: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI chat message as a generate job's: its text, and the calls it made or answers."""
    out: dict[str, Any] = {"role": m["role"], "content": _text(m.get("content"))}
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {k: c["function"][k] for k in ("name", "arguments")}}
            for c in m["tool_calls"]
        ]
    if m.get("tool_call_id") is not None:
        out["tool_call_id"] = m["tool_call_id"]
    return out


def sampling_fields(body: Mapping[str, Any], chat: bool) -> dict[str, Any]:
    """An OpenAI chat (`chat`) or text completion request, already checked by its route's model
    (api/routers/openai_inference.py), as a generate job's fields: its chat or prompt, and its
    sampling. top_p 0 keeps the most likely token alone: greedy (the engines take top_p in (0, 1]).
    max_tokens None: the model's default budget (the route's, or the batch job's)."""
    if chat:
        what: dict[str, Any] = {
            "messages": [_message(m) for m in body["messages"]],
            "function_tools": body.get("tools") or None,
            "tool_choice": body.get("tool_choice"),
            "logprobs": (body.get("top_logprobs") or 0) if body.get("logprobs") else None,
            "response_format": body.get("response_format"),
        }
        max_tokens = (
            body.get("max_completion_tokens") or body.get("max_tokens") or effort_budget(body.get("reasoning_effort"))
        )
    else:
        prompt = body["prompt"]
        what = {"prompt": prompt[0] if isinstance(prompt, list) else prompt, "logprobs": body.get("logprobs")}
        max_tokens = body.get("max_tokens") or 16
    stop = body.get("stop")
    top_p, temperature = body.get("top_p"), body.get("temperature")
    return {
        **what,
        "max_tokens": max_tokens,
        "temperature": 0.0 if top_p == 0 else 1.0 if temperature is None else temperature,
        "top_p": top_p or 1.0,
        "n": body.get("n") or 1,
        "stop": [stop] if isinstance(stop, str) else stop,
        "seed": body.get("seed"),
    }


# a batch's input file: one of purpose 'batch'
BatchFileRef = Annotated[str, NamesAFile(BATCH_PURPOSE), Field(pattern=FILE_ID_PATTERN)]


class BatchInput(HoldsAFile):
    """A batch's requests: a file of the project (purpose 'batch'), a line per request
    ({custom_id, method, url, body}), all to one endpoint; the API checked each at create."""

    file: BatchFileRef = Field(..., description="The batch input file, by its id.")
    endpoint: Literal["/v1/chat/completions", "/v1/completions"] = Field(..., description="What each line asks.")


class GenerateSpec(JobBase):
    """Answer one chat (through the model's chat template) or one plain prompt: what
    POST /v1/chat/completions and /v1/completions submit for an `ft:` model, and relay. The
    choices are stored as the job's samples; with `stream`, the text also as 'delta' events
    while it is generated (evaluator/chat.py)."""

    kind: Literal["generate"] = Field("generate", description="Answering a chat or a prompt.")
    model: ModelRef
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=256, description="The chat to answer.")
    batch: BatchInput | None = Field(
        None, description="A file of requests, each answered as its own call (OpenAI's Batch API)."
    )
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
    response_format: ResponseFormat | None = Field(
        None,
        description="What a chat's answer must be (OpenAI's structured outputs): json_object, any JSON object; "
        "json_schema, JSON its schema admits, decoded under the schema on transformers (xgrammar) and on the warm "
        "vLLM engine (its guided decoding).",
    )
    function_tools: list[FunctionTool] | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="Functions the model may call (OpenAI's chat `tools`): rendered by the model's chat template, "
        "and a call the model writes comes back as the answer's tool_calls for the caller to run. On transformers; "
        "the model's chat template must carry tools.",
    )
    tool_choice: Literal["auto", "none"] | None = Field(
        None, description="auto: the model may call a function; none: it answers in text (its calls are not read)."
    )
    backend: GenerationBackend | Literal["auto"] = Field(
        "hf", description="vllm: the worker's warm vLLM engine; auto: that engine where the worker has vLLM, else hf."
    )
    dtype: Dtype = Field("auto", description="Model weights dtype.")
    tools: Tools | None = Field(
        None,
        description="Tools the model may call mid-answer: its code runs in the python graders' sandbox and the "
        "output goes back into its context (docs/tools.md); a chat gets the format's instruction as its system "
        "text; max_tokens is then per model turn. On transformers in the job's process.",
    )

    @model_validator(mode="after")
    def _one_input(self) -> GenerateSpec:
        if [self.messages is None, self.prompt is None, self.batch is None].count(False) != 1:
            raise FieldError(
                "messages", "give one of messages (a chat), prompt (plain text) or batch (a file of requests)"
            )
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
        if self.prompt is not None and self.response_format is not None and self.response_format.constrains():
            raise FieldError("response_format", "a plain prompt is continued as text: send messages (a chat)")
        if self.backend != "auto" and GENERATION_BACKENDS[self.backend].chats is None:
            can = ", ".join(repr(n) for n, info in GENERATION_BACKENDS.items() if info.chats is not None)
            raise FieldError(
                "backend",
                f"a generate job cannot be answered with the {self.backend!r} backend, which serves eval jobs: "
                f"use one that answers calls ({can}, or 'auto')",
            )
        if self.tools is not None:
            self._check_tools()
        if self.function_tools is not None:
            self._check_function_tools()
        return self

    def _check_function_tools(self) -> None:
        """A chat's functions: the answer is read for calls once whole, on transformers."""
        why = None
        if self.messages is None:
            why = "functions are offered in a chat: send messages"
        elif self.tools is not None:
            why = "the python tool runs its calls here, functions are run by the caller: give one of tools or functions"
        elif self.stream:
            why = "an answer's function calls are read once it is whole: drop stream with tools"
        elif self.response_format is not None and self.response_format.constrains():
            why = "an answer held to a schema calls no function: drop response_format or tools"
        elif self.backend == "vllm":
            why = "function calls are answered on transformers in the job's process: use backend 'hf' or 'auto'"
        if why:
            raise FieldError("function_tools", why)

    def _check_tools(self) -> None:
        """A tool rollout runs in turns on transformers in the job's process (evaluator/tool_rollouts.py)."""
        assert self.tools is not None
        why = None
        if self.batch is not None:
            why = "a batch's requests are answered one call each, without tools: drop tools or batch"
        elif self.stream:
            why = "a rollout's text is the model's turns and the tool's outputs, stored whole: drop stream"
        elif self.logprobs is not None:
            why = "a rollout's tokens are the model's and the tool's: drop logprobs with tools"
        elif self.backend == "vllm":
            why = "tool rollouts run on transformers in the job's process, not the warm engine: use backend 'hf'"
        elif self.response_format is not None and self.response_format.constrains():
            why = "a rollout's turns are code and text, not one JSON answer: drop response_format with tools"
        elif self.tools.void_turns != "keep":
            why = "void_turns is how GRPO trains on void rollouts: drop it"
        if why:
            raise FieldError("tools", why)
