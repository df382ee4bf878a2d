"""An eval's scoring: every completion graded by the recipe's answer extraction (and the spec's own
grader, if any), the per-item records, and the metrics over them (accuracy with its Wilson
interval, pass@k and maj@k, lengths, truncation, the grader's mean)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from evaluator.backends.base import Generation
from evaluator.data import Problem
from evaluator.graders import Judge, RMScorer, grade_items
from evaluator.grading import answers_match, grade
from evaluator.metrics import maj_at_k, pass_at_k, wilson_interval
from evaluator.python_tool import raised
from evaluator.sandbox import SandboxLimits
from mathrl.recipe import Recipe
from mathrl.specs import EvalSpec


@dataclass
class Scored:
    items: list[dict[str, Any]]  # one per completion: prompt, completion and its data
    greedy_correct: list[bool]  # per problem: its first completion's verdict
    values: dict[str, float] = field(default_factory=dict)  # metric -> value
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)  # metric -> 95% Wilson interval


def score(
    spec: EvalSpec,
    recipe: Recipe,
    problems: list[Problem],
    texts: list[str],
    gens: list[list[Generation]],
    gen_seconds: float,
    rm_scorer: Callable[[str], RMScorer] | None = None,
    judge: Callable[[str], Judge] | None = None,
    sandbox: SandboxLimits | None = None,
) -> Scored:
    """Grade `gens` (per problem, its completions of `texts`) and compute the eval's metrics."""
    graded = None  # the spec's grader, if any, over every completion in order
    if spec.grader is not None:
        flat = [(text, p, g) for p, text, outs in zip(problems, texts, gens, strict=True) for g in outs]
        graded = iter(
            grade_items(
                spec.grader,
                [g.text for _, _, g in flat],
                [p.gold for _, p, _ in flat],
                prompts=[t for t, _, _ in flat],
                truncated=[g.truncated for _, _, g in flat],
                items=[p.meta.get("item", {}) for _, p, _ in flat],  # a user file's fields: '{{item.<field>}}'
                rm_scorer=rm_scorer,
                judge=judge,
                sandbox=sandbox,
            )
        )
    grader_scores: list[float] = []
    items: list[dict[str, Any]] = []
    per_problem_correct: list[list[bool]] = []
    per_problem_answers: list[list[str | None]] = []
    for p, text, outs in zip(problems, texts, gens, strict=True):
        verdicts = [
            grade(g.text if g.answer_text is None else g.answer_text, p.gold, pattern=recipe.answer_pattern,
                  truncated=g.truncated)
            for g in outs
        ]  # fmt: skip
        per_problem_correct.append([v.correct for v in verdicts])
        per_problem_answers.append([v.extracted for v in verdicts])
        for j, (g, v) in enumerate(zip(outs, verdicts, strict=True)):
            extra: dict[str, Any] = {}
            if graded is not None:
                r = next(graded)
                grader_scores.append(r.score)
                extra = {"grader_score": r.score, "grader_reason": r.reason}
                if r.sub is not None:  # a multi grader's graders, by name (an OpenAI eval's testing criteria)
                    extra["grader_sub"] = r.sub
                if r.error is not None:
                    extra["grader_error"] = r.error
            data = {
                "problem": p.index,
                "sample": j,
                "gold": p.gold,
                "extracted": v.extracted,
                "extracted_by": v.method,
                "correct": v.correct,
                "tokens": g.tokens,
                "truncated": g.truncated,
                **({"tool_turns": g.tool_turns} if g.tool_turns is not None else {}),
                **extra,
                **p.meta,
            }
            items.append({"prompt": text, "completion": g.text, "data": data})
    n_problems = len(problems)
    scored = Scored(items, [c[0] for c in per_problem_correct])
    greedy_correct = sum(scored.greedy_correct)
    scored.values["accuracy"] = greedy_correct / max(n_problems, 1)
    scored.intervals["accuracy"] = wilson_interval(greedy_correct, n_problems)
    n = spec.sampling.n
    for k in spec.k:
        if n > 1:
            pk = [pass_at_k(n, sum(c), k) for c in per_problem_correct]
            mk = [
                maj_at_k(a, c, k, same=answers_match)
                for a, c in zip(per_problem_answers, per_problem_correct, strict=True)
            ]
            scored.values[f"pass@{k}"] = sum(pk) / max(n_problems, 1)
            scored.values[f"maj@{k}"] = sum(mk) / max(n_problems, 1)
            scored.intervals[f"maj@{k}"] = wilson_interval(int(sum(mk)), n_problems)
    all_gens = [g for outs in gens for g in outs]
    scored.values["mean_completion_tokens"] = sum(g.tokens for g in all_gens) / max(len(all_gens), 1)
    scored.values["truncation_rate"] = sum(g.truncated for g in all_gens) / max(len(all_gens), 1)
    scored.values["problems_per_second"] = n_problems / max(gen_seconds, 1e-9)
    if grader_scores:
        scored.values["grader/mean"] = sum(grader_scores) / len(grader_scores)
    rollouts = [
        (g, v) for outs, vs in zip(gens, per_problem_answers, strict=True) for g, v in zip(outs, vs, strict=True)
    ]
    if rollouts and rollouts[0][0].tool_turns is not None:
        scored.values |= tool_metrics(rollouts)
    return scored


def tool_metrics(rollouts: list[tuple[Generation, str | None]]) -> dict[str, float]:
    """A tool run's rollouts (each with its extracted answer, or None): calls per rollout, the share of
    calls that raised or were stopped, timed out, the rollouts that answered, and void turns
    (SimpleTIR's: a rollout's last turn with neither a call nor an answer, a share of rollouts)."""
    n = len(rollouts)
    turns = [t for g, _ in rollouts for t in g.tool_turns or [] if "code" in t]
    calls = max(len(turns), 1)
    failed = [t for t in turns if t["error"] is not None or raised(t["output"])]
    answered = sum(a is not None for _, a in rollouts)
    void = sum(is_void(g, a) for g, a in rollouts)
    return {
        "tool/calls_per_rollout": len(turns) / n,
        "tool/call_errors": len(failed) / calls,
        "tool/timeouts": sum(t["error"] == "timeout" for t in turns) / calls,
        "tool/answered": answered / n,
        "tool/void_turns": void / n,
    }


def is_void(rollout: Generation, answer: str | None) -> bool:
    """SimpleTIR's void turn: the rollout's last turn holds neither an answer (`answer`, extracted from
    its words) nor a call, even one never run (past max_calls, or cut short: evaluator/tool_rollouts.py)."""
    last: dict[str, Any] = next((t for t in reversed(rollout.tool_turns or []) if "answer" in t), {})
    return answer is None and not last.get("unrun_call", False)
