"""GRPO's rewards: graders (mathrl/graders.py, scored by evaluator/graders.py) adapted to the way TRL
calls rewards, `reward(completions, answer=[...], **columns) -> list[float | None]` (`GraderReward`,
`reward_for`, `get_reward`). Every named reward of a spec is a grader (`RewardRef.as_grader`), so
each formula has one implementation; a spec names rewards or gives a grader, never code.

Answers are compared with math-verify in a child process (evaluator.bounded.BoundedMatch:
ITEM_SECONDS per sample, CALL_SECONDS per call): an answer not settled in time, or a power tower,
scores as a wrong answer, is counted in `rewards/<name>/timed_out` and does not hold up the step.
RELIABILITY.md, "Rewards in GRPO"; docs/using.md, "Graders"."""

from __future__ import annotations

import json
from typing import Any

from evaluator.bounded import BoundedMatch
from evaluator.chat import judges
from mathrl.graders import MathGrader, with_models
from mathrl.registry import Registry
from mathrl.specs import REWARD_NAMES, RewardRef
from runtime.errors import UnknownReward as UnknownReward  # raised here; its callers import it from here
from trainer.rm_scorer import RewardModelScorer, rm_scorers

ITEM_SECONDS = 5.0  # per sample: math-verify's comparison of its answer with the gold
CALL_SECONDS = 120.0  # per reward call (one step's completions on this rank)
DEFAULT_MAX_LENGTH = 1024  # 'overlong' without a run's max_completion_length (direct calls)
# what TRL passes a reward besides the dataset's columns
_TRL_ARGS = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"})
# what a tool rollout adds (trainer/tool_grpo.py): the model's own words, which are graded, and its void flag
_ROLLOUT_FIELDS = frozenset({"answer_text", "void_turn"})


def completion_text(completion: Any) -> str:
    """TRL passes plain strings, or message lists for conversational datasets."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


class GraderReward:
    """A grader as a TRL reward, logged under `name` (a named reward's, else 'grader_<type>').

    `max_length`: the run's max_completion_length; a completion of that many tokens (TRL's
    `completion_ids`) was cut off, and gets no last-number answer (evaluator.grading.extract).
    A math grader's score is None (not applicable: TRL leaves it out of the sum) for a row
    with no gold answer."""

    def __init__(
        self,
        grader: Any,
        name: str | None = None,
        max_length: int | None = None,
        item_seconds: float = ITEM_SECONDS,
        call_seconds: float = CALL_SECONDS,
        sandbox: Any = None,
    ) -> None:
        self.grader = grader
        self.sandbox = sandbox  # evaluator.sandbox.SandboxLimits for python graders (None: the defaults)
        self.__name__ = name or f"grader_{grader.type}"
        self.max_length = max_length
        self._match = BoundedMatch(item_seconds, call_seconds)
        self._rms: dict[str, RewardModelScorer] = {}
        self._judges: dict[str, Any] = {}  # grading models (score_model, label_model), loaded once

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_rms": {}, "_judges": {}}

    @property
    def timed_out(self) -> int:
        """Samples so far whose check overran its time (scored as a wrong answer)."""
        return self._match.timed_out

    def __call__(self, completions: list[Any], answer: list[str] | None = None, **kw: Any) -> list[float | None]:
        from evaluator.graders import grade_items

        # a tool rollout is graded on its own words: the outputs the tool printed are not its answer
        texts = list(kw["answer_text"]) if kw.get("answer_text") else [completion_text(c) for c in completions]
        ids = kw.get("completion_ids")
        cut = [len(x) >= self.max_length for x in ids] if self.max_length and ids is not None else None
        prompts = [_prompt_text(p) for p in kw.get("prompts") or [""] * len(texts)]
        golds = list(answer) if answer is not None else [None] * len(texts)
        n = len(texts)
        columns = {
            k: v
            for k, v in kw.items()
            if k not in _TRL_ARGS and k not in _ROLLOUT_FIELDS and isinstance(v, list) and len(v) == n
        }
        # the dataset row: templates' `item` (a messages-format file's fields come as one JSON column)
        packed = columns.pop("item", None)
        items = [
            {**({} if packed is None else json.loads(packed[i])), **{k: v[i] for k, v in columns.items()}}
            for i in range(n)
        ]
        results = grade_items(
            self.grader,
            texts,
            golds,
            prompts=prompts,
            completion_ids=ids,
            truncated=cut,
            rm_scorer=rm_scorers(cache=self._rms),
            judge=judges(cache=self._judges),
            match=self._match,
            items=items,
            sandbox=self.sandbox,
        )
        no_gold = isinstance(self.grader, MathGrader)
        return [None if no_gold and g is None else r.score for r, g in zip(results, golds, strict=True)]


def reward_for(ref: RewardRef, max_completion_length: int, resolve_model: Any = None, **kw: Any) -> GraderReward:
    """The reward a spec's `rewards` entry names, its models' 'job:<id>' references resolved to
    local paths by `resolve_model`."""
    grader = resolve_grader_models(ref.as_grader(max_completion_length), resolve_model)
    return GraderReward(grader, None if ref.name == "grader" else ref.name, max_completion_length, **kw)


def get_reward(name: str, max_length: int | None = None, **fields: Any) -> GraderReward:
    """A reward by name, as a spec names it (`fields`: RewardRef's, e.g. model, buffer, grader;
    and item_seconds, call_seconds), for direct calls: tests and benches."""
    names: Registry[str] = Registry("reward", UnknownReward)
    for n in REWARD_NAMES:
        names.add(n, n)
    names[name]  # an unknown name: UnknownReward, with the close ones
    timing = {k: fields.pop(k) for k in ("item_seconds", "call_seconds") if k in fields}
    reward = reward_for(RewardRef(name=name, **fields), max_length or DEFAULT_MAX_LENGTH, **timing)
    reward.max_length = max_length
    return reward


def resolve_grader_models(grader: Any, resolve_model: Any) -> Any:
    """The grader with its models' references ('job:<id>') resolved to local paths."""
    return grader if resolve_model is None else with_models(grader, resolve_model)


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "".join(str(m.get("content", "")) + "\n" for m in prompt if isinstance(m, dict))
    return str(prompt)
