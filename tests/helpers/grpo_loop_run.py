"""Run by tests/system/test_grpo_loop.py in processes of its own (one, or two under `accelerate launch`):
GRPO steps on the tiny model through trainer.grpo_loop.MathrlGRPOTrainer, once per set of loop
options in a JSON list (one process start for them all), each run's final weights (rank 0) and
every logged metric written to OUT_DIR/<index>.

    python tests/helpers/grpo_loop_run.py MODEL DATA_DIR OUT_DIR '[{"skip_zero_advantage": true, ...}, ...]'

The reward makes groups with and without signal side by side: a question with an even gold
answer is rewarded by the number of distinct characters its completion writes (which varies
inside a group of a random model's samples); a question with an odd one scores 0 whatever is written (zero variance,
zero advantage).

With `"overlap": true` each generation is recorded: its questions, the weights the policy had
then, and how far the batch's `old_per_token_logps` are from the log-probabilities TRL's own
forward gives its completions under the weights of `staleness` steps before (`error`: they should
be those), and under the weights the step trains from (`drift`)."""

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
    limit = opts.get("limit", 64)
    problems, template = load_problems(DatasetRef(name="arith", split="train", limit=limit), data_dir)
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
        temperature=opts.get("temperature", 1.0),
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
            overlap=opts.get("overlap", False),
        ),
        model=model,
        reward_funcs=[chars_on_even],
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[Keep()],
    )
    generations = record_generations(trainer) if opts.get("record") else []
    trainer.train()
    checks = check_old_logprobs(trainer, generations, logged) if generations else []
    if trainer.accelerator.is_main_process:
        weights = {k: v.detach().clone().contiguous() for k, v in trainer.model.state_dict().items()}
        save_file(weights, str(Path(out) / "weights.safetensors"))
        (Path(out) / "metrics.json").write_text(
            json.dumps({"logged": logged, "skip_applies": trainer.skip_zero_advantage, "generations": checks})
        )


def record_generations(trainer: Any) -> list[dict[str, Any]]:
    """Wrap the trainer's generation: each call's questions, batch and the weights at the time."""
    records: list[dict[str, Any]] = []
    generate = trainer._generate_and_score_completions

    def recorded(inputs: list[dict[str, Any]]) -> dict[str, Any]:
        weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        out = generate(inputs)
        if trainer.model.training:
            keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "old_per_token_logps")
            batch = {k: out[k].clone() for k in keys if k in out}
            records.append({"prompts": [str(x["prompt"]) for x in inputs], "batch": batch, "weights": weights})
        return out

    trainer._generate_and_score_completions = recorded
    return records


def check_old_logprobs(trainer: Any, records: list[dict[str, Any]], logged: list[dict[str, Any]]) -> list[Any]:
    import torch

    staleness = [int(m["overlap/staleness"]) for m in logged if "overlap/staleness" in m]
    final = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    out = []
    for i, rec in enumerate(records):
        batch, stale = rec["batch"], staleness[i] if i < len(staleness) else None

        def distance(weights: dict[str, Any], batch: dict[str, Any] = batch) -> float | None:
            if "old_per_token_logps" not in batch:
                return None
            trainer.model.load_state_dict(weights)
            ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
            mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
            trainer.model.eval()
            with torch.no_grad():
                logps, _, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.model, ids, mask, batch["completion_ids"].size(1)
                )
            on = batch["completion_mask"].bool()
            return float((logps - batch["old_per_token_logps"])[on].abs().max())

        sampled_with = records[i - stale]["weights"] if stale is not None and i >= stale else None
        out.append(
            {
                "prompts": rec["prompts"],
                "staleness": stale,
                "error": distance(sampled_with) if sampled_with is not None else None,
                "drift": distance(rec["weights"]),  # the weights this step trains from
            }
        )
    trainer.model.load_state_dict(final)
    return out


if __name__ == "__main__":
    main(*sys.argv[1:])
