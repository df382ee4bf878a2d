"""The arguments of a GRPO run: TRL's config (sync GRPOConfig; the async trainer's shares
`common_args`) built from a job's resolved config alone (mathrl/specs/presets.py resolves the loss
and sampling settings: beta, epsilon, loss_type, ...; the spec's other fields it reads are typed
there too), and peft's LoRA config. Kept apart from trainer/grpo.py (the run) so that the sync and
async trainers both build on it. What every training job shares (output, seed, logging, saving,
bf16 or fp32) comes from trainer/training_args.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mathrl.backends import trl_uses_vllm
from mathrl.specs import LoRA
from mathrl.specs.resolved import ResolvedGRPO
from trainer.training_args import training_args


def common_args(config: ResolvedGRPO, output_dir: Path, use_cpu: bool, server_url: str | None) -> dict[str, Any]:
    """The arguments TRL's sync (GRPOConfig) and async (AsyncGRPOConfig) trainers share."""
    return dict(
        **training_args(
            output_dir,
            use_cpu=use_cpu,
            seed=config.seed,
            learning_rate=config.learning_rate,
            per_device_train_batch_size=config.per_device_train_batch_size,
            logging_steps=config.logging_steps,
            save_steps=config.save_steps,
            # resolved by mathrl.specs.presets (TRL's default, on, when the spec leaves it unset; a
            # config stored before the field existed ran with that default too)
            gradient_checkpointing=config.gradient_checkpointing,
        ),
        num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        epsilon=config.epsilon,
        epsilon_high=config.epsilon_high,
        temperature=config.temperature,
        top_p=config.top_p,
        vllm_server_base_url=server_url,
        vllm_server_timeout=900.0,  # a CPU server compiles for minutes before it answers /health
        max_steps=config.max_steps,
        warmup_steps=int(config.warmup_ratio * config.max_steps),
    )


def grpo_args(
    config: ResolvedGRPO,
    output_dir: Path,
    use_cpu: bool,
    backend: str = "hf",
    server_url: str | None = None,
    hf_mode: str = "dynamic",
) -> Any:
    """TRL's GRPOConfig for a sync job; `hf_mode`, how the hf backend decodes (trainer/hf_generation.py)."""
    from trl import GRPOConfig

    from trainer.hf_generation import trl_args

    return GRPOConfig(
        **common_args(config, output_dir, use_cpu, server_url),
        **config.sync_loss().model_dump(),
        use_vllm=trl_uses_vllm(backend),
        vllm_mode=config.generation.mode,
        vllm_tensor_parallel_size=config.generation.tensor_parallel_size,
        # prompt + completion: the engine's KV cache is sized for this, not the model's 8k context
        vllm_max_model_length=config.max_prompt_length + config.max_completion_length,
        **({} if trl_uses_vllm(backend) else trl_args(hf_mode)),
    )


def lora_config(lora: LoRA | None) -> Any:
    """peft's LoraConfig for a spec's `lora` block (None: train every weight)."""
    if lora is None or not lora.enabled:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
