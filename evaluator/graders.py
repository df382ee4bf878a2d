"""What the graders of mathrl/graders.py compute: per completion a score and a reason.

`grade_items(grader, completions, answers)` scores a batch. A reward-model grader needs a
scorer for its model (`rm_scorer(model_ref) -> score(prompts, completions)`), which the
caller that has one passes (GRPO: trainer/rewards.py; eval jobs: the worker); without it,
such a grader is refused."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from evaluator.grading import extract, grade
from mathrl.graders import (
    LengthPenaltyGrader,
    MathGrader,
    RegexGrader,
    RewardModelGrader,
    StringCheckGrader,
    WeightedGrader,
)

RMScorer = Callable[[Sequence[str], Sequence[str]], list[float]]  # (prompts, completions) -> scores


@dataclass
class Result:
    score: float
    reason: str


def _math(g: MathGrader, completion: str, answer: str | None, truncated: bool) -> Result:
    if answer is None:
        return Result(0.0, "no gold answer to compare with")
    v = grade(completion, answer, pattern=g.answer_pattern, truncated=truncated)
    if v.extracted is None:
        how = f"no match of {g.answer_pattern!r}" if g.answer_pattern else "no final answer found"
        return Result(0.0, how + (" (cut off: no last-number fallback)" if truncated and not g.answer_pattern else ""))
    if v.correct:
        return Result(1.0, f"{v.extracted!r} ({v.method}) equals the gold {answer!r}")
    return Result(0.0, f"{v.extracted!r} ({v.method}) differs from the gold {answer!r}")


def _string(g: StringCheckGrader, completion: str, answer: str | None, truncated: bool) -> Result:
    if g.input == "completion":
        text: str | None = completion.strip()
    else:
        text = extract(completion, truncated)[0]
    reference = g.reference.replace("{answer}", answer or "")
    if text is None:
        return Result(0.0, "no final answer found")
    ok = {
        "eq": text == reference,
        "ne": text != reference,
        "contains": reference in text,
        "icontains": reference.lower() in text.lower(),
    }[g.operation]
    return Result(float(ok), f"{text[:80]!r} {g.operation} {reference[:80]!r}: {'yes' if ok else 'no'}")


def _regex(g: RegexGrader, completion: str) -> Result:
    found = re.search(g.pattern, completion) is not None
    ok = found != g.negate
    return Result(float(ok), f"pattern {'found' if found else 'not found'}" + (" (negated)" if g.negate else ""))


def _length(g: LengthPenaltyGrader, length: int, unit: str) -> Result:
    start = g.max_length - min(g.buffer, g.max_length)
    if length <= start:
        return Result(0.0, f"{length} {unit} <= {start}: no penalty")
    score = -min(1.0, (length - start) / max(1, min(g.buffer, g.max_length)))
    return Result(score, f"{length} {unit}, {length - start} over {start}")


def grade_items(
    grader: Any,
    completions: Sequence[str],
    answers: Sequence[str | None],
    *,
    prompts: Sequence[str] | None = None,
    completion_ids: Sequence[Sequence[int]] | None = None,
    truncated: Sequence[bool] | None = None,
    rm_scorer: Callable[[str], RMScorer] | None = None,
) -> list[Result]:
    """Score each completion against its gold answer. `completion_ids` (GRPO) measure lengths in
    tokens, else in words; `truncated` marks completions cut off at the length limit."""
    n = len(completions)
    if len(answers) != n:
        raise ValueError(f"{n} completions but {len(answers)} answers")
    cut = list(truncated) if truncated is not None else [False] * n
    if isinstance(grader, WeightedGrader):
        parts = [
            grade_items(
                p.grader,
                completions,
                answers,
                prompts=prompts,
                completion_ids=completion_ids,
                truncated=cut,
                rm_scorer=rm_scorer,
            )
            for p in grader.graders
        ]
        out = []
        for i in range(n):
            score = sum(p.weight * r[i].score for p, r in zip(grader.graders, parts, strict=True))
            reason = " + ".join(
                f"{p.weight:g} x {p.grader.type} {r[i].score:g} ({r[i].reason})"
                for p, r in zip(grader.graders, parts, strict=True)
            )
            out.append(Result(score, reason))
        return out
    if isinstance(grader, MathGrader):
        return [_math(grader, c, a, t) for c, a, t in zip(completions, answers, cut, strict=True)]
    if isinstance(grader, StringCheckGrader):
        return [_string(grader, c, a, t) for c, a, t in zip(completions, answers, cut, strict=True)]
    if isinstance(grader, RegexGrader):
        return [_regex(grader, c) for c in completions]
    if isinstance(grader, LengthPenaltyGrader):
        if completion_ids is not None:
            return [_length(grader, len(ids), "tokens") for ids in completion_ids]
        return [_length(grader, len(c.split()), "words") for c in completions]
    if isinstance(grader, RewardModelGrader):
        if rm_scorer is None:
            raise ValueError("a reward_model grader needs its model loaded: it runs in GRPO and eval jobs")
        scores = rm_scorer(grader.model)(list(prompts or [""] * n), list(completions))
        return [Result(float(s), f"reward model score {s:.4g}") for s in scores]
    raise TypeError(f"not a grader: {grader!r}")
