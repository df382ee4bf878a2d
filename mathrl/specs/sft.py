"""Supervised fine-tuning jobs (`kind: sft`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mathrl.modelref import ModelRef
from mathrl.specs.base import MAX_SEED, GradientCheckpointing, JobBase
from mathrl.specs.grpo import HeldoutEvalField
from mathrl.specs.inputs import DatasetRef
from mathrl.specs.lora import LoRA
from mathrl.specs.tools import Tools


class SFTSpec(JobBase):
    """Supervised fine-tuning on worked solutions (prompt -> completion), the usual start for RL."""

    kind: Literal["sft"] = Field("sft", description="Supervised fine-tuning.")
    model: ModelRef = Field(..., description="Model to fine-tune; 'tiny:<layers>x<width>' builds a fresh tiny one.")
    dataset: DatasetRef = Field(..., description="Questions with worked solutions (or gold answers) to imitate.")
    max_steps: int = Field(200, ge=1, le=10_000_000, description="Optimizer steps.")
    learning_rate: float = Field(2e-5, gt=0, le=1.0, description="Peak learning rate.")
    per_device_train_batch_size: int = Field(8, ge=1, le=65536, description="Rows per device per micro-step.")
    gradient_accumulation_steps: int = Field(1, ge=1, le=4096, description="Micro-steps per optimizer step.")
    max_length: int = Field(1024, ge=8, le=131072, description="Prompt + completion tokens; longer rows are cut.")
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="Fraction of steps with a linear LR warm-up.")
    lora: LoRA | None = Field(None, description="Train LoRA adapters through peft.")
    gradient_checkpointing: GradientCheckpointing = None
    logging_steps: int = Field(10, ge=1, le=10_000_000, description="Store metrics every N steps.")
    save_steps: int = Field(100, ge=1, le=10_000_000, description="Checkpoint every N steps.")
    seed: int = Field(42, ge=0, le=MAX_SEED, description="Seed of the data order and initialisation (0 to 2**32 - 1).")
    # a benchmark: accuracy every N steps; a file (OpenAI's validation file): the loss and token accuracy on its
    # chats every N steps, the series eval_loss and eval_mean_token_accuracy (trainer/sft.py)
    eval: HeldoutEvalField = None
    tools: Tools | None = Field(
        None,
        description="The tool the solutions call (e.g. 'twostep-words-tool-traces'): the prompts carry its format's "
        "instruction, as a GRPO or eval job's with the same `tools` do, so the model learns the format it is then run "
        "with. Only `format` is read here.",
    )
