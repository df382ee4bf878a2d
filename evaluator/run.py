"""`run_eval(spec, sink)`: prompts -> generations (evaluator/backends) -> grades and metrics
(evaluator/scoring.py) -> scores and per-item records (evaluator/report.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from evaluator import prompts
from evaluator.backends import BackendOptions, Decoding, backend
from evaluator.benchmarks import Benchmark, find_benchmark, get_benchmark
from evaluator.data import Problem, custom_source, load_benchmark, load_custom_set
from evaluator.graders import Judge, RMScorer
from evaluator.models import context_length, load_tokenizer
from evaluator.python_tool import job_tool
from evaluator.recipes import ResolvedRecipe, resolve_recipe
from evaluator.report import report_scores, write_items
from evaluator.sandbox import SandboxLimits
from evaluator.scoring import score
from evaluator.tool_formats import tool_format
from evaluator.tool_rollouts import TOOL_OUTPUT_MARGIN, generate_with_tools
from mathrl.specs import EvalSpec
from runtime.sink import Sink


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
    backend_options: BackendOptions | None = None,
    sandbox: SandboxLimits | None = None,
) -> dict[str, float]:
    """Evaluate and report through the sink. `model_path` is the resolved local path or hub id;
    `model_ref` is what the user asked for (kept on every score). Per-item results go to
    results_dir/items.jsonl (written into work_dir first when given; the sink moves them).
    `rm_scorer`: loads a reward model for a spec grader that has one (evaluator/graders.py);
    `judge`: a grading model, for a spec grader with score_model or label_model parts.
    `resolved_recipe`: the one resolved at submit (evaluator.recipes.stored_recipe); else resolved now.
    `backend_options`: the operator's engine settings and the worker's warm engine, if it gave one.
    `sandbox`: where and how a spec grader's python parts run (the operator's graders settings)."""
    bench, problems = _problems(spec, data_dir)
    resolved = resolved_recipe or resolve_recipe(spec)
    recipe = resolved.recipe
    sink.event(
        "loading",
        f"{len(problems)} problems from {bench.name} v{bench.version}, recipe {resolved.name!r}; loading {model_path}",
    )
    t0 = time.monotonic()
    tokenizer = load_tokenizer(model_path)
    fmt = tool_format(spec.tools.format, tokenizer) if spec.tools is not None else None
    if fmt is not None:  # the recipe tells the model how to call the tool (evaluator/tool_formats.py)
        recipe = fmt.recipe_for(recipe)
    chat_tools = fmt.chat_tools if fmt is not None else None
    shots = prompts.shots_for(recipe, len(problems), data_dir)
    # a user's file of chats is the prompt as written (format 'messages' or 'items'); else the recipe's
    texts = [
        prompts.render_turns(p.meta["messages"], tokenizer, chat_tools)
        if "messages" in p.meta
        else prompts.render(recipe, p.question, tokenizer, shots=sh, tools=chat_tools)
        for p, sh in zip(problems, shots, strict=True)
    ]
    s = spec.sampling
    max_new_tokens = resolved.max_new_tokens
    engine = backend(spec.backend, backend_options)
    prompt_tokens = [len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts]
    max_model_len = None  # the longest sequence this run needs, for an engine sized by it
    if engine.sized_by_sequence:
        max_model_len = max(prompt_tokens, default=0) + max_new_tokens
        if spec.tools is not None:  # every turn, and each call's output with the format's text around it
            t = spec.tools.python
            max_model_len += t.max_calls * (max_new_tokens + t.max_output_chars + TOOL_OUTPUT_MARGIN)
            max_model_len = context_length(model_path, max_model_len)
    gen = engine.load(model_path, tokenizer, dtype=spec.dtype, seed=s.seed, max_model_len=max_model_len, sink=sink)
    sink.event("loaded", f"{spec.backend} backend ready in {time.monotonic() - t0:.1f}s")

    t1 = time.monotonic()
    last = [0.0]

    def on_batch(done: int, total: int) -> None:
        if time.monotonic() - last[0] > 1.0 or done == total:
            last[0] = time.monotonic()
            sink.progress(done, total, f"generating ({done / max(time.monotonic() - t1, 1e-9):.2f} problems/s)")

    decoding = Decoding(
        max_new_tokens, tuple(recipe.stop), s.temperature, s.top_p, s.n, s.seed, batch_size=spec.batch_size
    )
    tool_seconds = None
    if spec.tools is not None and fmt is not None:
        t = spec.tools.python
        with job_tool(t.timeout_s, t.max_output_chars, sandbox) as tool:
            gens, tool_seconds = generate_with_tools(
                gen, texts, decoding, tool=tool, fmt=fmt, max_calls=t.max_calls, on_batch=on_batch,
                should_stop=sink.should_stop,
            )  # fmt: skip
    else:
        gens = gen.generate(texts, decoding, on_batch=on_batch, should_stop=sink.should_stop)
    gen_seconds = time.monotonic() - t1

    scored = score(spec, recipe, problems, texts, gens, gen_seconds, rm_scorer=rm_scorer, judge=judge, sandbox=sandbox)
    if tool_seconds is not None:
        scored.values["tool/seconds"] = tool_seconds
    for item in scored.items:
        item["data"]["prompt_tokens"] = prompt_tokens[item["data"]["problem"]]
    write_items(sink, scored.items, results_dir, work_dir)
    provenance = {
        "model_ref": model_ref or model_path,
        "checkpoint": checkpoint,
        "benchmark": bench.name,
        "benchmark_version": bench.version,
        "n": len(problems),
        # a tool run's settings with its sampling: its scores stand beside the same model's text-only ones
        "sampling": {**s.model_dump(), "max_new_tokens": max_new_tokens}
        | ({"tools": spec.tools.model_dump()} if spec.tools is not None else {}),
        "backend": engine.name,
        "backend_version": engine.version(),
        "prompt_hash": recipe.digest(tokenizer.chat_template),
        "recipe": resolved.name,
        "recipe_config": resolved.record(),
        "seed": s.seed,
    }
    return report_scores(sink, bench, problems, scored, provenance)


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
