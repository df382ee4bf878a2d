"""The Hugging Face transformers backend (`HF`): a model loaded by evaluator.models, generating
with evaluator/backends/hf_generate.py (`HFGenerator`), held for calls as an `HFChat` (hf_chat.py), and sampling a
session's token ids on its own model (hf_sampling.py)."""

from __future__ import annotations

from typing import Any

from evaluator.backends import hf_generate
from evaluator.backends.base import Asked, Backend, Decoding, Generation, Generator, OnBatch
from evaluator.backends.chat_base import ModelPath
from evaluator.backends.hf_chat import HFChat
from evaluator.backends.hf_sampling import HFTokenSampler
from runtime.sink import Sink


class HFGenerator(Generator):
    """A transformers model in this process, generating with hf_generate.py."""

    def generate(
        self, prompts: list[str], decoding: Decoding, *, on_batch: OnBatch = None, should_stop: Asked = None
    ) -> list[list[Generation]]:
        return hf_generate.generate(
            self.model, self.tokenizer, prompts, decoding, on_batch=on_batch, should_stop=should_stop
        )


class HF(Backend):
    """Hugging Face transformers, in the job's process."""

    name = "hf"

    def version(self) -> str:
        return hf_generate.backend_version()

    def load(
        self, model_path: str, tokenizer: Any, *, dtype: str = "auto", seed: int = 0, max_model_len: int | None = None,
        sink: Sink | None = None,
    ) -> HFGenerator:  # fmt: skip
        from evaluator.models import load_model

        return HFGenerator(load_model(model_path, dtype=dtype), tokenizer)

    def generator(self, model: Any, tokenizer: Any, max_model_len: int | None = None) -> HFGenerator:
        return HFGenerator(model, tokenizer, max_model_len)

    def chat(self, model_path: ModelPath, *, dtype: str = "auto") -> HFChat:
        return HFChat(model_path, dtype)

    def token_sampler(self, model: Any, tokenizer: Any) -> HFTokenSampler:
        return HFTokenSampler(model, tokenizer)
