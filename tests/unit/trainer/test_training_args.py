"""The TrainingArguments every training job shares (trainer/training_args.py), as each trainer's
config gets them: GRPO (TRL's GRPOConfig, and AsyncGRPOConfig for the async trainer), SFT
(SFTConfig), the outcome RM (RewardConfig) and the process RM (transformers' TrainingArguments);
and what each adds of its own. No model, no GPU: the configs are built for the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kinds import resolve_config
from mathrl.specs import parse_spec
from mathrl.specs.resolved import ResolvedGRPO, ResolvedRewardModel, ResolvedSFT
from trainer.training_args import training_args

pytestmark = pytest.mark.quick

DATASET = {"name": "math-train"}


def assert_shared(
    args: Any,
    output_dir: Path,
    *,
    seed: int,
    learning_rate: float,
    per_device_train_batch_size: int,
    logging_steps: int,
    save_steps: int | None,
    gradient_checkpointing: bool,
) -> None:
    """The shared block as a config holds it, on the CPU (fp32)."""
    assert args.output_dir == str(output_dir)
    assert args.seed == seed
    assert args.learning_rate == learning_rate
    assert args.per_device_train_batch_size == per_device_train_batch_size
    assert args.logging_steps == logging_steps
    assert args.save_strategy == ("no" if save_steps is None else "steps")
    if save_steps is not None:
        assert args.save_steps == save_steps
    assert args.gradient_checkpointing is gradient_checkpointing
    assert args.report_to == []
    assert args.use_cpu is True
    assert args.bf16 is False and args.fp16 is False
    assert args.disable_tqdm is True
    assert args.dataloader_num_workers == 0


def test_the_shared_block_picks_bf16_on_gpus_and_leaves_unset_knobs_to_the_config(tmp_path: Path) -> None:
    common: dict[str, Any] = dict(seed=1, learning_rate=1e-5, per_device_train_batch_size=2, logging_steps=1)
    gpu = training_args(tmp_path, use_cpu=False, save_steps=10, gradient_checkpointing=False, **common)
    assert gpu["use_cpu"] is False and gpu["bf16"] is True
    assert gpu["save_strategy"] == "steps" and gpu["save_steps"] == 10
    assert gpu["gradient_checkpointing"] is False
    cpu = training_args(tmp_path, use_cpu=True, save_steps=None, **common)
    assert cpu["use_cpu"] is True and cpu["bf16"] is False
    # no checkpoints; gradient checkpointing: the config class's own default
    assert cpu["save_strategy"] == "no" and "save_steps" not in cpu
    assert "gradient_checkpointing" not in cpu


@pytest.mark.parametrize("algorithm", ["sync", "async"])
def test_grpo_configs_get_the_shared_block_from_spec_and_resolved_config(tmp_path: Path, algorithm: str) -> None:
    spec = parse_spec(
        {
            "kind": "grpo",
            "model": "/models/m",
            "dataset": DATASET,
            "seed": 7,
            "logging_steps": 3,
            "save_steps": 11,
            "max_steps": 40,
            "learning_rate": 3e-6,
            "warmup_ratio": 0.1,
            "gradient_checkpointing": False,
        }
    )
    config = resolve_config(spec).of(ResolvedGRPO)
    if algorithm == "sync":
        from trainer.grpo_config import grpo_args

        args = grpo_args(config, tmp_path, use_cpu=True)
        assert args.use_vllm is False
    else:
        from trainer.async_grpo import async_args

        args = async_args(config, tmp_path, True, "http://127.0.0.1:8000")
        assert args.dtype == "float32" and args.vllm_server_base_url == "http://127.0.0.1:8000"
    assert_shared(
        args,
        tmp_path,
        seed=7,
        learning_rate=3e-6,
        per_device_train_batch_size=config.per_device_train_batch_size,
        logging_steps=3,
        save_steps=11,
        gradient_checkpointing=False,
    )
    assert args.max_steps == 40 and args.warmup_steps == 4
    assert args.num_generations == config.num_generations
    assert args.gradient_accumulation_steps == config.gradient_accumulation_steps


def test_sft_config_gets_the_shared_block_and_its_own(tmp_path: Path) -> None:
    from trainer.sft import sft_args

    spec = parse_spec(
        {
            "kind": "sft",
            "model": "/models/m",
            "dataset": DATASET,
            "seed": 5,
            "learning_rate": 4e-5,
            "per_device_train_batch_size": 3,
            "logging_steps": 2,
            "save_steps": 9,
            "max_steps": 30,
            "warmup_ratio": 0.2,
            "max_length": 256,
            "gradient_checkpointing": False,
        }
    )
    config = resolve_config(spec).of(ResolvedSFT)
    args = sft_args(config, tmp_path, use_cpu=True)
    assert_shared(
        args,
        tmp_path,
        seed=5,
        learning_rate=4e-5,
        per_device_train_batch_size=3,
        logging_steps=2,
        save_steps=9,
        gradient_checkpointing=False,
    )
    assert args.max_steps == 30 and args.warmup_steps == 6 and args.max_length == 256
    assert args.gradient_accumulation_steps == spec.gradient_accumulation_steps
    assert args.completion_only_loss is True and args.max_grad_norm == 1.0


def test_reward_model_configs_get_the_shared_block_and_their_own(tmp_path: Path) -> None:
    from trainer.reward_model import outcome_args, process_args

    fields = {"model": "/models/m", "dataset": DATASET, "seed": 3, "learning_rate": 1e-4}
    fields |= {"per_device_train_batch_size": 4, "num_train_epochs": 2.5, "max_length": 300}
    outcome = parse_spec({"kind": "reward_model", **fields})
    process = parse_spec({"kind": "reward_model", "type": "process", **fields})
    shared: dict[str, Any] = dict(seed=3, learning_rate=1e-4, per_device_train_batch_size=4)
    shared |= dict(logging_steps=5, save_steps=None)  # no checkpoints: the job saves the model itself
    rm = outcome_args(outcome, tmp_path, use_cpu=True)
    assert_shared(rm, tmp_path, gradient_checkpointing=True, **shared)  # RewardConfig's default
    assert rm.num_train_epochs == 2.5 and rm.max_length == 300
    prm = process_args(process, tmp_path, use_cpu=True)
    assert_shared(prm, tmp_path, gradient_checkpointing=False, **shared)  # TrainingArguments' default
    assert prm.num_train_epochs == 2.5 and prm.remove_unused_columns is False


def test_a_reward_models_gradient_checkpointing_is_the_specs_or_its_trainers_default(tmp_path: Path) -> None:
    """Unset, each RM trains with its trainer class's default, and the resolved config records which; set, the
    spec's choice reaches both trainers (off: 0.78x the outcome RM's step time on the demo's model here)."""
    from trainer.reward_model import outcome_args, process_args

    fields = {"model": "/models/m", "dataset": DATASET}
    for kind, build, default in (("outcome", outcome_args, True), ("process", process_args, False)):
        for choice, used in ((None, default), (True, True), (False, False)):
            spec = parse_spec({"kind": "reward_model", "type": kind, "gradient_checkpointing": choice, **fields})
            assert build(spec, tmp_path, use_cpu=True).gradient_checkpointing is used, (kind, choice)
            assert resolve_config(spec).of(ResolvedRewardModel).gradient_checkpointing is used, (kind, choice)
