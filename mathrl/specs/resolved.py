"""A job's resolved configuration: its spec's fields with every value the run reads filled in
(its kind's home, kinds/<kind>.py: `resolve` at submit, then `admit`), typed. The store keeps it as JSON
(jobs.resolved_config, `record()`); the API, the worker and the trainers read it through these
models (`resolved(config)`), not by string key. Fields a kind does not type (the rest of its
spec) ride along as extras, so the stored record keeps every one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from mathrl.specs.grpo import Generation
from mathrl.specs.inputs import Sampling
from mathrl.specs.lora import LoRA

R = TypeVar("R", bound="ResolvedConfig")


class ResolvedConfig(BaseModel):
    """What every kind's resolved config holds besides its spec's fields."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    kind: str
    memory_plan: dict[str, Any] | None = Field(
        None, description="GPU memory planned at submit (trainer/memory_plan.py: estimate, terms, notes)."
    )
    openai: dict[str, Any] | None = Field(
        None, description="The OpenAI fine-tuning request this job was made from, and how it was mapped."
    )

    def of(self, kind: type[R]) -> R:
        """This config as `kind`'s model (a runner's own kind); TypeError for another kind's."""
        if not isinstance(self, kind):
            raise TypeError(f"a {self.kind!r} job's config is not a {kind.__name__}")
        return self

    def record(self) -> dict[str, Any]:
        """The JSON the job row stores: the values that were given or set, no unset defaults."""
        return self.model_dump(mode="json", exclude_unset=True)


class ResolvedGRPO(ResolvedConfig):
    """A GRPO job's knobs as the run uses them: TRL's defaults, then the preset, then the spec."""

    kind: Literal["grpo"] = "grpo"
    learning_rate: float = Field(description="Peak learning rate.")
    beta: float | None = Field(description="KL coefficient to the reference policy (None: async, no KL term).")
    num_generations: int = Field(description="Completions per question (the group size G).")
    max_prompt_length: int = Field(description="Prompt tokens kept; longer prompts are dropped.")
    max_completion_length: int = Field(description="Completion tokens generated at most.")
    per_device_train_batch_size: int = Field(description="Completions per process per micro-batch.")
    global_batch_size: int = Field(description="Completions per optimizer step, over every process.")
    gradient_accumulation_steps: int = Field(description="Micro-batches per optimizer step.")
    questions_per_step: int = Field(description="global_batch_size / num_generations.")
    world_size: int = Field(description="Training processes: processes per node x nodes, less the vLLM server's.")
    num_iterations: int | None = Field(description="Policy updates per generation round (None: async).")
    loss_type: str | None = Field(description="TRL's loss_type: how token losses are averaged (None: async).")
    epsilon: float = Field(description="Lower clip range.")
    epsilon_high: float | None = Field(description="Upper clip range (None: epsilon).")
    delta: float | None = Field(description="Two-sided clipping bound (None: off).")
    importance_sampling_level: str | None = Field(description="'token' or 'sequence' (None: async).")
    scale_rewards: str | None = Field(description="'group', 'batch' or 'none' (None: async).")
    mask_truncated_completions: bool | None = Field(description="Truncated completions out of the loss.")
    temperature: float = Field(description="Sampling temperature of the rollouts.")
    top_p: float = Field(description="Nucleus sampling of the rollouts.")
    warmup_ratio: float = Field(description="Fraction of steps with a linear learning-rate warm-up.")
    gradient_checkpointing: bool = Field(True, description="Recompute activations in the backward pass.")
    generation_backend: Literal["hf", "vllm"] = Field("hf", description="What generates the rollouts.")
    generation_mode: Literal["colocate", "server"] | None = Field(
        None, description="vLLM in the training process, or a server beside it (None: not vLLM)."
    )
    vllm_server_gpus: int = Field(0, description="GPUs of the job's vLLM server (server mode).")
    preset: str = Field("trl-default", description="The preset the unset knobs came from.")
    algorithm: str = Field("sync", description="'sync' (GRPOTrainer) or 'async' (AsyncGRPOTrainer).")
    dynamic_sampling: dict[str, Any] | None = Field(None, description="Its settings, or None: off.")
    curriculum: dict[str, Any] | None = Field(None, description="Its settings, or None: off.")
    skip_zero_advantage: bool | None = Field(None, description="Skip groups with no signal (None: async).")
    # the spec's fields the memory plan and the trainers read
    generation: Generation = Field(default_factory=Generation, description="The spec's generation settings.")
    lora: LoRA | None = Field(None, description="The spec's LoRA settings (None: every weight trains).")
    deepspeed_zero3: bool = Field(False, description="The spec's ZeRO-3 sharding.")

    def sync_loss(self) -> SyncLoss:
        """The loss settings of a sync job (TRL's GRPOTrainer); an async job has none (ValidationError)."""
        return SyncLoss.model_validate(self.model_dump(include=set(SyncLoss.model_fields)))


class SyncLoss(BaseModel):
    """The knobs only the sync trainer has (async stores them as None)."""

    beta: float
    num_iterations: int
    loss_type: str
    delta: float | None
    importance_sampling_level: str
    scale_rewards: str
    mask_truncated_completions: bool


class ResolvedSFT(ResolvedConfig):
    kind: Literal["sft"] = "sft"
    max_length: int = Field(description="Tokens per training sequence.")
    per_device_train_batch_size: int = Field(description="Sequences per process per micro-batch.")
    gradient_checkpointing: bool = Field(True, description="Recompute activations in the backward pass.")
    lora: LoRA | None = Field(None, description="The spec's LoRA settings (None: every weight trains).")


class ResolvedRewardModel(ResolvedConfig):
    kind: Literal["reward_model"] = "reward_model"
    samples_per_question: int = Field(description="Solutions sampled from the policy per question.")
    max_length: int = Field(description="Tokens per scored sequence.")
    sampling: Sampling = Field(description="How the policy's solutions are sampled.")


class ResolvedEval(ResolvedConfig):
    kind: Literal["eval"] = "eval"
    sampling: Sampling = Field(description="Decoding, with max_new_tokens from the recipe when the spec left it unset.")
    recipe: dict[str, Any] | str | None = Field(
        None,
        description="The prompt recipe resolved at submit (evaluator.recipes.ResolvedRecipe.record); before "
        "admission, the spec's own (a name or an inline recipe).",
    )


# each kind's model, read off the classes above (a kind whose runner reads no typed config has none)
RESOLVED: dict[str, type[ResolvedConfig]] = {
    str(cls.model_fields["kind"].default): cls for cls in ResolvedConfig.__subclasses__()
}


def resolved(config: Mapping[str, Any] | ResolvedConfig) -> ResolvedConfig:
    """A stored resolved config as its kind's model (kinds without one: the base model)."""
    if isinstance(config, ResolvedConfig):
        return config
    return RESOLVED.get(str(config.get("kind")), ResolvedConfig).model_validate(dict(config))
