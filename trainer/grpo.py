"""GRPO jobs on TRL's GRPOTrainer. `run_grpo(spec, config, sink, ...)` takes the resolved
config (mathrl.presets.resolve_grpo) and nothing of the database."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from evaluator.models import load_tokenizer
from mathrl.sink import Sink
from mathrl.specs import GRPOSpec, LoRA
from trainer.callbacks import SinkCallback
from trainer.checkpoints import latest_checkpoint, save_checkpoints_atomically, save_final
from trainer.data import load_problems, prompt_dataset
from trainer.rewards import Reward, get_reward


def build_rewards(spec: GRPOSpec, config: dict[str, Any], resolve_model: Any = None) -> tuple[list[Reward], list[float]]:
    rewards, weights = [], []
    for ref in spec.rewards:
        kwargs: dict[str, Any] = {}
        if ref.name == "reward_model":
            assert ref.model is not None
            kwargs["model"] = resolve_model(ref.model) if resolve_model else ref.model
        if ref.name == "overlong":
            kwargs["max_length"] = config["max_completion_length"]
            kwargs["buffer"] = ref.buffer or max(1, config["max_completion_length"] // 4)
        rewards.append(get_reward(ref.name, **kwargs))
        weights.append(ref.weight)
    return rewards, weights


def grpo_args(spec: GRPOSpec, config: dict[str, Any], output_dir: Path, use_cpu: bool) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(output_dir),
        learning_rate=config["learning_rate"],
        beta=config["beta"],
        num_generations=config["num_generations"],
        max_completion_length=config["max_completion_length"],
        per_device_train_batch_size=config["per_device_train_batch_size"],
        gradient_accumulation_steps=config["gradient_accumulation_steps"],
        num_iterations=config["num_iterations"],
        loss_type=config["loss_type"],
        epsilon=config["epsilon"],
        epsilon_high=config["epsilon_high"],
        delta=config["delta"],
        importance_sampling_level=config["importance_sampling_level"],
        scale_rewards=config["scale_rewards"],
        mask_truncated_completions=config["mask_truncated_completions"],
        temperature=config["temperature"],
        top_p=config["top_p"],
        use_vllm=spec.use_vllm,
        vllm_mode=config["vllm_mode"],
        max_steps=spec.max_steps,
        warmup_steps=int(config["warmup_ratio"] * spec.max_steps),
        logging_steps=spec.logging_steps,
        save_strategy="steps",
        save_steps=spec.save_steps,
        seed=spec.seed,
        report_to=[],
        use_cpu=use_cpu,
        bf16=not use_cpu,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def lora_config(lora: LoRA | None) -> Any:
    """peft's LoraConfig for a spec's `lora` block (None: train every weight)."""
    if lora is None or not lora.enabled:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )


def run_grpo(
    spec: GRPOSpec,
    config: dict[str, Any],
    sink: Sink,
    *,
    model_path: str,
    data_dir: str | None,
    out_dir: Path,
    resolve_model: Any = None,
) -> dict[str, Any]:
    """Train; checkpoints go to out_dir/checkpoint-N, the final model to out_dir/final.
    A run that finds a checkpoint in out_dir resumes from it."""
    import torch
    from trl import GRPOTrainer

    t0 = time.monotonic()
    tokenizer = load_tokenizer(model_path)
    problems, template = load_problems(spec.dataset, data_dir)
    dataset, dropped = prompt_dataset(problems, template, tokenizer, config.get("max_prompt_length"))
    if dropped:
        sink.event("data", f"dropped {dropped} prompts longer than {config['max_prompt_length']} tokens", "warning")
    rewards, weights = build_rewards(spec, config, resolve_model)
    use_cpu = not torch.cuda.is_available()
    args = grpo_args(spec, config, out_dir, use_cpu)
    args.reward_weights = weights
    callback = SinkCallback(sink, sample_every=spec.sample_every, total_steps=spec.max_steps)
    trainer = GRPOTrainer(
        model=model_path, reward_funcs=rewards, args=args, train_dataset=dataset, processing_class=tokenizer,
        peft_config=lora_config(spec.lora), callbacks=[callback],
    )
    callback.trainer = trainer
    save_checkpoints_atomically(trainer)
    resume = latest_checkpoint(out_dir)
    sink.event(
        "training",
        f"GRPO on {len(dataset)} questions, {spec.max_steps} steps, G={config['num_generations']}, "
        f"batch {config['global_batch_size']} completions, rewards {[r.name for r in rewards]}"
        + (f"; resuming from {resume.name}" if resume else ""),
        data={"setup_seconds": time.monotonic() - t0},
    )
    t1 = time.monotonic()
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    train_seconds = time.monotonic() - t1
    if callback.stopped:
        raise InterruptedError("stop requested")
    return save_final(trainer, tokenizer, out_dir, sink, train_seconds)
