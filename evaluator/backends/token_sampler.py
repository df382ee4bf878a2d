"""What a backend samples token ids with (`Backend.token_sampler`): Tinker's `sample` and
`compute_logprobs` on a training session's weights (kinds/session.py). A `SampleCall` in; for each
sample a `Sampled` (its tokens, each one's log-probability, why it stopped) out, and the prompt's
log-probabilities when asked.

The weights are the caller's (`SamplerWeights`): a session's sampler is a snapshot of its adapter,
which a backend in the session's process samples by putting it in the model (`held`), and an
engine by loading it as a LoRA adapter from a directory (`directory`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class SampleCall:
    """A decoded `asample` request (docs/tinker-protocol.md, section 9)."""

    prompt: list[int]
    num_samples: int = 1
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] | list[int] | None = None  # None: the tokenizer's EOS; []: nothing stops it
    seed: int | None = None
    prompt_logprobs: bool = False
    prompt_logprobs_last_n: int | None = None


@dataclass(frozen=True)
class Sampled:
    """One sampled sequence: its tokens, their log-probabilities, and why it stopped."""

    tokens: Sequence[int]
    logprobs: Sequence[float]
    stop_reason: str  # 'stop' (a stop sequence or EOS) or 'length' (max_tokens)


class SamplerWeights(Protocol):
    """The weights one sampler samples with."""

    def held(self) -> AbstractContextManager[None]:
        """The in-process model holds these weights for the block (no gradients, eval mode), then
        what it held before."""
        ...

    def directory(self) -> Path:
        """These weights as a peft adapter directory (written at the first ask)."""
        ...


class TokenSampler(ABC):
    """Samples token ids for one session: `sample`, then `close` when the session ends."""

    @abstractmethod
    def sample(self, call: SampleCall, weights: SamplerWeights) -> tuple[list[Sampled], list[float | None] | None]:
        """`call`'s `num_samples` continuations of its prompt with `weights`, and the prompt's
        log-probabilities (the first None) when the call asks. An engine that fails raises
        EngineError (runtime/errors.py)."""

    @abstractmethod
    def close(self) -> None:
        """Let go of what this sampler holds (an engine's adapters)."""
