"""A fine-tuning job's request mapped to its job (api/openai/fine_tuning_requests.py `to_spec`), without
FastAPI or a database: a supervised request as an SFT spec, a reinforcement one as a GRPO spec with its
grader's models as the operator's aliases name them, each hyperparameter as it was mapped, and a
hyperparameter whose value the spec refuses a 422 naming the spec's field, as POST /v1/fine_tuning/jobs
answers it."""

from __future__ import annotations

import pytest

from api.openai.fine_tuning_requests import (
    GROUP,
    RL_LEARNING_RATE,
    SFT_LEARNING_RATE,
    JobCreateParams,
    to_spec,
)
from api.problems import Problem
from mathrl.modelref import FINE_TUNING_TAG
from mathrl.specs import GRPOSpec, SFTSpec
from mathrl.specs.generate import REASONING_TOKENS

pytestmark = pytest.mark.quick

TRAINING, VALIDATION = "file-" + "a" * 32, "file-" + "b" * 32
ALIASES = {"o4-mini-2025-04-16": "org/base", "gpt-4o-2024-08-06": "org/judge"}
JUDGE = {
    "type": "score_model",
    "name": "judge",
    "model": "gpt-4o-2024-08-06",
    "input": [{"role": "user", "content": "Score {{sample.output_text}} against {{item.answer}}"}],
}


def test_a_supervised_request_is_an_sft_job() -> None:
    body = JobCreateParams.model_validate(
        {
            "model": "o4-mini-2025-04-16",
            "training_file": TRAINING,
            "validation_file": VALIDATION,
            "suffix": "adder",
            "seed": 7,
            "hyperparameters": {"n_epochs": 3, "batch_size": 2, "learning_rate_multiplier": 2.0},
        }
    )
    spec, mapping = to_spec(body, 10, validation_lines=9000, aliases=ALIASES)
    assert isinstance(spec, SFTSpec)
    assert (spec.model, spec.name, spec.seed, spec.tags) == ("org/base", "adder", 7, [FINE_TUNING_TAG])
    assert spec.dataset.file == TRAINING and spec.dataset.format == "messages"
    assert spec.learning_rate == SFT_LEARNING_RATE * 2.0 and spec.per_device_train_batch_size == 2
    assert (spec.max_steps, spec.save_steps) == (15, 3)  # 3 epochs of 10 lines, 2 a step; a checkpoint a quarter
    assert spec.eval is not None and (spec.eval.file, spec.eval.every, spec.eval.limit) == (VALIDATION, 3, 5000)
    assert mapping == {"n_epochs": 3, "batch_size": 2, "learning_rate_multiplier": 2.0}
    auto, mapped = to_spec(JobCreateParams(model="org/m", training_file=TRAINING), 10)  # 'auto' everywhere
    assert mapped == {"n_epochs": 1, "batch_size": 4, "learning_rate_multiplier": 1.0}
    assert isinstance(auto, SFTSpec) and auto.eval is None and auto.max_steps == 3


def test_a_reinforcement_request_is_a_grpo_job_graded_by_its_grader() -> None:
    hyperparameters = {"compute_multiplier": 2, "batch_size": 3, "eval_samples": 5, "reasoning_effort": "low"}
    body = JobCreateParams.model_validate(
        {
            "model": "org/m",
            "training_file": TRAINING,
            "validation_file": VALIDATION,
            "method": {"type": "reinforcement", "reinforcement": {"grader": JUDGE, "hyperparameters": hyperparameters}},
        }
    )
    spec, mapping = to_spec(body, 12, "vllm", validation_lines=40, aliases=ALIASES)
    assert isinstance(spec, GRPOSpec)
    assert spec.model == "org/m" and spec.generation.backend == "vllm"
    grader = spec.rewards[0].model_dump(mode="json")["grader"]
    assert grader["model"] == "org/judge"  # the OpenAI judge's name, as the operator maps it
    assert spec.num_generations == 2 * GROUP  # compute_multiplier: the group, times the prompts of a step
    assert spec.global_batch_size == spec.per_device_train_batch_size == 3 * 2 * GROUP
    assert spec.learning_rate == RL_LEARNING_RATE and (spec.max_steps, spec.save_steps) == (4, 1)
    assert spec.max_completion_length == REASONING_TOKENS["low"]
    assert spec.eval is not None and (spec.eval.limit, spec.eval.max_new_tokens) == (5, REASONING_TOKENS["low"])
    assert mapping == {
        "n_epochs": 1,
        "batch_size": 3,
        "learning_rate_multiplier": 1.0,
        "compute_multiplier": 2,
        "eval_interval": 1,
        "eval_samples": 5,
        "reasoning_effort": "low",
    }


def test_a_hyperparameter_the_spec_refuses_is_a_422_naming_the_field_it_became() -> None:
    hyperparameters = {"batch_size": 4096, "compute_multiplier": 16}  # each in OpenAI's bounds; their product is not
    body = JobCreateParams.model_validate(
        {
            "model": "org/m",
            "training_file": TRAINING,
            "method": {"type": "reinforcement", "reinforcement": {"grader": JUDGE, "hyperparameters": hyperparameters}},
        }
    )
    with pytest.raises(Problem) as e:
        to_spec(body, 10, aliases=ALIASES)
    detail = "Input should be less than or equal to 65536"
    assert (e.value.status, e.value.title) == (422, "Invalid request")
    assert e.value.detail == f"/per_device_train_batch_size: {detail}"
    assert e.value.errors == [{"pointer": "/per_device_train_batch_size", "detail": detail}]
