"""Reward functions on literal cases."""

from __future__ import annotations

import pickle

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
