"""What the graders of mathrl/graders.py compute: per completion a score and a reason.

`grade_items(grader, completions, answers)` scores a batch. A reward-model grader needs a
scorer for its model (`rm_scorer(model_ref) -> score(prompts, completions)`), which the
caller that has one passes (GRPO: trainer/rewards.py; eval jobs: the worker); without it,
such a grader is refused. Math answers are compared by `match` (default: here, in this
process; GRPO passes evaluator.bounded.BoundedMatch, which compares them in a child process
with a time limit per answer). `grade_item` is one item of POST /v1/graders:run, as
evaluator/bounded.py runs it in the call's own process."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from evaluator.grading import check_answers, extract, find_answer
from mathrl.graders import (
    LengthPenaltyGrader,
    MathGrader,
    RegexGrader,
    RewardModelGrader,
    StringCheckGrader,
    WeightedGrader,
)
from mathrl.regex import compile_pattern

RMScorer = Callable[[Sequence[str], Sequence[str]], list[float]]  # (prompts, completions) -> scores
# (answer, gold) pairs -> per pair (equal?, a note when they were not compared)
Matcher = Callable[[Sequence[tuple[str, str]]], list[tuple[bool, str | None]]]


def match_here(pairs: Sequence[tuple[str, str]]) -> list[tuple[bool, str | None]]:
    return [check_answers(answer, gold) for answer, gold in pairs]


@dataclass
class Result:
    score: float
    reason: str


def _math(
    g: MathGrader, completions: Sequence[str], answers: Sequence[str | None], cut: Sequence[bool], match: Matcher
) -> list[Result]:
    found = [
        find_answer(c, g.answer_pattern, t) if a is not None else (None, None)
        for c, a, t in zip(completions, answers, cut, strict=True)
    ]
    todo = [i for i, (x, _) in enumerate(found) if x is not None]
    verdicts = dict(zip(todo, match([(str(found[i][0]), str(answers[i])) for i in todo]), strict=True))
    out = []
    for i, ((extracted, method), answer, truncated) in enumerate(zip(found, answers, cut, strict=True)):
        if answer is None:
            out.append(Result(0.0, "no gold answer to compare with"))
            continue
        if extracted is None:
            how = f"no match of {g.answer_pattern!r}" if g.answer_pattern else "no final answer found"
            cutoff = " (cut off: no last-number fallback)" if truncated and not g.answer_pattern else ""
            out.append(Result(0.0, how + cutoff))
            continue
        correct, note = verdicts[i]
        if note is not None:
            out.append(Result(float(correct), f"{extracted!r} ({method}) {note}"))
        elif correct:
            out.append(Result(1.0, f"{extracted!r} ({method}) equals the gold {answer!r}"))
        else:
            out.append(Result(0.0, f"{extracted!r} ({method}) differs from the gold {answer!r}"))
    return out


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
    found = compile_pattern(g.pattern).search(completion) is not None  # RE2: linear time (mathrl/regex.py)
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
    match: Matcher = match_here,
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
                match=match,
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
        return _math(grader, completions, answers, cut, match)
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


@functools.lru_cache(maxsize=8)
def _grader(grader_json: str) -> Any:
    from pydantic import TypeAdapter

    from mathrl.graders import Grader

    return TypeAdapter(Grader).validate_json(grader_json)


def grade_item(grader_json: str, completion: str, answer: str | None, prompt: str) -> tuple[float, str]:
    """One item of POST /v1/graders:run: (score, reason). Plain data in and out, for the call's
    own process (evaluator/bounded.py); the grader as JSON, parsed once per process."""
    r = grade_items(_grader(grader_json), [completion], [answer], prompts=[prompt])[0]
    return r.score, r.reason
