"""The prompt recipes, as data: one entry per recipe (its fields: mathrl/recipe.py).

A benchmark names its default recipe (evaluator/benchmarks.py); an eval spec may pick another
by name or give one inline. The lm-evaluation-harness entries reproduce that tool's prompts
token for token (tests/unit/evaluator/test_recipes.py compares them with prompts the pinned lm-eval wrote:
tests/fixtures/lm_eval/, made by `bench/lm_eval_compare.py fixtures`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mathrl.errors import FieldError
from mathrl.recipe import Recipe, Shot
from mathrl.registry import Registry
from mathrl.specs import DEFAULT_MAX_NEW_TOKENS, EvalSpec
from mathrl.specs.resolved import ResolvedEval
from runtime.errors import UnknownRecipe as UnknownRecipe  # raised here; its callers import it from here

# the lm-eval-* entries reproduce lm-evaluation-harness 0.4.13 (docs/benchmarks.md: item for item)


def _shots(name: str) -> list[Shot]:
    """Worked examples copied verbatim from their source (named in the file): evaluator/shots/."""
    data = json.loads((Path(__file__).parent / "shots" / f"{name}.json").read_text())
    return [Shot(**shot) for shot in data["shots"]]


GSM8K_COT_SHOTS = _shots("gsm8k_cot")
MINERVA_MATH_SHOTS = _shots("minerva_math")

_CHAT_SYSTEM = "You are a careful math tutor. Solve the problem step by step."


RECIPES: Registry[Recipe] = Registry("recipe", UnknownRecipe)
for _name, _recipe in {
    # mathrl's own zero-shot chat prompts (the defaults of the registered benchmarks)
    "gsm8k-chat": Recipe(
        format="chat",
        system=_CHAT_SYSTEM,
        question="{question}\n\nThink step by step, then give the final answer as a number "
        "on its own line in the form '#### <answer>'.",
        shots_from="gsm8k-train",
    ),
    "math-chat": Recipe(
        format="chat",
        system=_CHAT_SYSTEM,
        question="{question}\n\nReason step by step, and put your final answer within \\boxed{}.",
        shots_from="math-train",
    ),
    "plain": Recipe(format="chat", question="{question}"),
    "arith-words": Recipe(format="chat", question="What is {question}? Give the final answer as a number."),
    "word-problem": Recipe(format="chat", question="{question} Give the final answer as a number."),
    # lm-evaluation-harness 0.4.13 `gsm8k` (v3.0): 5 shots drawn per question from the train split
    # by random.Random(1234), "Question: ...\nAnswer:" text, no chat template, strict-match answer
    "lm-eval-gsm8k": Recipe(
        format="text",
        question="Question: {question}\nAnswer:",
        few_shot=5,
        shots_from="gsm8k-train",
        shot_answer="solution",
        sampler="random",
        shot_seed=1234,
        stop=["Question:", "</s>", "<|im_end|>"],
        answer_pattern=r"#### (\-?[0-9\.\,]+)",
        max_new_tokens=256,
    ),
    # lm-evaluation-harness 0.4.13 `gsm8k_cot` (v3.0): the 8 fixed chain-of-thought exemplars
    "lm-eval-gsm8k-cot": Recipe(
        format="text",
        question="Q: {question}\nA:",
        few_shot=8,
        shots=GSM8K_COT_SHOTS,
        stop=["Q:", "</s>", "<|im_end|>"],
        answer_pattern=r"The answer is (\-?[0-9\.\,]+).",
        max_new_tokens=256,
    ),
    # Minerva's MATH prompt as lm-evaluation-harness 0.4.13 `minerva_math*` (v3.1) writes it: 4 fixed
    # worked solutions, "Problem:\n...\n\nSolution:", stop at the next "Problem:"
    "minerva-math": Recipe(
        format="text",
        question="Problem:\n{question}\n\nSolution:",
        few_shot=4,
        shots=MINERVA_MATH_SHOTS,
        stop=["Problem:"],
        max_new_tokens=256,
    ),
}.items():
    RECIPES.add(_name, _recipe)


def get_recipe(name: str) -> Recipe:
    return RECIPES[name]


@dataclass(frozen=True)
class ResolvedRecipe:
    name: str  # the registered name it started from, or 'inline'
    recipe: Recipe  # with the spec's explicit few_shot / system_prompt applied
    max_new_tokens: int  # the spec's sampling.max_new_tokens, else the recipe's, else the default

    def record(self) -> dict[str, Any]:
        """What a score keeps of it (store: benchmark_scores.recipe_config)."""
        return {"name": self.name, **self.recipe.model_dump(mode="json")}


def stored_recipe(config: ResolvedEval) -> ResolvedRecipe | None:
    """The recipe resolved at submit, from a job's resolved_config (`recipe` and the completion
    length): a queued job runs the prompt it was admitted with, even if the registry's entry
    changed meanwhile (a worker upgraded between submit and run). None for a config without one
    (jobs admitted before recipes were stored)."""
    record = config.recipe
    if not isinstance(record, dict) or "name" not in record:
        return None
    body = {k: v for k, v in record.items() if k != "name"}
    length = config.sampling.max_new_tokens
    recipe = Recipe.model_validate(body)
    return ResolvedRecipe(str(record["name"]), recipe, int(length or recipe.max_new_tokens or DEFAULT_MAX_NEW_TOKENS))


def resolve_recipe(spec: EvalSpec) -> ResolvedRecipe:
    """The recipe an eval spec runs with: `spec.recipe` (a name or inline), else its benchmark's
    default ('math-chat' for a user's file); the spec's `few_shot`, `system_prompt` and
    `sampling.max_new_tokens`, when given, override the recipe's. Raises UnknownRecipe, or
    FieldError naming the field, for what cannot run (the API answers both with a 422)."""
    from evaluator.benchmarks import find_benchmark, get_benchmark

    if isinstance(spec.recipe, Recipe):
        name, recipe = "inline", spec.recipe
    else:
        if spec.recipe is not None:
            name = spec.recipe
        elif spec.dataset is not None and spec.dataset.name is not None:
            name = find_benchmark(spec.dataset.name, spec.dataset.split).recipe
        elif spec.dataset is not None:  # a path, an upload or a hub dataset
            name = "math-chat"
        else:
            name = get_benchmark(spec.benchmark).recipe
        recipe = get_recipe(name)
    changes: dict[str, Any] = {}
    if spec.few_shot is not None:
        changes["few_shot"] = spec.few_shot
    if spec.system_prompt is not None:
        changes["system"] = spec.system_prompt
    if changes:
        try:
            recipe = Recipe.model_validate({**recipe.model_dump(), **changes})
        except ValueError as exc:  # pydantic's ValidationError wraps the recipe's FieldError
            raise FieldError("few_shot", _first_message(exc)) from None
    if recipe.few_shot and not recipe.shots and recipe.shots_from is not None:
        get_benchmark(recipe.shots_from)  # UnknownBenchmark for a name the registry lacks
    max_new_tokens = spec.sampling.max_new_tokens or recipe.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    return ResolvedRecipe(name=name, recipe=recipe, max_new_tokens=max_new_tokens)


def _first_message(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        for err in errors():
            return str(err.get("msg", exc)).removeprefix("Value error, ")
    return str(exc)
