"""The Hugging Face transformers backend (`HF`): a model loaded by evaluator.models, generating
with evaluator/backends/hf_generate.py, held for calls as an `HFChat` (hf_chat.py), and sampling a
session's token ids on its own model (hf_sampling.py)."""

from __future__ import annotations

from typing import Any

from evaluator.backends import hf_generate
from evaluator.backends.base import Backend
from evaluator.backends.chat_base import ModelPath
from evaluator.backends.hf_chat import HFChat
from evaluator.backends.hf_sampling import HFTokenSampler
from runtime.sink import Sink


class HF(Backend):
    """Hugging Face transformers, in the job's process."""

    name = "hf"

    def version(self) -> str:
        return hf_generate.backend_version()

    def load(
        self, model_path: str, *, dtype: str = "auto", seed: int = 0, max_model_len: int | None = None,
        sink: Sink | None = None,
    ) -> Any:  # fmt: skip
        from evaluator.models import load_model

        return load_model(model_path, dtype=dtype)

    generate = staticmethod(hf_generate.generate)

    def chat(self, model_path: ModelPath, *, dtype: str = "auto") -> HFChat:
        return HFChat(model_path, dtype)

    def token_sampler(self, model: Any, tokenizer: Any) -> HFTokenSampler:
        return HFTokenSampler(model, tokenizer)
