"""Prompt recipes: the lm-eval entries render exactly what lm-evaluation-harness itself built
(fixtures written by the pinned lm-eval: `bench/lm_eval_compare.py fixtures`), old specs keep
their prompts, and bad recipes are refused with the field named."""

from __future__ import annotations

import json

import pytest

from evaluator import prompts
from evaluator.backends.hf_generate import cut_at_stop
from evaluator.benchmarks import REGISTRY, get_benchmark
from evaluator.data import load_benchmark
from evaluator.grading import grade
from evaluator.recipes import RECIPES, UnknownRecipe, get_recipe, resolve_recipe
from mathrl.errors import FieldError
from mathrl.recipe import Recipe
from mathrl.specs import EvalSpec
from tests.helpers import env
from tests.helpers.env import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "lm_eval"
LM_EVAL_RECIPES = sorted(p.stem for p in FIXTURES.glob("*.json"))


@pytest.mark.quick
def test_every_lm_eval_recipe_has_a_fixture() -> None:
    assert LM_EVAL_RECIPES == ["lm-eval-gsm8k", "lm-eval-gsm8k-cot", "minerva-math"]


@pytest.mark.parametrize("name", LM_EVAL_RECIPES)
def test_recipe_renders_what_lm_eval_built(name: str, smollm2: str) -> None:
    from transformers import AutoTokenizer

    smollm2_tokenizer = AutoTokenizer.from_pretrained(smollm2)
    data_dir = env.data_dir()
    fixture = json.loads((FIXTURES / f"{name}.json").read_text())
    recipe = get_recipe(name)
    problems = load_benchmark(get_benchmark(fixture["benchmark"]), data_dir, len(fixture["items"]))
    shots = prompts.shots_for(recipe, len(problems), data_dir)
    for item, problem, sh in zip(fixture["items"], problems, shots, strict=True):
        assert problem.question == item["question"]
        ours = prompts.render(recipe, problem.question, smollm2_tokenizer, shots=sh)
        assert ours == item["prompt"], f"{name}, document {item['doc_id']}"
        # and so the same tokens (both tokenize the context without special tokens)
        ids = smollm2_tokenizer(ours, add_special_tokens=False).input_ids
        assert ids == smollm2_tokenizer(item["prompt"], add_special_tokens=False).input_ids
        assert recipe.stop == item["until"]


@pytest.mark.quick
def test_old_specs_keep_their_prompts() -> None:
    """No recipe in the spec: the benchmark's own zero-shot chat prompt, as before recipes."""
    spec = EvalSpec(model="m", benchmark="gsm8k")
    resolved = resolve_recipe(spec)
    assert resolved.name == "gsm8k-chat" and resolved.recipe.few_shot == 0 and resolved.max_new_tokens == 512
    text = prompts.render(resolved.recipe, "What is 2+3?", None)
    assert text == (
        "You are a careful math tutor. Solve the problem step by step.\n"
        "What is 2+3?\n\nThink step by step, then give the final answer as a number on its own line "
        "in the form '#### <answer>'.\n"
    )
    # few_shot given in the spec: the first train rows as chat turns, as before
    two = resolve_recipe(EvalSpec(model="m", benchmark="gsm8k", few_shot=2)).recipe
    shots = prompts.shots_for(two, 3, env.data_dir())
    assert shots[0] == shots[2] and len(shots[0]) == 2 and "####" in shots[0][0][1]
    assert resolve_recipe(EvalSpec(model="m", benchmark="math500")).name == "math-chat"
    assert {b.recipe for b in REGISTRY.values()} <= set(RECIPES)


@pytest.mark.quick
def test_spec_fields_override_the_recipe() -> None:
    spec = EvalSpec(
        model="m", recipe="lm-eval-gsm8k", few_shot=3, system_prompt="Solve.", sampling={"max_new_tokens": 64}
    )
    r = resolve_recipe(spec)
    assert (r.recipe.few_shot, r.recipe.system, r.max_new_tokens) == (3, "Solve.", 64)
    assert r.name == "lm-eval-gsm8k" and r.record()["few_shot"] == 3
    plain = resolve_recipe(EvalSpec(model="m", recipe="lm-eval-gsm8k"))
    assert (plain.recipe.few_shot, plain.max_new_tokens) == (5, 256)
    assert plain.recipe.digest() != r.recipe.digest()


@pytest.mark.quick
def test_a_job_runs_the_recipe_it_was_admitted_with(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker reads the recipe resolved at submit from the job's config: a registry entry
    changed between submit and run (a worker upgraded meanwhile) does not change the prompt."""
    from config.settings import get_settings
    from evaluator.recipes import stored_recipe
    from kinds import HOMES, resolve_config
    from mathrl.specs.resolved import ResolvedEval, resolved

    spec = EvalSpec(model="m", recipe="lm-eval-gsm8k", few_shot=3)
    config = resolve_config(spec).of(ResolvedEval)
    HOMES["eval"].admit(spec, config, get_settings())
    admitted = resolve_recipe(spec)
    changed = get_recipe("lm-eval-gsm8k").model_copy(update={"stop": ["Q:"], "max_new_tokens": 99})
    monkeypatch.setitem(RECIPES._entries, "lm-eval-gsm8k", changed)  # a worker upgraded meanwhile
    assert resolve_recipe(spec).recipe.stop == ["Q:"]  # what resolving again would run
    stored = stored_recipe(resolved(json.loads(json.dumps(config.record()))).of(ResolvedEval))  # from the database
    assert stored is not None and stored.record() == admitted.record()
    assert (stored.name, stored.max_new_tokens, stored.recipe.few_shot) == ("lm-eval-gsm8k", 256, 3)
    assert stored.recipe.digest() == admitted.recipe.digest()
    assert stored_recipe(ResolvedEval(sampling=spec.sampling)) is None  # admitted before recipes were stored


@pytest.mark.quick
def test_inline_recipe() -> None:
    spec = EvalSpec.model_validate(
        {"model": "m", "recipe": {"format": "text", "question": "Q: {question}\nA:", "stop": ["Q:"]}}
    )
    r = resolve_recipe(spec)
    assert r.name == "inline" and r.recipe.stop == ["Q:"]
    assert prompts.render(r.recipe, "1+1?", None) == "Q: 1+1?\nA:"


@pytest.mark.quick
def test_bad_recipes_name_the_field() -> None:
    with pytest.raises(UnknownRecipe, match="Did you mean 'lm-eval-gsm8k'"):
        resolve_recipe(EvalSpec(model="m", recipe="lm-eval-gsm8"))
    with pytest.raises(FieldError, match="more than the 8 shots") as info:
        resolve_recipe(EvalSpec(model="m", recipe="lm-eval-gsm8k-cot", few_shot=9))
    assert info.value.field == "few_shot"
    with pytest.raises(ValueError, match="needs 'shots' or 'shots_from'"):
        Recipe(few_shot=2)
    with pytest.raises(ValueError, match="needs a group"):
        Recipe(answer_pattern="####")
    with pytest.raises(ValueError, match="must hold '\\{question\\}'"):
        Recipe(question="Solve it")


@pytest.mark.quick
def test_random_shots_differ_per_question_and_repeat_per_seed() -> None:
    recipe = get_recipe("lm-eval-gsm8k")
    data_dir = env.data_dir()
    a = prompts.shots_for(recipe, 3, data_dir)
    assert a[0] != a[1] and len(a[0]) == 5
    assert a == prompts.shots_for(recipe, 3, data_dir)


@pytest.mark.quick
def test_stop_strings_and_answer_pattern() -> None:
    assert cut_at_stop("18\n#### 18\n\nQuestion: next", ["Question:", "</s>"]) == ("18\n#### 18\n\n", True)
    assert cut_at_stop("no stop here", ["Question:"]) == ("no stop here", False)
    strict = get_recipe("lm-eval-gsm8k").answer_pattern
    assert grade("so 9 * 2 = 18\n#### 1,018.", "1018", pattern=strict).correct
    # strict-match: no '####' line, no answer, even with a number in the text
    v = grade("She makes 18 dollars.", "18", pattern=strict)
    assert (v.extracted, v.correct) == (None, False)
    assert grade("She makes 18 dollars.", "18").correct  # the default extraction finds the last number
    cot = get_recipe("lm-eval-gsm8k-cot").answer_pattern
    assert grade("5 + 4 = 9. The answer is 9.", "9", pattern=cot).extracted == "9"
