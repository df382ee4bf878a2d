"""`run_eval(spec, sink)`: prompts -> generations -> grades -> scores and per-item records."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evaluator import prompts
from evaluator.backends import backend
from evaluator.benchmarks import Benchmark, find_benchmark, get_benchmark
from evaluator.data import Problem, custom_source, load_benchmark, load_custom_set
from evaluator.graders import Judge, RMScorer, grade_items
from evaluator.grading import answers_match, grade
from evaluator.metrics import accuracy_breakdown, maj_at_k, pass_at_k, wilson_interval
from evaluator.models import load_tokenizer
from evaluator.recipes import ResolvedRecipe, resolve_recipe
from mathrl.sink import Sink
from mathrl.specs import EvalSpec


def run_eval(
    spec: EvalSpec,
    sink: Sink,
    *,
    model_path: str,
    data_dir: str | None,
    results_dir: Path | None = None,
    model_ref: str | None = None,
    checkpoint: str | None = None,
    work_dir: Path | None = None,
    rm_scorer: Callable[[str], RMScorer] | None = None,
    judge: Callable[[str], Judge] | None = None,
    resolved_recipe: ResolvedRecipe | None = None,
) -> dict[str, float]:
    """Evaluate and report through the sink. `model_path` is the resolved local path or hub id;
    `model_ref` is what the user asked for (kept on every score). Per-item results go to
    results_dir/items.jsonl (written into work_dir first when given; the sink moves them).
    `rm_scorer`: loads a reward model for a spec grader that has one (evaluator/graders.py);
    `judge`: a grading model, for a spec grader with score_model or label_model parts.
    `resolved_recipe`: the one resolved at submit (evaluator.recipes.stored_recipe); else resolved now."""
    bench, problems = _problems(spec, data_dir)
    resolved = resolved_recipe or resolve_recipe(spec)
    recipe = resolved.recipe
    sink.event(
        "loading",
        f"{len(problems)} problems from {bench.name} v{bench.version}, recipe {resolved.name!r}; loading {model_path}",
    )
    t0 = time.monotonic()
    tokenizer = load_tokenizer(model_path)
    shots = prompts.shots_for(recipe, len(problems), data_dir)
    texts = [prompts.render(recipe, p.question, tokenizer, shots=sh) for p, sh in zip(problems, shots, strict=True)]
    s = spec.sampling
    max_new_tokens = resolved.max_new_tokens
    engine = backend(spec.backend)
    max_model_len = None  # the longest sequence this run needs, for an engine sized by it
    if engine.sized_by_sequence:
        longest = max((len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts), default=0)
        max_model_len = longest + max_new_tokens
    model = engine.load(model_path, dtype=spec.dtype, seed=s.seed, max_model_len=max_model_len, sink=sink)
    sink.event("loaded", f"{spec.backend} backend ready in {time.monotonic() - t0:.1f}s")

    t1 = time.monotonic()
    last = [0.0]

    def on_batch(done: int, total: int) -> None:
        if time.monotonic() - last[0] > 1.0 or done == total:
            last[0] = time.monotonic()
            sink.progress(done, total, f"generating ({done / max(time.monotonic() - t1, 1e-9):.2f} problems/s)")

    gens = engine.generate(
        model,
        tokenizer,
        texts,
        max_new_tokens=max_new_tokens,
        stop=recipe.stop,
        temperature=s.temperature,
        top_p=s.top_p,
        n=s.n,
        seed=s.seed,
        batch_size=spec.batch_size,
        on_batch=on_batch,
        should_stop=sink.should_stop,
    )
    gen_seconds = time.monotonic() - t1

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
                rm_scorer=rm_scorer,
                judge=judge,
            )
        )
    grader_scores: list[float] = []
    items: list[dict[str, Any]] = []
    per_problem_correct: list[list[bool]] = []
    per_problem_answers: list[list[str | None]] = []
    for p, text, outs in zip(problems, texts, gens, strict=True):
        verdicts = [grade(g.text, p.gold, pattern=recipe.answer_pattern, truncated=g.truncated) for g in outs]
        per_problem_correct.append([v.correct for v in verdicts])
        per_problem_answers.append([v.extracted for v in verdicts])
        for j, (g, v) in enumerate(zip(outs, verdicts, strict=True)):
            extra: dict[str, Any] = {}
            if graded is not None:
                r = next(graded)
                grader_scores.append(r.score)
                extra = {"grader_score": r.score, "grader_reason": r.reason}
            items.append(
                {
                    "prompt": text,
                    "completion": g.text,
                    "data": {
                        "problem": p.index,
                        "sample": j,
                        "gold": p.gold,
                        "extracted": v.extracted,
                        "extracted_by": v.method,
                        "correct": v.correct,
                        "tokens": g.tokens,
                        "truncated": g.truncated,
                        **extra,
                        **p.meta,
                    },
                }
            )
    n_problems = len(problems)
    values: dict[str, float] = {}
    greedy_correct = sum(c[0] for c in per_problem_correct)
    values["accuracy"] = greedy_correct / max(n_problems, 1)
    intervals: dict[str, tuple[float, float]] = {"accuracy": wilson_interval(greedy_correct, n_problems)}
    for k in spec.k:
        if s.n > 1:
            pk = [pass_at_k(s.n, sum(c), k) for c in per_problem_correct]
            mk = [
                maj_at_k(a, c, k, same=answers_match)
                for a, c in zip(per_problem_answers, per_problem_correct, strict=True)
            ]
            values[f"pass@{k}"] = sum(pk) / max(n_problems, 1)
            values[f"maj@{k}"] = sum(mk) / max(n_problems, 1)
            intervals[f"maj@{k}"] = wilson_interval(int(sum(mk)), n_problems)
    all_gens = [g for outs in gens for g in outs]
    values["mean_completion_tokens"] = sum(g.tokens for g in all_gens) / max(len(all_gens), 1)
    values["truncation_rate"] = sum(g.truncated for g in all_gens) / max(len(all_gens), 1)
    values["problems_per_second"] = n_problems / max(gen_seconds, 1e-9)
    if grader_scores:
        values["grader/mean"] = sum(grader_scores) / len(grader_scores)

    sink.samples(None, items)
    if results_dir is not None:
        written = (work_dir or results_dir) / "items.jsonl"
        written.parent.mkdir(parents=True, exist_ok=True)
        with written.open("w") as f:
            for item in items:
                f.write(json.dumps(item) + "\n")
        sink.checkpoint(
            0, str(results_dir / "items.jsonl"), kind="results", data={"items": len(items)}, source=str(written)
        )

    provenance = {
        "model_ref": model_ref or model_path,
        "checkpoint": checkpoint,
        "benchmark": bench.name,
        "benchmark_version": bench.version,
        "n": n_problems,
        "sampling": {**s.model_dump(), "max_new_tokens": max_new_tokens},
        "backend": engine.name,
        "backend_version": engine.version(),
        "prompt_hash": recipe.digest(tokenizer.chat_template),
        "recipe": resolved.name,
        "recipe_config": resolved.record(),
        "seed": s.seed,
    }
    for metric, value in values.items():
        low, high = intervals.get(metric, (None, None))
        sink.score({**provenance, "metric": metric, "value": value, "ci_low": low, "ci_high": high})
    # MATH's subjects and levels: greedy accuracy per group, each with its own n and interval
    groups = accuracy_breakdown([p.meta for p in problems], [c[0] for c in per_problem_correct])
    for metric, (correct, n) in groups.items():
        low, high = wilson_interval(correct, n)
        sink.score({**provenance, "n": n, "metric": metric, "value": correct / n, "ci_low": low, "ci_high": high})
    sink.metrics(0, {f"eval/{k}": v for k, v in values.items()})
    low, high = intervals["accuracy"]
    sink.event(
        "scored",
        f"{bench.name}: accuracy {values['accuracy']:.1%} (95% CI {low:.1%}-{high:.1%}) on {n_problems} problems",
        data=values,
    )
    return {**values, **{metric: correct / n for metric, (correct, n) in groups.items()}}


def _problems(spec: EvalSpec, data_dir: str | None) -> tuple[Benchmark, list[Problem]]:
    if spec.dataset is not None and (spec.dataset.path is not None or spec.dataset.hub is not None):
        d = spec.dataset
        bench = Benchmark(
            name=f"custom:{custom_source(d)}",
            version="user",
            hub_id=d.hub or "",
            hub_config=d.config,
            split=d.split if d.hub else "train",
            local_file=None,
            question_field=d.question_field,
            answer_field=d.answer_field,
            gold_format="latex",
            recipe="math-chat",
        )
        return bench, load_custom_set(d, spec.limit)
    if spec.dataset is not None and spec.dataset.name is not None:  # a registered set named as a dataset
        bench = find_benchmark(spec.dataset.name, spec.dataset.split)
        return bench, load_benchmark(bench, data_dir, spec.limit or spec.dataset.limit)
    bench = get_benchmark(spec.benchmark)
    return bench, load_benchmark(bench, data_dir, spec.limit)
