"""Reward functions on literal cases."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from mathrl.specs import REWARD_NAMES
from trainer.rewards import REGISTRY, Overlong, UnknownReward, get_reward

pytestmark = pytest.mark.quick


def test_registry_matches_the_names_a_spec_accepts() -> None:
    assert set(REGISTRY) == set(REWARD_NAMES)


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
    r = Overlong(max_length=100, buffer=20)
    assert [r.penalty(n) for n in (50, 80, 90, 100, 130)] == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert r(["x"] * 2, completion_ids=[[1] * 80, [1] * 95]) == [0.0, -0.75]


def test_unknown_reward_suggests_a_name() -> None:
    with pytest.raises(UnknownReward, match="Did you mean 'accuracy'"):
        get_reward("acuracy")


def test_rewards_are_picklable_and_named() -> None:
    for name in ("accuracy", "binary", "format", "overlong"):
        r = pickle.loads(pickle.dumps(get_reward(name)))
        assert r.__name__ == name
    rm = get_reward("reward_model", model="/some/rm")
    assert pickle.loads(pickle.dumps(rm)).model_path == "/some/rm"


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
