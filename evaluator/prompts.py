"""Rendering prompts from a recipe (mathrl/recipe.py; the entries: evaluator/recipes.py), and
choosing each question's worked examples."""

from __future__ import annotations

import random
from typing import Any

from mathrl.recipe import Recipe

Shots = list[tuple[str, str]]  # (question, answer) pairs, in the order they are shown


def as_recipe(recipe: Recipe | str) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    from evaluator.recipes import get_recipe

    return get_recipe(recipe)


def _question(recipe: Recipe, question: str) -> str:
    return recipe.question.replace("{question}", question)


def _answer(recipe: Recipe, answer: str) -> str:
    return recipe.answer.replace("{answer}", answer)


def messages(
    recipe: Recipe | str, question: str, system_prompt: str | None = None, shots: Shots | None = None
) -> list[dict[str, str]]:
    """The prompt as chat messages (system, few-shot turns, the question)."""
    r = as_recipe(recipe)
    system = r.system if system_prompt is None else system_prompt
    turns: list[dict[str, str]] = []
    if system:
        turns.append({"role": "system", "content": system})
    for q, a in shots or []:
        turns.append({"role": "user", "content": _question(r, q)})
        turns.append({"role": "assistant", "content": _answer(r, a)})
    turns.append({"role": "user", "content": _question(r, question)})
    return turns


def render(
    recipe: Recipe | str,
    question: str,
    tokenizer: Any | None,
    system_prompt: str | None = None,
    shots: Shots | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The full prompt string. Text recipes: lm-evaluation-harness's layout (description, then
    each shot as question + target_delimiter + answer + fewshot_delimiter, then the question).
    Chat recipes: through the tokenizer's chat template when it has one, else plain lines; `tools`:
    the tool schemas the template renders (a `chat-template` tool job's: evaluator/tool_formats.py)."""
    r = as_recipe(recipe)
    if r.format == "text":
        system = r.system if system_prompt is None else system_prompt
        parts = [system]
        for q, a in shots or []:
            parts.append(_question(r, q) + r.target_delimiter + _answer(r, a) + r.fewshot_delimiter)
        parts.append(_question(r, question))
        return "".join(parts)
    return render_turns(messages(r, question, system_prompt, shots), tokenizer, tools)


def render_turns(turns: list[dict[str, str]], tokenizer: Any | None, tools: list[dict[str, Any]] | None = None) -> str:
    """Chat messages as the prompt string: through the tokenizer's chat template when it has one,
    else plain lines. A user's file of chats (format 'messages' or 'items') is rendered so, as given."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        extra = {"tools": tools} if tools else {}
        text: str = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True, **extra)
        return text
    lines = [f"{m['content']}\n" if m["role"] != "assistant" else f"{m['content']}\n\n" for m in turns]
    return "".join(lines)


def shots_for(recipe: Recipe, count: int, data_dir: str | None) -> list[Shots]:
    """The worked examples of each of `count` questions (in order): the recipe's fixed shots, or
    rows of its `shots_from` benchmark; 'first_n' gives every question the first few_shot,
    'random' draws few_shot per question from random.Random(shot_seed), as lm-eval's default
    sampler does (so the i-th question gets the same shots as lm-eval's i-th document)."""
    k = recipe.few_shot
    if k == 0:
        return [[] for _ in range(count)]
    if recipe.shots:
        pool = [(s.question, s.answer) for s in recipe.shots]
    else:
        from evaluator.benchmarks import get_benchmark
        from evaluator.data import load_benchmark

        source = get_benchmark(recipe.shots_from or "")
        rows = load_benchmark(source, data_dir, k if recipe.sampler == "first_n" else None)
        pool = [(p.question, (p.solution or p.gold) if recipe.shot_answer == "solution" else p.gold) for p in rows]
    if len(pool) < k:
        raise ValueError(f"few_shot={k} but the recipe's shot pool holds {len(pool)}: lower few_shot")
    if recipe.sampler == "first_n":
        return [pool[:k] for _ in range(count)]
    rnd = random.Random(recipe.shot_seed)
    # random.sample picks by position only, so sampling indices draws exactly what lm-eval draws
    return [[pool[i] for i in rnd.sample(range(len(pool)), k)] for _ in range(count)]
