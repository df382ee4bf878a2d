"""What every backend's `Chat` is: the model a backend holds for calls (a generate job's chat or
prompt, a batch's lines, the grading models of score_model and label_model graders), as
lm-evaluation-harness's `LM` holds its model; the `Choice` a call answers, and the sample rows a
call's choices are stored as."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from evaluator.logprobs import Token

if TYPE_CHECKING:
    from evaluator.backends.hf_chat import HFChat
    from mathrl.specs import GenerateSpec
    from runtime.sink import Sink


@dataclass
class Choice:
    text: str
    finish_reason: str  # 'stop' or 'length'
    completion_tokens: int
    logprobs: list[Token] | None = None  # asked for: each token's (evaluator/logprobs.py)


class Deltas(Protocol):
    """Where a streamed call's text goes while it is generated (evaluator/chat.py `DeltaWriter`)."""

    def add(self, index: int, text: str) -> None: ...


class NoDeltas:
    """A call not streamed (a batch's line): its text is stored whole."""

    def add(self, index: int, text: str) -> None:
        pass


# a model's local path, or what finds it when it first loads (a warm engine may answer every call)
ModelPath = str | Callable[[], str]

# what a grading model's sampling_params default to (OpenAI's names); temperature 0 here: greedy
JUDGE_DEFAULTS = {"temperature": 0.0, "top_p": 1.0, "max_completions_tokens": 256, "seed": 0}


class Chat(ABC):
    """A model a backend holds (`Backend.chat`), answering calls. `together`: calls with the same
    knobs are generated as one batch (`calls`); false: an engine that batches what it is sent, each
    call sent alone and several at once."""

    together: ClassVar[bool] = True

    @abstractmethod
    def prepare(self) -> None:
        """Load what every call needs now: a model that cannot load fails the job, not each call."""

    @abstractmethod
    def call(self, spec: GenerateSpec, sink: Sink, deltas: Deltas) -> list[dict[str, Any]]:
        """One call's choices as sample rows (`rows`); with `spec.stream`, its text into `deltas` as
        it comes."""

    @abstractmethod
    def calls(self, specs: list[GenerateSpec], sink: Sink) -> list[list[dict[str, Any]]]:
        """Calls with the same sampling knobs generated together: each one's rows."""

    @abstractmethod
    def here(self) -> HFChat:
        """The model on transformers in this process, for what only it runs of a call (rollouts with
        the python tool: evaluator/chat.py)."""

    @abstractmethod
    def judge(self, chats: Sequence[list[dict[str, str]]], params: Mapping[str, Any]) -> list[str]:
        """A grading model's answer to each chat, with OpenAI's `sampling_params` (JUDGE_DEFAULTS)."""


def judge_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A grader's sampling_params over JUDGE_DEFAULTS (what it does not set, and what it sets to None)."""
    return {**JUDGE_DEFAULTS, **{k: v for k, v in params.items() if v is not None and k in JUDGE_DEFAULTS}}


def rows(prompt: str, prompt_tokens: int, cached_tokens: int, choices: list[Choice]) -> list[dict[str, Any]]:
    """A call's choices as its sample rows."""
    return [
        {
            "prompt": prompt,
            "completion": c.text,
            "data": {
                "index": i,
                "finish_reason": c.finish_reason,
                "prompt_tokens": prompt_tokens,
                "cached_tokens": cached_tokens,
                "completion_tokens": c.completion_tokens,
                **({"logprobs": c.logprobs} if c.logprobs is not None else {}),
            },
        }
        for i, c in enumerate(choices)
    ]


def template_messages(spec: GenerateSpec) -> list[dict[str, Any]] | None:
    """The chat as the model's template reads it: calls' arguments as objects, tool messages named."""
    if spec.messages is None:
        return None
    names = {c.id: c.function.name for m in spec.messages for c in m.tool_calls or []}
    return [m.for_template(names) for m in spec.messages]


def answer_schema(spec: GenerateSpec) -> dict[str, Any] | None:
    """The JSON Schema a call's answer is held to (its response_format), None for plain text."""
    held = spec.response_format
    return held.target() if held is not None and held.constrains() else None
