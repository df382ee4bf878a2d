"""The part of Hugging Face's TrainingArguments every training job shares: the sync and async
GRPO trainers (trainer/grpo_config.py, trainer/async_grpo.py), SFT (trainer/sft.py) and the
outcome and process reward models (trainer/reward_model.py). Built here once; each config adds
what is its own (its schedule, loss, sequence length, generation settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, NotRequired, TypedDict


class TrainingArgs(TypedDict):
    """Keyword arguments of transformers' TrainingArguments, and so of TRL's configs built on it
    (GRPOConfig, AsyncGRPOConfig, SFTConfig, RewardConfig)."""

    output_dir: str
    seed: int
    learning_rate: float
    per_device_train_batch_size: int
    logging_steps: int
    save_strategy: Literal["steps", "no"]
    save_steps: NotRequired[int]
    report_to: list[str]
    use_cpu: bool
    bf16: bool
    disable_tqdm: bool
    dataloader_num_workers: int
    gradient_checkpointing: NotRequired[bool]


def training_args(
    output_dir: Path,
    *,
    use_cpu: bool,
    seed: int,
    learning_rate: float,
    per_device_train_batch_size: int,
    logging_steps: int,
    save_steps: int | None,
    gradient_checkpointing: bool | None = None,
) -> TrainingArgs:
    """The shared arguments of a job that trains on the CPU (`use_cpu`: fp32) or on GPUs (bf16).
    `save_steps` None: no checkpoints (save_strategy "no"; the job saves its model itself).
    `gradient_checkpointing` None: the config class's own default (on in TRL's configs, off in
    transformers' TrainingArguments). Metrics go to the job's sink (trainer/callbacks.py), not to
    a reporting integration or a progress bar; data loads in the training process (no dataloader
    worker processes)."""
    args: TrainingArgs = {
        "output_dir": str(output_dir),
        "seed": seed,
        "learning_rate": learning_rate,
        "per_device_train_batch_size": per_device_train_batch_size,
        "logging_steps": logging_steps,
        "save_strategy": "no" if save_steps is None else "steps",
        "report_to": [],
        "use_cpu": use_cpu,
        "bf16": not use_cpu,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    if save_steps is not None:
        args["save_steps"] = save_steps
    if gradient_checkpointing is not None:
        args["gradient_checkpointing"] = gradient_checkpointing
    return args
