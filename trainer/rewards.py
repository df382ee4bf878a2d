"""Reward functions, chosen by name from a registry. The API never runs user code: a spec can
only name one of these.

Each is a picklable class instance called the way TRL calls rewards:
`reward(completions, answer=[...], **columns) -> list[float | None]`, where `answer` is the
gold answer column of the training set. TRL logs each under its `__name__`.

Answers are compared with math-verify in a child process, `item_seconds` (5) at most per
sample and `call_seconds` (120) per call (evaluator.bounded.BoundedMatch): a completion whose
answer sympy cannot settle in time (a huge binomial, a polynomial to expand) gets the reward of
a wrong answer, is counted in the reward's `timed_out` (logged as `rewards/<name>/timed_out`,
trainer/callbacks.py; async GRPO scores in its rollout process, which logs a warning line instead)
and does not hold up the step; power towers are refused before sympy
evaluates them (evaluator.grading.too_big), also as a wrong answer. Otherwise a policy could
learn to answer what cannot be checked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from evaluator.benchmarks import lookup
from evaluator.bounded import BoundedMatch
from evaluator.grading import extract_answer, last_boxed

ITEM_SECONDS = 5.0  # per sample: math-verify's comparison of its answer with the gold
CALL_SECONDS = 120.0  # per reward call (one step's completions on this rank)


def completion_text(completion: Any) -> str:
    """TRL passes plain strings, or message lists for conversational datasets."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


class Reward:
    """`max_length`: the run's max_completion_length; a completion of that many tokens (TRL's
    `completion_ids`) was cut off, and gets no last-number answer (evaluator.grading.extract)."""

    name = "base"

    def __init__(
        self,
        max_length: int | None = None,
        item_seconds: float = ITEM_SECONDS,
        call_seconds: float = CALL_SECONDS,
        **_: Any,
    ) -> None:
        self.__name__ = self.name
        self.max_length = max_length
        self._match = BoundedMatch(item_seconds, call_seconds)

    @property
    def timed_out(self) -> int:
        """Samples so far whose check overran its time (scored as a wrong answer)."""
        return self._match.timed_out

    def __call__(self, completions: list[Any], answer: list[str] | None = None, **kw: Any) -> list[float | None]:
        golds = answer if answer is not None else [None] * len(completions)
        cut = self._cut(len(completions), kw.get("completion_ids"))
        return [self.score(completion_text(c), g, t) for c, g, t in zip(completions, golds, cut, strict=True)]

    def _cut(self, n: int, ids: Any) -> list[bool]:
        """Which of n completions reached max_length tokens (all False without token ids)."""
        if self.max_length is None or ids is None:
            return [False] * n
        return [len(x) >= self.max_length for x in ids]

    def score(self, text: str, gold: str | None, truncated: bool = False) -> float | None:
        raise NotImplementedError


class _Checked(Reward):
    """A reward from the extracted answer and whether it equals the gold (compared in bounds)."""

    def __call__(self, completions: list[Any], answer: list[str] | None = None, **kw: Any) -> list[float | None]:
        golds: Sequence[str | None] = answer if answer is not None else [None] * len(completions)
        cut = self._cut(len(completions), kw.get("completion_ids"))
        preds = [
            extract_answer(completion_text(c), t) if g is not None else None
            for c, g, t in zip(completions, golds, cut, strict=True)
        ]
        todo = [i for i, p in enumerate(preds) if p is not None]
        checked = self._match([(str(preds[i]), str(golds[i])) for i in todo])
        correct = dict(zip(todo, (c for c, _ in checked), strict=True))
        return [self.value(g, p, correct.get(i, False)) for i, (g, p) in enumerate(zip(golds, preds, strict=True))]

    def value(self, gold: str | None, pred: str | None, correct: bool) -> float | None:
        raise NotImplementedError


class Accuracy(_Checked):
    """1 if math-verify finds the final answer equal to the gold answer, else 0."""

    name = "accuracy"

    def value(self, gold: str | None, pred: str | None, correct: bool) -> float | None:
        if gold is None:
            return None
        return 1.0 if pred is not None and correct else 0.0


class Binary(_Checked):
    """The DeepSeekMath-style rule reward: +1 correct, -1 wrong, -0.5 when no answer is given
    (no boxed/####/'answer is' answer, and for a cut-off completion no last number either)."""

    name = "binary"

    def value(self, gold: str | None, pred: str | None, correct: bool) -> float | None:
        if gold is None:
            return None
        if pred is None:
            return -0.5
        return 1.0 if correct else -1.0


class BoxedFormat(Reward):
    """1 if the completion ends its answer in a non-empty \\boxed{...}, else 0."""

    name = "format"

    def score(self, text: str, gold: str | None, truncated: bool = False) -> float | None:
        boxed = last_boxed(text)
        return 1.0 if boxed is not None and boxed.strip() else 0.0


class Overlong(Reward):
    """DAPO's soft overlong penalty: 0 up to (max - buffer) tokens, then down linearly to -1 at max.

    Lengths are counted in completion tokens when TRL passes `completion_ids`, else in
    whitespace words (a fallback for direct calls)."""

    name = "overlong"

    def __init__(self, max_length: int = 1024, buffer: int = 256, **kw: Any) -> None:
        super().__init__(max_length, **kw)
        self.buffer = max(1, min(buffer, max_length))

    def __call__(self, completions: list[Any], answer: list[str] | None = None, **kw: Any) -> list[float | None]:
        ids = kw.get("completion_ids")
        lengths = [len(x) for x in ids] if ids is not None else [len(completion_text(c).split()) for c in completions]
        return [self.penalty(n) for n in lengths]

    def penalty(self, length: int) -> float:
        assert self.max_length is not None
        start = self.max_length - self.buffer
        if length <= start:
            return 0.0
        return -min(1.0, (length - start) / self.buffer)


class RewardModelScore(Reward):
    """The scalar score of a trained outcome reward model (a sequence classifier with 1 label)."""

    name = "reward_model"

    def __init__(self, model: str, batch_size: int = 16, **kw: Any) -> None:
        super().__init__(**kw)
        self.model_path, self.batch_size = model, batch_size
        self._model: Any = None
        self._tok: Any = None

    def __getstate__(self) -> dict[str, Any]:  # picklable: the model is loaded lazily per process
        return {**self.__dict__, "_model": None, "_tok": None}

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(self.model_path)
        if self._tok.pad_token is None:
            self._tok.pad_token = self._tok.eos_token
        self._model = AutoModelForSequenceClassification.from_pretrained(self.model_path, dtype=torch.float32)
        self._model.eval()

    def __call__(self, completions: list[Any], answer: list[str] | None = None, **kw: Any) -> list[float | None]:
        import torch

        if self._model is None:
            self._load()
        prompts = kw.get("prompts") or [""] * len(completions)
        from trainer.reward_model import rm_text

        texts = [
            rm_text(self._tok, _prompt_text(p), completion_text(c)) for p, c in zip(prompts, completions, strict=True)
        ]
        out: list[float | None] = []
        for i in range(0, len(texts), self.batch_size):
            enc = self._tok(
                texts[i : i + self.batch_size], return_tensors="pt", padding=True, truncation=True, max_length=2048
            )
            with torch.inference_mode():
                logits = self._model(**enc).logits[:, 0]
            out.extend(float(x) for x in logits)
        return out


class GraderReward(Reward):
    """A grader of mathrl/graders.py as a reward (the same object that scores eval items); its
    reward-model parts score with RewardModelScore. Logged as 'grader_<type>'."""

    name = "grader"

    def __init__(self, grader: Any, max_length: int | None = None, **kw: Any) -> None:
        super().__init__(max_length, **kw)
        self.grader = grader
        self.__name__ = f"grader_{grader.type}"
        self._rms: dict[str, RewardModelScore] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_rms": {}}

    def __call__(self, completions: list[Any], answer: list[str] | None = None, **kw: Any) -> list[float | None]:
        from evaluator.graders import grade_items

        texts = [completion_text(c) for c in completions]
        ids = kw.get("completion_ids")
        cut = self._cut(len(texts), ids)
        prompts = [_prompt_text(p) for p in kw.get("prompts") or [""] * len(texts)]
        golds = list(answer) if answer is not None else [None] * len(texts)
        scorer = rm_scorers(cache=self._rms)
        results = grade_items(
            self.grader,
            texts,
            golds,
            prompts=prompts,
            completion_ids=ids,
            truncated=cut,
            rm_scorer=scorer,
            match=self._match,
        )
        return [r.score for r in results]


def rm_scorers(
    resolve: Callable[[str], str] | None = None, cache: dict[str, RewardModelScore] | None = None
) -> Callable[[str], Callable[[Any, Any], list[float]]]:
    """What a grader's reward-model parts score with (evaluator/graders.py): model ref ->
    score(prompts, completions), a RewardModelScore per model (`resolve`: ref -> local path),
    kept in `cache` so each model loads once."""
    loaded: dict[str, RewardModelScore] = {} if cache is None else cache

    def scorer(ref: str) -> Callable[[Any, Any], list[float]]:
        if ref not in loaded:
            loaded[ref] = RewardModelScore(model=resolve(ref) if resolve else ref)
        rm = loaded[ref]
        return lambda prompts, completions: [float(x or 0.0) for x in rm(list(completions), prompts=list(prompts))]

    return scorer


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "".join(str(m.get("content", "")) + "\n" for m in prompt if isinstance(m, dict))
    return str(prompt)


REGISTRY: dict[str, Callable[..., Reward]] = {
    cls.name: cls for cls in (Accuracy, Binary, BoxedFormat, Overlong, RewardModelScore, GraderReward)
}


class UnknownReward(ValueError):
    pass


def get_reward(name: str, **kwargs: Any) -> Reward:
    return lookup(REGISTRY, name, "reward", UnknownReward)(**kwargs)
