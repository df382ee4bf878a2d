"""A trained outcome reward model (a sequence classifier with one label) as a scorer:
`RewardModelScorer(path)(prompts, completions) -> scores`, loaded lazily in the process that
scores. The reward_model grader (evaluator/graders.py) scores with it, in GRPO, in eval jobs and
in 'grade' jobs; `rm_scorers` gives graders one scorer per model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class RewardModelScorer:
    def __init__(self, model_path: str, batch_size: int = 16) -> None:
        self.model_path, self.batch_size = model_path, batch_size
        self._model: Any = None
        self._tok: Any = None

    def __getstate__(self) -> dict[str, Any]:  # picklable: the model is loaded lazily per process
        return {**self.__dict__, "_model": None, "_tok": None}

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from evaluator.models import check_loaded_from_hub

        self._tok = AutoTokenizer.from_pretrained(self.model_path)
        if self._tok.pad_token is None:
            self._tok.pad_token = self._tok.eos_token
        self._model = AutoModelForSequenceClassification.from_pretrained(self.model_path, dtype=torch.float32)
        check_loaded_from_hub(self.model_path, self._model)
        self._model.eval()

    def __call__(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        import torch

        from trainer.reward_model import rm_text

        if self._model is None:
            self._load()
        texts = [rm_text(self._tok, p, c) for p, c in zip(prompts, completions, strict=True)]
        out: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            enc = self._tok(
                texts[i : i + self.batch_size], return_tensors="pt", padding=True, truncation=True, max_length=2048
            )
            with torch.inference_mode():
                logits = self._model(**enc).logits[:, 0]
            out.extend(float(x) for x in logits)
        return out


def rm_scorers(
    resolve: Callable[[str], str] | None = None, cache: dict[str, RewardModelScorer] | None = None
) -> Callable[[str], RewardModelScorer]:
    """What a grader's reward-model parts score with: model ref -> scorer (`resolve`: ref ->
    local path), kept in `cache` so each model loads once."""
    loaded: dict[str, RewardModelScorer] = {} if cache is None else cache

    def scorer(ref: str) -> RewardModelScorer:
        if ref not in loaded:
            loaded[ref] = RewardModelScorer(resolve(ref) if resolve else ref)
        return loaded[ref]

    return scorer
