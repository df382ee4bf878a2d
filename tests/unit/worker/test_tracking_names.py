"""What the MLflow mirror sends, with no server: the resolved config flattened into params and
metric names made keys MLflow accepts (the mirror against a real server: tests/system/test_tracking.py)."""

from __future__ import annotations

import pytest

from worker.tracking import (
    MAX_KEY,
    MAX_PARAM_VALUE,
    flatten_params,
    mlflow_key,
)


@pytest.mark.quick
def test_the_resolved_config_flattens_into_params_mlflow_takes() -> None:
    config = {
        "kind": "grpo",
        "learning_rate": 1e-6,
        "use_vllm": False,
        "max_steps": None,
        "resources": {"gpus": 8, "pool": None},
        "sampling": {"temperature": 0.7, "stop": ["\n\n", "####"]},
        "reward_weights": {},
        "reward_funcs": ["accuracy", "format"],
        "items": [{"prompt": "x" * 100}] * 100,  # a grader's inline items: far over 6000 characters
        "metric/with=odd:chars": 1,
    }
    params = flatten_params(config)
    assert params["kind"] == "grpo" and float(params["learning_rate"]) == 1e-6 and params["use_vllm"] == "False"
    assert params["max_steps"] == "None" and params["resources.gpus"] == "8" and params["resources.pool"] == "None"
    assert params["sampling.temperature"] == "0.7" and params["sampling.stop"] == '["\\n\\n", "####"]'
    assert params["reward_weights"] == "{}" and params["reward_funcs"] == '["accuracy", "format"]'
    assert len(params["items"]) == MAX_PARAM_VALUE and params["items"].endswith("...(truncated)")
    assert params["metric/with_odd_chars"] == "1"
    assert all(len(k) <= MAX_KEY for k in params)


@pytest.mark.quick
def test_metric_names_become_keys_mlflow_accepts() -> None:
    assert mlflow_key("train/loss") == "train/loss"
    assert mlflow_key("accuracy/subject=Counting & Probability") == "accuracy/subject_Counting _ Probability"
    assert mlflow_key("/a//b/./c/") == "a/b/c" and mlflow_key("../x") == "__/x" and mlflow_key("") == "_"
    long_a, long_b = "m" * 300 + "a", "m" * 300 + "b"
    assert len(mlflow_key(long_a)) == MAX_KEY and mlflow_key(long_a) != mlflow_key(long_b)
