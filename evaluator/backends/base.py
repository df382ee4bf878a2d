"""What every generation backend is: `Backend` (load a model, generate completions) and the
`Generation` it returns for each completion."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from mathrl.sink import Sink


@dataclass
class Generation:
    text: str
    tokens: int
    truncated: bool  # hit max_new_tokens without EOS


class Backend(ABC):
    """A generation engine for eval, generate and reward-model sampling jobs. Subclasses live in
    their own module under evaluator/backends/ and are registered in `BACKENDS` by `name`."""

    name: ClassVar[str]
    # whether `load` needs the longest sequence of the job (an engine that reserves its KV cache)
    sized_by_sequence: ClassVar[bool] = False

    @abstractmethod
    def version(self) -> str:
        """The engine and its version, stored with every score."""

    @abstractmethod
    def load(
        self, model_path: str, *, dtype: str = "auto", seed: int = 0, max_model_len: int | None = None,
        sink: Sink | None = None,
    ) -> Any:  # fmt: skip
        """The model (or engine) for `model_path`; `max_model_len`: the longest sequence the job
        needs, for a backend `sized_by_sequence`. `sink`: where to say what was loaded, and to
        see stop requests while waiting."""

    @abstractmethod
    def generate(
        self,
        model: Any,
        tokenizer: Any,
        prompts: list[str],
        *,
        max_new_tokens: int,
        stop: list[str] | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        n: int = 1,
        seed: int = 0,
        batch_size: int = 16,
        on_batch: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[list[Generation]]:
        """For each prompt in order, its n generations. A completion ends at EOS or at the first of
        the `stop` strings, which is cut off (as lm-evaluation-harness does)."""
