"""GRPO's rewards on literal cases: each named reward is a grader (RewardRef.as_grader)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from mathrl.specs import REWARD_NAMES, RewardRef
from trainer.rewards import UnknownReward, get_reward

pytestmark = pytest.mark.quick


def test_every_name_a_spec_accepts_is_a_grader() -> None:
    for name in REWARD_NAMES:
        fields = {"grader": {"type": "math"}} if name == "grader" else {}
        fields |= {"model": "/some/rm"} if name == "reward_model" else {}
        grader = RewardRef(name=name, **fields).as_grader(64)
        assert grader.type in {"math", "boxed_format", "length_penalty", "reward_model"}, (name, grader)


@pytest.mark.parametrize(
    ("completion", "gold", "accuracy", "binary", "fmt"),
    [
        ("so the answer is \\boxed{42}", "42", 1.0, 1.0, 1.0),
        ("so the answer is \\boxed{41}", "42", 0.0, -1.0, 1.0),
        ("I am not sure.", "42", 0.0, -0.5, 0.0),
        ("3 + 4 = 7\n#### 7", "7", 1.0, 1.0, 0.0),
        ("half of it: \\boxed{\\frac{1}{2}}", "0.5", 1.0, 1.0, 1.0),
        ("\\boxed{}", "3", 0.0, -0.5, 0.0),
        ("The answer is 1,000.", "1000", 1.0, 1.0, 0.0),
    ],
)
def test_rule_rewards(completion: str, gold: str, accuracy: float, binary: float, fmt: float) -> None:
    assert get_reward("accuracy")([completion], answer=[gold]) == [accuracy]
    assert get_reward("binary")([completion], answer=[gold]) == [binary]
    assert get_reward("format")([completion], answer=[gold]) == [fmt]


def test_conversational_completions() -> None:
    msgs = [[{"role": "assistant", "content": "\\boxed{5}"}]]
    assert get_reward("accuracy")(msgs, answer=["5"]) == [1.0]


def test_overlong_penalty_is_linear_in_the_buffer() -> None:
    r = get_reward("overlong", max_length=100, buffer=20)
    ids = [[1] * n for n in (50, 80, 90, 95, 100, 130)]
    assert r(["x"] * len(ids), completion_ids=ids) == [0.0, 0.0, -0.5, -0.75, -1.0, -1.0]
    # its default buffer: a quarter of the run's max_completion_length
    assert get_reward("overlong", max_length=100).grader.buffer == 25
    # without token ids (a direct call): whitespace words
    assert get_reward("overlong", max_length=10, buffer=5)(["a b c d e f g h"]) == [-0.6]


def test_a_missing_gold_answer_is_not_scored_and_binary_keeps_its_three_values() -> None:
    assert get_reward("accuracy")(["\\boxed{3}", "\\boxed{3}"], answer=[None, "3"]) == [None, 1.0]
    assert get_reward("binary").grader.model_dump() == {
        "type": "math",
        "answer_pattern": None,
        "wrong_score": -1.0,
        "no_answer_score": -0.5,
    }


def test_unknown_reward_suggests_a_name() -> None:
    with pytest.raises(UnknownReward, match="Did you mean 'accuracy'"):
        get_reward("acuracy")


def test_rewards_are_picklable_and_named() -> None:
    for name in ("accuracy", "binary", "format", "overlong"):
        r = pickle.loads(pickle.dumps(get_reward(name)))
        assert r.__name__ == name
    rm = get_reward("reward_model", model="/some/rm")
    assert rm.__name__ == "reward_model" and pickle.loads(pickle.dumps(rm)).grader.model == "/some/rm"


@pytest.mark.quick
def test_rm_scores_the_text_as_the_reward_trainer_trained_it(tmp_path: Path) -> None:
    """TRL's RewardTrainer appends EOS to every chosen/rejected text and the score is read at
    the last token: scoring without it reads a position the RM never learned."""
    from evaluator.models import load_tokenizer
    from trainer.reward_model import rm_text
    from trainer.tiny import build_tiny_model

    tok = load_tokenizer(str(build_tiny_model(tmp_path / "m")))
    assert rm_text(tok, "12+30=", "42") == "12+30=42" + tok.eos_token
    assert rm_text(tok, "12+30=", "42" + tok.eos_token) == "12+30=42" + tok.eos_token


def test_process_rm_grades_a_step_by_the_whole_solution_its_rollout_finishes() -> None:
    """A prefix that already states the answer, and a rollout that stops at once: the step is
    good (graded alone, the empty continuation had no answer and the step was labelled bad)."""
    from evaluator.backends.base import Generation
    from trainer.reward_model import step_rollout_correct

    solved = "40 + 2 = 42\nThe answer is 42\n"
    assert step_rollout_correct(solved, Generation("", 0, False), "42")
    assert step_rollout_correct("40 + 2 = 42\n", Generation("#### 42", 4, False), "42")
    assert not step_rollout_correct("40 + 2 = 43\n", Generation("", 0, False), "42")
    # a continuation cut off by the length limit: no last-number guess
    assert not step_rollout_correct("40 + 2 =\n", Generation(" 42 and then", 5, True), "42")


def test_held_out_questions_are_never_trained_on_even_when_the_set_repeats_a_question() -> None:
    from evaluator.data import Problem
    from trainer.reward_model import split_heldout

    problems = [Problem(0, f"{a}+{b}=", str(a + b)) for a in range(10, 30) for b in (1, 2)] * 2
    held, train = split_heldout(problems, 0.2, seed=3)
    assert len(held) == 16 and len(train) == 64  # 8 of 40 distinct questions, each twice
    assert not {p.question for p in held} & {p.question for p in train}


def test_held_out_pairs_are_scored_per_question_even_when_two_questions_share_a_prompt() -> None:
    """Two sampled questions with the same prompt text (a set that repeats a question): each
    question's pairs are scored with its own completions (this raised KeyError before)."""
    from evaluator.data import Problem
    from trainer.reward_model import Sampled, heldout_scores

    p = Problem(0, "7+8=", "15")
    a = Sampled(p, "7+8=\n", ["15", "14"], ["15", "14"], [True, False])
    b = Sampled(p, "7+8=\n", ["15", "16", "15"], ["15", "16", "15"], [True, False, True])

    def by_value(model: object, tok: object, prompt: str, completions: list[str]) -> list[float]:
        return [-abs(float(c) - 15) for c in completions]  # ranks the true sum first

    values, counts = heldout_scores([a, b], by_value, None, None, samples=8, seed=0)
    assert counts["pairwise_accuracy"] == (3, 3)  # (15,14) and (15,16) twice
    assert values["best_of_8_accuracy"] == 1.0 and values["maj_at_8_accuracy"] == 1.0
