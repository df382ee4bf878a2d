"""SFT jobs on TRL's SFTTrainer: prompt -> completion pairs rendered with the evaluation
prompts, loss on the completion only.

Held out (`eval`): a benchmark is answered and graded every N steps (trainer/heldout_eval.py); an
uploaded file (OpenAI's validation file) is the trainer's own evaluation every N steps and after
the last: the loss and token accuracy on its chats' answers, the series eval_loss and
eval_mean_token_accuracy (a fine-tuning job's checkpoints show them as OpenAI's full_valid_loss
and full_valid_mean_token_accuracy)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evaluator import prompts
from evaluator.models import check_loaded_from_hub, load_tokenizer
from evaluator.tool_formats import FORMATS, tool_format
from mathrl.modelref import FINE_TUNING_TAG
from mathrl.recipe import Recipe
from mathrl.specs import DatasetRef, SFTSpec
from mathrl.specs.resolved import ResolvedSFT
from runtime.errors import StopRequested
from runtime.sink import Sink
from trainer.callbacks import SinkCallback
from trainer.checkpoints import latest_checkpoint, save_checkpoints_atomically, save_final
from trainer.data import load_problems, render_prompt
from trainer.grpo_config import lora_config
from trainer.heldout_eval import HeldoutEvalCallback
from trainer.training_args import training_args

if TYPE_CHECKING:
    from trl import SFTConfig


def carry_token_count(trainer: Any) -> None:
    """Make SFTTrainer's `num_tokens` metric survive a resume. TRL counts the tokens trained on
    in an attribute of the trainer, not in its saved state, so a resumed run counted from 0
    again (tests/system/test_resume.py found it). The count is kept in the trainer state's
    `num_input_tokens_seen` (unused by the Trainer itself unless include_num_input_tokens_seen
    is set, which SFT jobs do not), which every checkpoint saves, and read back on resume."""
    from transformers import TrainerCallback

    class Carry(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            trainer._total_train_tokens = state.num_input_tokens_seen or 0

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            state.num_input_tokens_seen = trainer._total_train_tokens

    assert hasattr(trainer, "_total_train_tokens"), "TRL's SFTTrainer no longer keeps _total_train_tokens"
    trainer.add_callback(Carry())


def sft_dataset(spec: SFTSpec, tokenizer: Any, data_dir: str | None, source: DatasetRef | None = None) -> Any:
    """The rows of `source` (the spec's dataset unless given) as prompt -> completion pairs."""
    from datasets import Dataset

    problems, name = load_problems(source or spec.dataset, data_dir)
    template: Recipe | str = name
    fmt = tool_format(spec.tools.format, tokenizer) if spec.tools is not None else None
    if fmt is not None:  # the prompt a tool job renders: the recipe with the format's instruction
        template = fmt.recipe_for(prompts.as_recipe(name))
    chat_tools = fmt.chat_tools if fmt is not None else None
    rows = []
    for p in problems:
        if "messages" in p.meta:  # OpenAI's fine-tuning JSONL: the chat, and its last assistant message
            if p.solution is None:
                raise ValueError(f"dataset: line {p.index + 1} has no assistant message to learn (supervised)")
            rows.append(
                {
                    "prompt": render_prompt(p, template, tokenizer, chat_tools),
                    "completion": p.solution + tokenizer.eos_token,
                }
            )
            continue
        target = p.solution if name != "plain" and p.solution else p.gold
        trace = FORMATS["code-blocks"].read_trace(target) if fmt is not None else None
        if fmt is not None and trace is not None:  # a program's code-block trace, written in the job's format
            target = fmt.write_trace(*trace)
        prompt = prompts.render(template, p.question, tokenizer, tools=chat_tools)
        rows.append({"prompt": prompt, "completion": target + tokenizer.eos_token})
    return Dataset.from_list(rows)


def sft_args(config: ResolvedSFT, output_dir: Path, use_cpu: bool, eval_every: int | None = None) -> SFTConfig:
    """TRL's SFTConfig from a job's resolved config: the arguments every training job shares, and
    SFT's own; `eval_every`: the trainer evaluates its eval dataset every N steps."""
    from trl import SFTConfig

    evaluated: dict[str, Any] = {}
    if eval_every is not None:
        evaluated = {
            "eval_strategy": "steps",
            "eval_steps": eval_every,
            "per_device_eval_batch_size": config.per_device_train_batch_size,
        }

    return SFTConfig(
        **training_args(
            output_dir,
            use_cpu=use_cpu,
            seed=config.seed,
            learning_rate=config.learning_rate,
            per_device_train_batch_size=config.per_device_train_batch_size,
            logging_steps=config.logging_steps,
            save_steps=config.save_steps,
            gradient_checkpointing=config.gradient_checkpointing,  # unset in the spec: TRL's default, on
        ),
        max_steps=config.max_steps,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        max_length=config.max_length,
        warmup_steps=int(config.warmup_ratio * config.max_steps),
        completion_only_loss=True,
        max_grad_norm=1.0,
        **evaluated,
    )


def run_sft(
    spec: SFTSpec,
    config: ResolvedSFT,
    sink: Sink,
    *,
    model_path: str,
    data_dir: str | None,
    out_dir: Path,
    work_dir: Path | None = None,
) -> dict[str, Any]:
    """Train; checkpoints and the final model end up in out_dir (see run_grpo for work_dir)."""
    import torch
    from trl import SFTTrainer

    tokenizer = load_tokenizer(model_path)
    dataset = sft_dataset(spec, tokenizer, data_dir)
    validation, every = None, None
    if spec.eval is not None and spec.eval.file is not None:  # OpenAI's validation file: its first `limit` chats
        where = DatasetRef(path=spec.eval._path or spec.eval.file, format="messages")  # found by worker.child
        validation = sft_dataset(spec, tokenizer, data_dir, where)
        validation = validation.select(range(min(spec.eval.limit, len(validation))))
        every = spec.eval.every
    use_cpu = not torch.cuda.is_available()
    args = sft_args(config, work_dir or out_dir, use_cpu, every)
    peft_config = lora_config(config.lora)
    callback = SinkCallback(
        sink,
        sample_every=10**9,
        total_steps=config.max_steps,
        checkpoint_dir=str(out_dir),
        metrics_events=FINE_TUNING_TAG in spec.tags,
    )
    heldout = HeldoutEvalCallback(spec.eval, sink, tokenizer, data_dir) if spec.eval and validation is None else None
    trainer = SFTTrainer(
        model=model_path,
        args=args,
        train_dataset=dataset,
        eval_dataset=validation,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=([heldout] if heldout else []) + [callback],
    )
    check_loaded_from_hub(model_path, trainer.model)
    if heldout is not None:
        heldout.trainer = trainer
    save_checkpoints_atomically(trainer)
    carry_token_count(trainer)
    resume = latest_checkpoint(out_dir)
    sink.event(
        "training",
        f"SFT on {len(dataset)} examples, {config.max_steps} steps"
        + (f"; resuming from {resume.name}" if resume else ""),
    )
    t0 = time.monotonic()
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    seconds = time.monotonic() - t0
    if callback.stopped:
        raise StopRequested("stop requested")
    if every is not None and trainer.state.global_step % every:
        trainer.evaluate()  # after the last step too, as a held-out benchmark is
    return save_final(trainer, tokenizer, out_dir, sink, seconds, work_dir)
