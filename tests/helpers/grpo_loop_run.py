"""Run by tests/system/test_grpo_loop.py in processes of its own (one, or two under `accelerate launch`):
GRPO steps on the tiny model through trainer.grpo_loop.MathrlGRPOTrainer, once per set of loop
options in a JSON list (one process start for them all), each run's final weights (rank 0) and
every logged metric written to OUT_DIR/<index>.

    python tests/helpers/grpo_loop_run.py MODEL DATA_DIR OUT_DIR '[{"skip_zero_advantage": true, ...}, ...]'

The reward makes groups with and without signal side by side: a question with an even gold
answer is rewarded by the number of distinct characters its completion writes (which varies
inside a group of a random model's samples); a question with an odd one scores 0 whatever is written (zero variance,
zero advantage)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def chars_on_even(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    return [float(len(set(str(c)))) if int(a) % 2 == 0 else 0.0 for c, a in zip(completions, answer, strict=True)]


def main(model: str, data_dir: str, out: str, options: str) -> None:
    for i, opts in enumerate(json.loads(options)):
        run(model, data_dir, str(Path(out) / str(i)), opts)


def run(model: str, data_dir: str, out: str, opts: dict[str, Any]) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import TrainerCallback
    from trl import GRPOConfig

    from evaluator.models import load_tokenizer
    from mathrl.specs import Curriculum, DatasetRef, DynamicSampling
    from trainer.data import load_problems, prompt_dataset
    from trainer.grpo_loop import LoopOptions, MathrlGRPOTrainer

    torch.manual_seed(0)
    tok = load_tokenizer(model)
    problems, template = load_problems(DatasetRef(name="arith", split="train", limit=64), data_dir)
    dataset, _ = prompt_dataset(problems, template, tok, 64)
    logged: list[dict[str, float]] = []

    class Keep(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            logged.append({"step": state.global_step, **(logs or {})})

    args = GRPOConfig(
        output_dir=str(Path(out) / "run"),
        learning_rate=opts.get("learning_rate", 0.5),
        optim="sgd",  # the update is the gradient itself: a wrong loss scale shows (Adam would hide it)
        num_generations=4,
        max_completion_length=10,
        per_device_train_batch_size=opts.get("per_device", 8),
        gradient_accumulation_steps=opts.get("accumulation", 2),
        loss_type=opts.get("loss_type", "dapo"),
        beta=0.0,
        max_steps=opts.get("steps", 1),
        logging_steps=1,
        save_strategy="no",
        seed=7,
        report_to=[],
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = MathrlGRPOTrainer(
        loop=LoopOptions(
            dynamic_sampling=DynamicSampling(**opts["dynamic_sampling"]) if opts.get("dynamic_sampling") else None,
            curriculum=Curriculum(**opts["curriculum"]) if opts.get("curriculum") else None,
            skip_zero_advantage=opts.get("skip_zero_advantage", False),
            signal_reward=0,
        ),
        model=model,
        reward_funcs=[chars_on_even],
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[Keep()],
    )
    trainer.train()
    if trainer.accelerator.is_main_process:
        weights = {k: v.detach().clone().contiguous() for k, v in trainer.model.state_dict().items()}
        save_file(weights, str(Path(out) / "weights.safetensors"))
        (Path(out) / "metrics.json").write_text(
            json.dumps({"logged": logged, "skip_applies": trainer.skip_zero_advantage})
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
