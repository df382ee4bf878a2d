"""Training questions with their gold answers, rendered with the same prompts as evaluation."""

from __future__ import annotations

import json
from typing import Any

from evaluator import prompts
from evaluator.benchmarks import find_benchmark
from evaluator.data import Problem, load_benchmark, load_custom_set
from mathrl.jsonl_files import text_of
from mathrl.recipe import Recipe
from mathrl.specs import DatasetRef


def load_problems(ref: DatasetRef, data_dir: str | None) -> tuple[list[Problem], str]:
    """The problems and the name of the prompt recipe they use (evaluator/recipes.py)."""
    if ref.path is not None or ref.hub is not None:
        return load_custom_set(ref), "math-chat"
    assert ref.name is not None
    bench = find_benchmark(ref.name, ref.split)
    return load_benchmark(bench, data_dir, ref.limit), bench.recipe


def render_prompt(
    problem: Problem, template: Recipe | str, tokenizer: Any, tools: list[dict[str, Any]] | None = None
) -> str:
    """The prompt text of a problem: its chat with the model's template when it came as OpenAI's
    fine-tuning JSONL (meta['messages'], as its author wrote it), else the recipe's rendering."""
    messages = problem.meta.get("messages")
    if messages is None:
        return prompts.render(template, problem.question, tokenizer, tools=tools)
    chat = [{"role": m["role"], "content": text_of(m["content"])} for m in messages]
    return prompts.render_turns(chat, tokenizer, tools)


def item_column(problems: list[Problem]) -> list[str]:
    """The grader's `item` of each problem, as JSON (its fields may differ in type from row to row)."""
    return [json.dumps(p.meta.get("item", {})) for p in problems]


def prompt_dataset(
    problems: list[Problem],
    template: Recipe | str,
    tokenizer: Any,
    max_prompt_tokens: int | None = None,
    conversational: bool = False,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[Any, int]:
    """A `datasets.Dataset` with 'prompt' and 'answer' columns; returns it and how many
    problems were dropped for a prompt over `max_prompt_tokens`. The prompt is the rendered
    text, or with `conversational` the chat messages (for trainers that apply the template)."""
    from datasets import Dataset

    rows = []
    dropped = 0
    for p in problems:
        messages = p.meta.get("messages")
        text = render_prompt(p, template, tokenizer, tools)
        if (
            max_prompt_tokens is not None
            and len(tokenizer(text, add_special_tokens=False).input_ids) > max_prompt_tokens
        ):
            dropped += 1
            continue
        prompt = (
            (messages if messages is not None else prompts.messages(template, p.question)) if conversational else text
        )
        row = {"prompt": prompt, "answer": p.gold}
        if "item" in p.meta:  # the grader's `item`, as JSON: its fields may differ in type from row to row
            row["item"] = json.dumps(p.meta["item"])
        rows.append(row)
    if not rows:
        raise ValueError(f"every prompt is longer than max_prompt_length={max_prompt_tokens}: raise it")
    return Dataset.from_list(rows), dropped
