"""GRPO jobs on TRL's GRPOTrainer. `run_grpo(spec, config, sink, ...)` takes the resolved
config (mathrl.specs.presets.resolve_grpo) and nothing of the database."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluator.backends.base import EngineSettings
from evaluator.models import load_tokenizer
from evaluator.prompts import as_recipe
from evaluator.python_tool import Tool, job_tool
from evaluator.tool_formats import ToolFormat, tool_format
from mathrl.backends import uses_vllm
from mathrl.modelref import FINE_TUNING_TAG
from mathrl.specs import GRPOSpec
from mathrl.specs.resolved import ResolvedGRPO
from mathrl.specs.tools import Tools
from runtime.errors import StopRequested
from runtime.sink import Sink
from trainer.callbacks import SinkCallback
from trainer.checkpoints import latest_checkpoint, save_checkpoints_atomically, save_final
from trainer.data import load_problems, prompt_dataset
from trainer.grpo_config import grpo_args, lora_config
from trainer.heldout_eval import HeldoutEvalCallback
from trainer.rewards import GraderReward, reward_for
from trainer.tool_grpo import ToolRollouts, VoidTurnPenalty


def build_rewards(
    spec: GRPOSpec, config: ResolvedGRPO, resolve_model: Any = None, sandbox: Any = None
) -> tuple[list[GraderReward], list[float]]:
    """The spec's rewards, each a grader (RewardRef.as_grader), and their weights; `sandbox`: where
    and how their python graders run (evaluator.sandbox.SandboxLimits)."""
    rewards = [reward_for(ref, config.max_completion_length, resolve_model, sandbox=sandbox) for ref in spec.rewards]
    return rewards, [ref.weight for ref in spec.rewards]


def generation_backend(config: ResolvedGRPO, sink: Sink) -> str:
    """The backend this process generates with: the resolved one, except that 'auto' falls back
    to hf on a worker without vLLM (an explicit 'vllm' was refused by worker.child before)."""
    import importlib.util

    backend: str = config.generation_backend
    if uses_vllm(backend) and importlib.util.find_spec("vllm") is None:
        sink.event(
            "generation",
            "generation.backend 'auto' chose vLLM for this GPU job, but this worker has no vLLM: generating with hf",
            "warning",
        )
        return "hf"
    return backend


def vllm_engine_options(spec: GRPOSpec, config: ResolvedGRPO, settings: EngineSettings | None) -> dict[str, Any]:
    """Engine arguments for GRPO's colocated vLLM (same dtype and CPU rules as eval jobs, and the
    operator's `settings`)."""
    from evaluator.backends.vllm import engine_options

    gen = config.generation
    # colocated with training: TRL's 0.3 of the GPU unless the spec says otherwise
    return engine_options(
        gen.dtype,
        gen.gpu_memory_utilization or 0.3,
        gen.enable_prefix_caching,
        max_model_len=config.max_prompt_length + config.max_completion_length,
        settings=settings,
    )


@dataclass(frozen=True)
class ToolSetup:
    """A tool job's parts: its sandbox, the call format and the spec's settings (trainer/tool_grpo.py)."""

    tool: Tool
    fmt: ToolFormat
    tools: Tools

    @classmethod
    def open(cls, tools: Tools, sandbox: Any, tokenizer: Any) -> ToolSetup:
        """The job's tool sandbox, refused (SandboxUnavailable) where no kernel boundary holds it, and
        the format for its model (a chat template that carries no tool calls is refused at tools/format)."""
        fmt = tool_format(tools.format, tokenizer)
        return cls(job_tool(tools.python.timeout_s, tools.python.max_output_chars, sandbox), fmt, tools)


def run_grpo(
    spec: GRPOSpec,
    config: ResolvedGRPO,
    sink: Sink,
    *,
    model_path: str,
    data_dir: str | None,
    out_dir: Path,
    resolve_model: Any = None,
    vllm_server_url: str | None = None,
    work_dir: Path | None = None,
    engine_settings: EngineSettings | None = None,
    sandbox: Any = None,
) -> dict[str, Any]:
    """Train; checkpoints go to out_dir/checkpoint-N, the final model to out_dir/final.
    A run that finds a checkpoint in out_dir resumes from it. With `work_dir` (a job attempt's
    own directory) the trainer writes there and the sink moves each checkpoint and the final
    model into out_dir as it records them (the worker's sink: only while the attempt owns the
    job). In server mode, `vllm_server_url` is the server the worker started for this job
    (worker.vllm_server); `engine_settings`: the operator's, for a colocated engine."""
    import torch

    from trainer.grpo_loop import LoopOptions, MathrlGRPOTrainer

    t0 = time.monotonic()
    tokenizer = load_tokenizer(model_path)
    problems, template = load_problems(spec.dataset, data_dir)
    # the tool's sandbox starts at its first call, and ends with the training below
    tooling = ToolSetup.open(spec.tools, sandbox, tokenizer) if spec.tools is not None else None
    # with a tool, the recipe tells the model how to call it (evaluator/tool_formats.py)
    recipe = tooling.fmt.recipe_for(as_recipe(template)) if tooling is not None else template
    # TRL's async trainer applies the chat template itself (it re-renders multi-turn rollouts)
    dataset, dropped = prompt_dataset(
        problems,
        recipe,
        tokenizer,
        config.max_prompt_length,
        conversational=config.algorithm == "async",
        tools=tooling.fmt.chat_tools if tooling is not None else None,
    )
    if dropped:
        sink.event("data", f"dropped {dropped} prompts longer than {config.max_prompt_length} tokens", "warning")
    rewards, weights = build_rewards(spec, config, resolve_model, sandbox)
    if tooling is not None and tooling.tools.void_turns == "penalize":
        rewards.append(VoidTurnPenalty(tooling.tools.void_turn_penalty))  # type: ignore[arg-type]
        weights.append(1.0)
    use_cpu = not torch.cuda.is_available()
    backend = generation_backend(config, sink)
    if uses_vllm(backend) and config.generation.mode == "server" and not vllm_server_url:
        raise RuntimeError("generation.mode is 'server' but the worker started no vLLM server for this job")
    callback = SinkCallback(
        sink,
        sample_every=config.sample_every,
        total_steps=config.max_steps,
        checkpoint_dir=str(out_dir),
        metrics_events=FINE_TUNING_TAG in spec.tags,
    )
    callback.rewards = rewards  # samples whose check overran its time (trainer/rewards.py) are logged
    heldout = (
        HeldoutEvalCallback(spec.eval, sink, tokenizer, data_dir, (rewards, weights), tooling=tooling)
        if spec.eval
        else None
    )
    # held-out scoring first: its time is in the step SinkCallback measures, and taken out again
    callbacks = ([heldout] if heldout else []) + [callback]
    work = work_dir or out_dir
    if config.algorithm == "async":
        from trainer.async_grpo import build_async_trainer

        assert vllm_server_url is not None  # async needs server mode (checked at submit)
        trainer = build_async_trainer(
            spec,
            config,
            sink,
            model_path=model_path,
            dataset=dataset,
            tokenizer=tokenizer,
            rewards=rewards,
            weights=weights,
            out_dir=work,
            server_url=vllm_server_url,
            callbacks=callbacks,
            peft_config=lora_config(config.lora),
        )
    else:
        hf_mode = None if uses_vllm(backend) else config.generation.resolved_hf_mode()
        args = grpo_args(config, work, use_cpu, backend, vllm_server_url, hf_mode or "dynamic")
        args.reward_weights = weights
        engine = vllm_engine_options(spec, config, engine_settings) if uses_vllm(backend) else None
        trainer = MathrlGRPOTrainer(
            loop=LoopOptions.from_config(config, [r.__name__ for r in rewards]),
            model=model_path,
            reward_funcs=rewards,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora_config(config.lora),
            callbacks=callbacks,
            engine_options=engine,
            hf_mode=hf_mode,
            rollout_func=ToolRollouts(tooling.tool, tooling.fmt, tooling.tools) if tooling is not None else None,
        )
        sink.event(
            "generation",
            _describe_generation(backend, config, engine, time.monotonic() - t0, hf_mode),
            data={
                "backend": backend,
                "hf_mode": hf_mode,
                "overlap": bool(hf_mode and config.generation.overlap),
                "mode": config.generation.mode if uses_vllm(backend) else None,
                "version": _backend_version(backend),
                "engine_options": engine,
            },
        )
    callback.trainer = trainer
    if heldout is not None:
        heldout.trainer = trainer
    save_checkpoints_atomically(trainer)
    resume = latest_checkpoint(out_dir)
    sink.event(
        "training",
        f"GRPO on {len(dataset)} questions, {config.max_steps} steps, G={config.num_generations}, "
        f"batch {config.global_batch_size} completions, rewards {[r.__name__ for r in rewards]}"
        + (f"; resuming from {resume.name}" if resume else ""),
        data={"setup_seconds": time.monotonic() - t0},
    )
    t1 = time.monotonic()
    try:
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    finally:
        if tooling is not None:
            tooling.tool.close()
    train_seconds = time.monotonic() - t1
    if callback.stopped:
        raise StopRequested("stop requested")
    return save_final(trainer, tokenizer, out_dir, sink, train_seconds, work_dir)


def _backend_version(name: str) -> str:
    from evaluator.backends import backend

    return backend(name).version()


def _describe_generation(
    backend: str, config: ResolvedGRPO, engine: dict[str, Any] | None, seconds: float, hf_mode: str | None = None
) -> str:
    if not uses_vllm(backend):
        overlap = ", the next step's batch while this one trains (overlap)" if config.generation.overlap else ""
        return f"generating with {backend} ({_backend_version(backend)}), decoding '{hf_mode}'{overlap}"
    where = "the job's vLLM server" if config.generation.mode == "server" else "a colocated engine"
    sync = (
        ("LoRA adapter" if config.lora and config.lora.enabled else "full weights")
        if config.generation.mode == "server"
        else "full weights"
    )
    return (
        f"generating with {_backend_version(backend)} in {where}, dtype {engine and engine['dtype']}, syncing "
        f"{sync} every step (trainer and generation ready in {seconds:.0f}s)"
    )
