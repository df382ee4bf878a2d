"""What every generation backend is: `Backend` (load a model as a `Generator` of an eval's
completions, decoded as `Decoding` says; hold a model as a `Chat` for calls; sample token ids on a
session's weights), the `Generation` it returns for each completion, and the `BackendOptions` the
worker gives it (the operator's engine settings, the warm engine a job was given): arguments, never
environment reads."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from runtime.sink import Sink

if TYPE_CHECKING:
    from evaluator.backends.chat_base import Chat, ModelPath
    from evaluator.backends.token_sampler import TokenSampler


@dataclass(frozen=True)
class EngineSettings:
    """The operator's vLLM settings for every engine of ours (config/worker_settings.py `VLLMSettings`)."""

    memory_fraction: float = 0.9  # a GPU engine's gpu_memory_utilization unless its spec says one
    cpu_kv_gib: float = 2.0  # a CPU engine's KV cache
    enforce_eager: bool = False  # no torch.compile: a shorter start, slower steps


@dataclass(frozen=True)
class WarmEngineAddress:
    """The worker's warm vLLM server a job was given (worker/warm_engine.py): its URL, the LoRA
    adapter directory the job's requests name (None: the engine's own model), and how long to wait
    for it to answer (a new CPU engine compiles for minutes)."""

    url: str
    adapter: str | None = None
    start_seconds: float = 900.0
    # salts the engine's prefix cache with the job's project (worker.warm_engine.cache_salt): an engine
    # is shared by projects, and a prompt that starts as another project's cached one answers sooner
    cache_salt: str | None = None


@dataclass(frozen=True)
class BackendOptions:
    engine: EngineSettings = EngineSettings()
    warm: WarmEngineAddress | None = None


@dataclass
class Generation:
    text: str
    tokens: int
    truncated: bool  # hit max_new_tokens without EOS
    ids: list[int] = field(default_factory=list)  # the new token ids as generated (transformers' backend)
    # a rollout with a tool (evaluator/tool_rollouts.py): each call's code, output and error, and the
    # model's own words (the tool's outputs taken out), which are what is graded
    tool_turns: list[dict[str, Any]] | None = None
    answer_text: str | None = None


OnBatch = Callable[[int, int], None] | None  # told (done, total) after each batch of a generation
Asked = Callable[[], bool] | None  # whether a stop was asked for (the job's sink.should_stop)


@dataclass(frozen=True)
class Decoding:
    """How an eval's completions are decoded: the same knobs on every backend. A completion ends at
    EOS or at the first of the `stop` strings, which is cut off (as lm-evaluation-harness does)."""

    max_new_tokens: int
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    n: int = 1  # completions per prompt
    seed: int = 0
    batch_size: int | None = None  # prompts a batch (vLLM: between progress reports); None: the backend's own

    def but(self, **changes: Any) -> Decoding:
        """These knobs with `changes` (a tool rollout's turn: its stops, its budget)."""
        return dataclasses.replace(self, **changes)


class Generator(ABC):
    """A model a backend holds for an eval's completions (`Backend.load`, `Backend.generator`), with the
    tokenizer its prompts are tokenized by (no special tokens added: the prompt is the rendered text)."""

    def __init__(self, model: Any, tokenizer: Any, max_model_len: int | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.max_model_len = max_model_len  # the longest sequence it takes (None: no bound known)

    @abstractmethod
    def generate(
        self, prompts: list[str], decoding: Decoding, *, on_batch: OnBatch = None, should_stop: Asked = None
    ) -> list[list[Generation]]:
        """For each prompt in order, its `decoding.n` generations. `on_batch(done, total)` after each
        batch; `should_stop()` true raises StopRequested between batches."""


class Backend(ABC):
    """A generation engine for eval, generate and reward-model sampling jobs, and graders' models.
    Subclasses live in their own module under evaluator/backends/ and are registered in `BACKENDS`
    by `name`."""

    name: ClassVar[str]

    def __init__(self, options: BackendOptions | None = None):
        self.options = options or BackendOptions()

    # whether `load` needs the longest sequence of the job (an engine that reserves its KV cache)
    sized_by_sequence: ClassVar[bool] = False

    @abstractmethod
    def version(self) -> str:
        """The engine and its version, stored with every score."""

    @abstractmethod
    def load(
        self, model_path: str, tokenizer: Any, *, dtype: str = "auto", seed: int = 0, max_model_len: int | None = None,
        sink: Sink | None = None,
    ) -> Generator:  # fmt: skip
        """The model (or engine) for `model_path`, held for generation; `max_model_len`: the longest
        sequence the job needs, for a backend `sized_by_sequence`. `sink`: where to say what was
        loaded, and to see stop requests while waiting."""

    @abstractmethod
    def generator(self, model: Any, tokenizer: Any, max_model_len: int | None = None) -> Generator:
        """A model already in this process held for generation: a trainer's model (`hf`), TRL's
        colocated engine (`vllm`)."""

    @abstractmethod
    def chat(self, model_path: ModelPath, *, dtype: str = "auto") -> Chat:
        """The model at `model_path` held for calls (evaluator/backends/chat_base.py): a generate
        job's chats and prompts, a batch's lines, a grading model's answers. A backend that cannot
        answer calls raises NotAvailable (mathrl/backends.py `BackendInfo.chats` is None for it)."""

    @abstractmethod
    def token_sampler(self, model: Any, tokenizer: Any) -> TokenSampler:
        """A Tinker session's sampler (evaluator/backends/token_sampler.py): token ids in, token ids
        and their log-probabilities out, on the weights of `model` (the session's, in this process)
        that each call names. A backend that cannot raises NotAvailable."""
