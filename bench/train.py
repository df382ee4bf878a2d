"""Per-step time of one GRPO config run through the service against the same config run by
TRL directly, on the same machine in one run. Target: ratio <= 1.05. The fixed start-up
cost of a job (queueing, process start, imports, model load) is reported apart.

    .venv/bin/python bench/train.py [--steps 40] [--model tiny|smollm2|PATH]

The service side is the embedded default (SQLite, SQLite broker, one worker, the API).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class StepTimer:
    """A TrainerCallback measuring wall time between step ends."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        timer = self

        class _CB(TrainerCallback):  # type: ignore[misc]
            def on_train_begin(self, *a: Any, **k: Any) -> None:
                timer.last = time.perf_counter()

            def on_step_end(self, *a: Any, **k: Any) -> None:
                now = time.perf_counter()
                timer.times.append(now - timer.last)
                timer.last = now

        self.times: list[float] = []
        self.last = 0.0
        self.callback = _CB()


def direct_trl(spec: Any, config: dict[str, Any], model_path: str, out: Path) -> list[float]:
    """The same config with TRL's own API: no sink, no service."""
    from trl import GRPOTrainer

    from evaluator.models import load_tokenizer
    from trainer.data import load_problems, prompt_dataset
    from trainer.grpo import build_rewards
    from trainer.grpo_config import grpo_args

    tok = load_tokenizer(model_path)
    problems, template = load_problems(spec.dataset, None)
    dataset, _ = prompt_dataset(problems, template, tok)
    rewards, weights = build_rewards(spec, config)
    import torch

    args = grpo_args(config, out, use_cpu=not torch.cuda.is_available())
    args.reward_weights = weights
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=rewards,
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[timer.callback],
    )
    trainer.train()
    return timer.times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--random-init", help="directory with config.json + tokenizer: random weights (speed only)")
    ap.add_argument("--direct-only", action="store_true", help="only TRL directly (a machine without the service)")
    ap.add_argument("--completion-length", type=int, default=16)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]

    from mathrl.client import Client
    from mathrl.specs import GRPOSpec
    from mathrl.specs.presets import resolve_grpo
    from service.embedded import demo_key, embedded_service, prepare_model

    work = Path(tempfile.mkdtemp(prefix="mathrl-bench-train-"))
    if args.random_init:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        model_path = str(work / "random")
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.random_init)).save_pretrained(model_path)
        AutoTokenizer.from_pretrained(args.random_init).save_pretrained(model_path)
    else:
        model_path = prepare_model(args.model, work)
    body = {
        "kind": "grpo",
        "model": model_path,
        "dataset": {"name": "arith", "split": "train", "limit": 5000},
        "max_steps": args.steps,
        "num_generations": 8,
        "per_device_train_batch_size": 32,
        "max_completion_length": args.completion_length,
        "learning_rate": 1e-5,
        "logging_steps": 1,
        "save_steps": 10**6,
        "sample_every": 10,
        "rewards": [{"name": "accuracy"}, {"name": "format", "weight": 0.1}],
    }
    spec = GRPOSpec.model_validate(body)
    config = resolve_grpo(spec)
    import torch

    where = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    print(f"GRPO bench: {args.steps} steps, model {Path(model_path).name}, G=8, 32 completions/step, {where}")
    direct = direct_trl(spec, config, model_path, work / "direct")
    skip = max(1, args.steps // 10)  # the first steps warm caches in both runs
    if args.direct_only:
        print(
            f"per-step median, TRL direct: {statistics.median(direct[skip:]) * 1000:.1f} ms "
            f"(mean {statistics.mean(direct[skip:]) * 1000:.1f} ms)"
        )
        return
    local = Path(model_path)  # a model prepared here is outside the service's default model roots
    roots = [str(local.resolve().parent)] if local.exists() else None
    with embedded_service(work / "svc", 0, roots) as (url, env):
        client = Client(url, api_key=demo_key(env))
        t0 = time.monotonic()
        job = client.jobs.create(body)
        done = client.jobs.wait(job.id, timeout=3600, poll=0.5)
        wall = time.monotonic() - t0
        assert done.status == "succeeded", done.error
        series = {m.name: m for m in client.jobs.metrics(job.id)}
        events = client.jobs.events(job.id)
    service_steps = [p.value for p in series["step_time"].points]
    trained = next(e for e in events if e.type == "trained")
    train_seconds = float(trained.data["train_seconds"])

    d = statistics.median(direct[skip:])
    s = statistics.median(service_steps[skip:])
    print(
        f"per-step median  TRL direct {d * 1000:7.1f} ms   through the service {s * 1000:7.1f} ms"
        f"   ratio {s / d:.3f} (target <= 1.05)"
    )
    print(
        f"per-step mean    TRL direct {statistics.mean(direct[skip:]) * 1000:7.1f} ms   "
        f"through the service {statistics.mean(service_steps[skip:]) * 1000:7.1f} ms"
    )
    print(
        f"fixed start-up of the job (submit -> training, and saving after): {wall - train_seconds:.1f} s "
        f"of {wall:.1f} s wall"
    )


if __name__ == "__main__":
    main()
