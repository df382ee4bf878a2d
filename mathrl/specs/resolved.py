"""A job's resolved configuration: its spec's fields with every value the run reads filled in
(its kind's home, kinds/<kind>.py: `resolve` at submit, then `admit`), typed. The store keeps it as JSON
(jobs.resolved_config, `record()`); the API, the worker and the trainers read it through these
models (`resolved(config)`), not by string key. Fields a kind does not type (the rest of its
spec) ride along as extras, so the stored record keeps every one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from mathrl.backends import GenerationBackend
from mathrl.specs.base import knob_help
from mathrl.specs.grpo import Generation, GRPOSpec, LossType
from mathrl.specs.inputs import Sampling
from mathrl.specs.loop import Curriculum, DynamicSampling
from mathrl.specs.lora import LoRA
from mathrl.specs.reward_model import RewardModelSpec, RMSampling
from mathrl.specs.sft import SFTSpec

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


def _knob(name: str, default: Any = ..., async_none: bool = False) -> Any:
    """A GRPO knob's field in the resolved config, with the help of its one declaration (GRPOSpec)."""
    note = " None: async GRPO, which has no such setting." if async_none else ""
    return Field(default, description=knob_help(GRPOSpec, name) + note)


def _from(spec: type[BaseModel], name: str) -> Any:
    """A spec field the trainer reads, typed in the resolved config with the spec's own default
    and help (declared once, on the spec)."""
    declared = spec.model_fields[name]
    if declared.default_factory is not None:
        return Field(default_factory=declared.default_factory, description=declared.description)
    return Field(declared.default, description=declared.description)


def _field(name: str) -> Any:
    """A field of GRPOSpec the GRPO trainer reads."""
    return _from(GRPOSpec, name)


class ResolvedGRPO(ResolvedConfig):
    """A GRPO job's knobs as the run uses them: TRL's defaults, then the preset, then the spec."""

    kind: Literal["grpo"] = "grpo"
    # the knobs: types as the run uses them; help, bounds and TRL's default declared once, on GRPOSpec
    learning_rate: float = _knob("learning_rate")
    beta: float | None = _knob("beta", async_none=True)
    num_generations: int = _knob("num_generations")
    max_prompt_length: int = _knob("max_prompt_length")
    max_completion_length: int = _knob("max_completion_length")
    per_device_train_batch_size: int = _knob("per_device_train_batch_size")
    global_batch_size: int = _knob("global_batch_size")
    gradient_accumulation_steps: int = Field(description="Micro-batches per optimizer step.")
    questions_per_step: int = Field(description="global_batch_size / num_generations.")
    world_size: int = Field(description="Training processes: processes per node x nodes, less the vLLM server's.")
    num_iterations: int | None = _knob("num_iterations", async_none=True)
    loss_type: LossType | None = _knob("loss_type", async_none=True)
    epsilon: float = _knob("epsilon")
    epsilon_high: float | None = _knob("epsilon_high")
    delta: float | None = _knob("delta")
    importance_sampling_level: Literal["token", "sequence"] | None = _knob("importance_sampling_level", async_none=True)
    scale_rewards: Literal["group", "batch", "none"] | None = _knob("scale_rewards", async_none=True)
    mask_truncated_completions: bool | None = _knob("mask_truncated_completions", async_none=True)
    temperature: float = _knob("temperature")
    top_p: float = _knob("top_p")
    warmup_ratio: float = _knob("warmup_ratio")
    gradient_checkpointing: bool = _knob("gradient_checkpointing", default=True)
    generation_backend: GenerationBackend = Field("hf", description="What generates the rollouts.")
    generation_mode: Literal["colocate", "server"] | None = Field(
        None, description="vLLM in the training process, or a server beside it (None: not vLLM)."
    )
    vllm_server_gpus: int = Field(0, description="GPUs of the job's vLLM server (server mode).")
    preset: str = Field("trl-default", description="The preset the unset knobs came from.")
    algorithm: str = Field("sync", description="'sync' (GRPOTrainer) or 'async' (AsyncGRPOTrainer).")
    dynamic_sampling: DynamicSampling | None = Field(None, description="Its settings, or None: off.")
    curriculum: Curriculum | None = Field(None, description="Its settings, or None: off.")
    skip_zero_advantage: bool | None = Field(
        None,
        description="Whether the run skips completions with zero advantage: only where the update stays exact "
        "(beta 0); None: async.",
    )
    # the spec's fields the memory plan and the trainers read (declared on GRPOSpec: its help here too)
    max_steps: int = _field("max_steps")
    seed: int = _field("seed")
    logging_steps: int = _field("logging_steps")
    save_steps: int = _field("save_steps")
    sample_every: int = _field("sample_every")
    max_staleness: int | None = _field("max_staleness")
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
    """An SFT job's settings as its trainer reads them: the spec's, with its knobs left unset filled
    (gradient_checkpointing: TRL's default)."""

    kind: Literal["sft"] = "sft"
    max_steps: int = _from(SFTSpec, "max_steps")
    learning_rate: float = _from(SFTSpec, "learning_rate")
    per_device_train_batch_size: int = _from(SFTSpec, "per_device_train_batch_size")
    gradient_accumulation_steps: int = _from(SFTSpec, "gradient_accumulation_steps")
    max_length: int = _from(SFTSpec, "max_length")
    warmup_ratio: float = _from(SFTSpec, "warmup_ratio")
    logging_steps: int = _from(SFTSpec, "logging_steps")
    save_steps: int = _from(SFTSpec, "save_steps")
    seed: int = _from(SFTSpec, "seed")
    gradient_checkpointing: bool = Field(True, description=knob_help(SFTSpec, "gradient_checkpointing"))
    lora: LoRA | None = _from(SFTSpec, "lora")


class ResolvedRewardModel(ResolvedConfig):
    kind: Literal["reward_model"] = "reward_model"
    samples_per_question: int = _from(RewardModelSpec, "samples_per_question")
    max_length: int = _from(RewardModelSpec, "max_length")
    sampling: RMSampling = _from(RewardModelSpec, "sampling")
    gradient_checkpointing: bool | None = Field(
        None, description="Whether the RM trains with gradient checkpointing (None: a job from before it was kept)."
    )


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
