"""Reward-model training jobs (`kind: reward_model`): outcome and process (Math-Shepherd) RMs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from mathrl.errors import FieldError
from mathrl.modelref import ModelRef
from mathrl.specs.base import MAX_SEED, GenerationBackend, JobBase, StrictModel
from mathrl.specs.inputs import DEFAULT_MAX_NEW_TOKENS, DatasetRef
from mathrl.specs.lora import LoRA

RM_MIN_TEMPERATURE = 0.3  # below it a question's solutions repeat: too few wrong ones to learn from
OLD_SAMPLING_N = 8  # what stored specs carry as sampling.n from before it was folded into samples_per_question


class RMSampling(StrictModel):
    """How the policy samples a reward-model job's solutions. How many per question is the job's
    `samples_per_question`, and their seed its `seed`."""

    temperature: float = Field(
        0.7,
        ge=RM_MIN_TEMPERATURE,
        le=5.0,
        description=f"At least {RM_MIN_TEMPERATURE}: the RM learns from a question's right and wrong solutions, "
        "which greedy decoding would not give.",
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(DEFAULT_MAX_NEW_TOKENS, ge=1, le=32768, description="Solution length in tokens.")


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
    sampling: RMSampling = Field(
        default_factory=RMSampling, description="How the policy samples solutions (temperature, length)."
    )
    backend: GenerationBackend = Field(
        "hf",
        description="Backend that samples the policy's solutions (and the process RM's step rollouts): "
        "'hf' (transformers) or 'vllm' (vLLM's offline engine; needs a worker with vLLM).",
    )
    lora: LoRA | None = Field(None, description="Train LoRA adapters through peft.")
    gradient_checkpointing: bool | None = Field(
        None,
        description="Recompute each layer's activations in the backward pass instead of keeping them: far less "
        "memory for activations, about a third more compute per step. Unset: on for the outcome RM (TRL's "
        "RewardTrainer default), off for the process RM (transformers' Trainer default).",
    )
    seed: int = Field(42, ge=0, le=MAX_SEED, description="Seed of the split, sampling and training (0 to 2**32 - 1).")

    @model_validator(mode="before")
    @classmethod
    def _one_count(cls, data: Any) -> Any:
        """`sampling.n` and `sampling.seed` were declared beside samples_per_question and seed, and not read:
        `n` 16 still sampled 8. The count is samples_per_question (an `n` equal to it is taken), the seed the
        job's; stored specs carry n 8 and seed 0 from the old default, which are dropped."""
        if not isinstance(data, dict) or not isinstance(data.get("sampling"), dict):
            return data
        sampling = dict(data["sampling"])
        n, seed = sampling.pop("n", None), sampling.pop("seed", None)
        count = data.get("samples_per_question")
        if n is not None and n != OLD_SAMPLING_N and count is not None and n != count:
            detail = f"sampling.n={n} and samples_per_question={count}: give the count once, as samples_per_question"
            raise FieldError("sampling/n", detail)
        if n is not None and count is None:
            data = {**data, "samples_per_question": n}
        if seed not in (None, 0, data.get("seed")):
            raise FieldError("sampling/seed", "a reward_model job samples with its own `seed`: set it, not this")
        return {**data, "sampling": sampling}

    @model_validator(mode="after")
    def _process_needs_steps(self) -> RewardModelSpec:
        default = type(self).model_fields["completions_per_step"].default
        if self.type == "outcome" and self.completions_per_step != default:
            raise FieldError(
                "completions_per_step", "completions_per_step is for type='process': remove it or set type='process'"
            )
        return self
