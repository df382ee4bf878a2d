"""Reward-model training jobs (`kind: reward_model`): outcome and process (Math-Shepherd) RMs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mathrl.errors import FieldError
from mathrl.modelref import ModelRef
from mathrl.specs.base import MAX_SEED, GenerationBackend, JobBase
from mathrl.specs.inputs import DEFAULT_MAX_NEW_TOKENS, DatasetRef, Sampling
from mathrl.specs.lora import LoRA


class RewardModelSpec(JobBase):
    """Reward-model training: sample, label automatically (Math-Shepherd), train."""

    kind: Literal["reward_model"] = Field("reward_model", description="Reward-model training.")
    model: ModelRef = Field(..., description="Base model the RM is trained from.")
    policy: ModelRef | None = Field(None, description="Model that samples solutions; defaults to 'model'.")
    type: Literal["outcome", "process"] = Field("outcome", description="Outcome (ORM) or process (PRM) labels.")
    dataset: DatasetRef = Field(..., description="Questions with gold answers; the policy's solutions are graded.")
    samples_per_question: int = Field(8, ge=2, le=1024, description="Solutions sampled per question.")
    completions_per_step: int = Field(4, ge=1, le=256, description="Process RM: rollouts from each step prefix.")
    learning_rate: float = Field(2e-5, gt=0, le=1.0, description="Peak learning rate.")
    num_train_epochs: float = Field(1.0, gt=0, le=100, description="Passes over the labelled data.")
    per_device_train_batch_size: int = Field(8, ge=1, le=65536, description="Rows per device per step.")
    max_length: int = Field(1024, ge=16, le=131072, description="Prompt + solution tokens; longer rows are cut.")
    heldout_fraction: float = Field(0.1, gt=0, lt=1, description="Questions kept for pairwise and best-of-N accuracy.")
    sampling: Sampling = Field(
        default_factory=lambda: Sampling(temperature=0.7, n=8, max_new_tokens=512),
        description="How the policy samples solutions (temperature, length).",
    )
    backend: GenerationBackend = Field(
        "hf",
        description="Backend that samples the policy's solutions (and the process RM's step rollouts): "
        "'hf' (transformers) or 'vllm' (vLLM's offline engine; needs a worker with vLLM).",
    )
    lora: LoRA | None = Field(None, description="Train LoRA adapters through peft.")
    seed: int = Field(42, ge=0, le=MAX_SEED, description="Seed of the split, sampling and training (0 to 2**32 - 1).")

    @model_validator(mode="after")
    def _process_needs_steps(self) -> RewardModelSpec:
        default = type(self).model_fields["completions_per_step"].default
        if self.type == "outcome" and self.completions_per_step != default:
            raise FieldError(
                "completions_per_step", "completions_per_step is for type='process': remove it or set type='process'"
            )
        if self.sampling.max_new_tokens is None:
            self.sampling.max_new_tokens = DEFAULT_MAX_NEW_TOKENS
        return self
