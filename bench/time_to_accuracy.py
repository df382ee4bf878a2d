"""Time to held-out accuracy, side by side in one run: TRL's GRPOTrainer used directly (plain
GRPO) against a mathrl GRPO job's training code with its defaults (trainer.grpo.run_grpo:
dynamic sampling on the correctness verdict, zero-advantage completions skipped), on the same
model, task, learning rate, group size, batch and lengths. Both arms are scored on the same
held-out problems every few steps by the same code (trainer.heldout_eval, greedy, graded as eval
jobs grade). Each arm runs in its own process, one after the other.

Wall time counts training only: from the first step to the scoring point, less the time spent
scoring (model loading and engine start are before the first step). Prints each arm's series,
the wall time to reach each target, and the ratio mathrl / TRL.

    .venv/bin/python bench/time_to_accuracy.py --model .mathrl/models/SmolLM2-135M-Instruct
    .venv/bin/python bench/time_to_accuracy.py --model PATH --steps 24 --every 2 --targets 0.6,0.7 --backend vllm

`--backend` is the generation backend of both arms' rollouts: hf (default; the same for both, so
the ratio is the loop's alone) or vllm (mathrl's colocated engine; TRL's own colocated weight sync
cannot load into vLLM's CPU build, so its arm generates with hf either way). The arms
`mathrl-vllm` and `mathrl-vllm-dynamic-sampling` generate with vllm whatever `--backend` says, so
hf and vllm arms run in one invocation (docs/grpo-loop.md has both seeds' figures).
Issue 29's target on this 2-core CPU: time to 70% on add2-words at most 0.5x TRL direct's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from transformers import TrainerCallback  # noqa: E402

from runtime.errors import StopRequested  # noqa: E402
from runtime.sink import PrintSink  # noqa: E402


class SeriesSink(PrintSink):
    """Keeps the held-out points with their training wall time, and prints one line per point."""

    def __init__(self, out: Path, stop_at: float | None = None) -> None:
        super().__init__()
        self.out, self.stop_at = out, stop_at
        self.reached = False  # the highest target: the arm stops there (--stop-at-target)
        self.t_train: float | None = None
        self.eval_seconds = 0.0
        self.steps: dict[int, dict[str, float]] = {}

    def event(self, type: str, message: str = "", level: str = "info", data: dict[str, Any] | None = None) -> None:
        if type == "training":
            self.t_train = time.monotonic()
        if type in ("training", "heldout", "generation"):
            print(f"  [{type}] {message}", flush=True)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.steps.setdefault(step, {}).update(values)
        if "heldout/accuracy" in values:
            assert self.t_train is not None
            self.eval_seconds += values["heldout/seconds"]
            point = {
                "step": step,
                "accuracy": values["heldout/accuracy"],
                "ci_low": values["heldout/ci_low"],
                "ci_high": values["heldout/ci_high"],
                "train_seconds": time.monotonic() - self.t_train - self.eval_seconds,
            }
            with self.out.open("a") as f:
                f.write(json.dumps({"point": point}) + "\n")
            if self.stop_at is not None and point["accuracy"] >= self.stop_at:
                self.reached = True

    def should_stop(self, fresh: bool = False) -> bool:
        return self.reached

    def progress(self, done: int, total: int, message: str = "") -> None:
        pass


def common(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "learning_rate": args.lr,
        "num_generations": args.generations,
        "per_device_train_batch_size": args.completions,
        "max_completion_length": args.max_new_tokens,
        "temperature": 1.0,
        "beta": 0.0,
        "max_steps": args.steps,
        "seed": args.seed,
    }


def heldout(args: argparse.Namespace) -> dict[str, Any]:
    return {"benchmark": args.heldout, "limit": args.limit, "every": args.every, "max_new_tokens": 256}


# mathrl arms: the job's defaults, and each with one part of the loop turned off
# (an arm's own `generation` block replaces --backend's: the vllm arms generate with mathrl's
# colocated engine whatever --backend says, so hf and vllm arms run side by side in one run)
VLLM = {"generation": {"backend": "vllm"}}
MATHRL_ARMS: dict[str, dict[str, Any]] = {
    "mathrl": {},
    "mathrl-no-dynamic-sampling": {"dynamic_sampling": False},
    "mathrl-dynamic-sampling": {"dynamic_sampling": True},
    "mathrl-no-skip": {"skip_zero_advantage": False},
    "mathrl-curriculum": {"curriculum": True},
    "mathrl-vllm": VLLM,
    "mathrl-vllm-dynamic-sampling": {**VLLM, "dynamic_sampling": True},
    "mathrl-overlap": {"generation": {"backend": "hf", "overlap": True}},
}


def run_mathrl(args: argparse.Namespace, sink: SeriesSink, work: Path) -> None:
    from kinds import resolve_config
    from mathrl.specs import parse_spec
    from trainer.grpo import run_grpo

    spec = parse_spec(
        {
            "kind": "grpo",
            "model": args.model,
            "dataset": {"name": args.train, "limit": 4000},
            "rewards": [{"name": "accuracy"}],
            "generation": {"backend": args.backend},
            "logging_steps": 1,
            "save_steps": 10**6,
            "sample_every": 10**6,
            "eval": heldout(args),
            **common(args),
            **MATHRL_ARMS[args.arm],
        }
    )
    config = resolve_config(spec)
    print(
        f"  mathrl loop: dynamic_sampling={config.dynamic_sampling}, curriculum={config.curriculum}, "
        f"skip_zero_advantage={config.skip_zero_advantage}, overlap={config.generation.overlap}",
        flush=True,
    )
    try:
        run_grpo(spec, config, sink, model_path=args.model, data_dir=args.data_dir, out_dir=work / "out")
    except StopRequested:  # stopped at the target (SeriesSink.should_stop)
        pass


def run_trl(args: argparse.Namespace, sink: SeriesSink, work: Path) -> None:
    """TRL's GRPOTrainer as its docs show it: a GRPOConfig, a reward function, a dataset."""
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from evaluator.models import load_tokenizer
    from mathrl.specs import DatasetRef, HeldoutEval
    from trainer.data import load_problems, prompt_dataset
    from trainer.heldout_eval import HeldoutEvalCallback
    from trainer.rewards import get_reward

    tok = load_tokenizer(args.model)
    problems, template = load_problems(DatasetRef(name=args.train, limit=4000), args.data_dir)
    dataset, _ = prompt_dataset(problems, template, tok)
    c = common(args)
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        learning_rate=c["learning_rate"],
        num_generations=c["num_generations"],
        per_device_train_batch_size=c["per_device_train_batch_size"],
        max_completion_length=c["max_completion_length"],
        temperature=c["temperature"],
        beta=c["beta"],
        max_steps=c["max_steps"],
        seed=c["seed"],
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
        disable_tqdm=True,
    )
    accuracy = get_reward("accuracy", max_length=c["max_completion_length"])
    scorer = HeldoutEvalCallback(HeldoutEval(**heldout(args)), sink, tok, args.data_dir)
    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=[accuracy],
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[scorer],
    )
    scorer.trainer = trainer
    trainer.add_callback(StopAtTarget(sink))
    sink.event("training", "TRL GRPOTrainer (plain GRPO, hf generation)")
    trainer.train()


class StopAtTarget(TrainerCallback):  # type: ignore[misc]
    """Ends a plain TRL run at the step its held-out score reached the highest target."""

    def __init__(self, sink: SeriesSink) -> None:
        self.sink = sink

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.sink.should_stop():
            control.should_training_stop = True


def child(args: argparse.Namespace) -> None:
    out = Path(args.out)
    sink = SeriesSink(out, max(float(t) for t in args.targets.split(",")) if args.stop_at_target else None)
    with tempfile.TemporaryDirectory(prefix="tta-") as tmp:
        (run_trl if args.arm == "trl" else run_mathrl)(args, sink, Path(tmp))
    with out.open("a") as f:
        f.write(json.dumps({"metrics": sink.steps}) + "\n")


def reached(points: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    return next((p for p in points if p["accuracy"] >= target), None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "datasets"))
    p.add_argument("--train", default="add2-words-train")
    p.add_argument("--heldout", default="add2-words")
    p.add_argument("--limit", type=int, default=100, help="held-out problems scored at each point")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--every", type=int, default=2, help="score every N steps")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--completions", type=int, default=32, help="completions per step (questions x generations)")
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    p.add_argument("--targets", default="0.6,0.7")
    p.add_argument("--arms", default="trl,mathrl", help=f"trl and any of {', '.join(MATHRL_ARMS)}")
    p.add_argument("--stop-at-target", action="store_true", help="end an arm once it reaches the highest target")
    p.add_argument("--arm", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if Path(args.model).exists():  # a local path: absolute, as a spec wants it
        args.model = str(Path(args.model).resolve())
    if args.arm:
        child(args)
        return
    targets = [float(t) for t in args.targets.split(",")]
    print(
        f"{args.model} on {args.train}, scored on {args.limit} of {args.heldout} every {args.every} steps; "
        f"lr {args.lr}, G {args.generations}, {args.completions} completions/step, {args.max_new_tokens} new "
        f"tokens, {args.steps} steps, {args.backend} generation",
        flush=True,
    )
    results: dict[str, list[dict[str, Any]]] = {}
    for arm in args.arms.split(","):
        print(f"== {arm}", flush=True)
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            out = Path(f.name)
        cmd = [sys.executable, __file__, *sys.argv[1:], "--arm", arm, "--out", str(out)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        t0 = time.monotonic()
        r = subprocess.run(cmd, env=env, cwd=ROOT)
        if r.returncode:
            sys.exit(f"{arm} failed ({r.returncode})")
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        results[arm] = [row["point"] for row in rows if "point" in row]
        out.unlink()
        print(f"   {arm}: {time.monotonic() - t0:.0f}s in all", flush=True)
        for pt in results[arm]:
            print(
                f"   step {pt['step']:3d}  {pt['accuracy']:6.1%}  [{pt['ci_low']:.1%}, {pt['ci_high']:.1%}]  "
                f"after {pt['train_seconds']:7.1f}s of training",
                flush=True,
            )
    print("\ntime to held-out accuracy (training seconds; step in brackets)")
    for target in targets:
        cells = {arm: reached(points, target) for arm, points in results.items()}
        line = "  ".join(
            f"{arm} {c['train_seconds']:.0f}s (step {c['step']})" if c else f"{arm} not reached in {args.steps} steps"
            for arm, c in cells.items()
        )
        ratio = ""
        if cells.get("trl"):
            base = cells["trl"]["train_seconds"]
            ratio = "".join(
                f"  {arm}/trl {c['train_seconds'] / base:.2f}" for arm, c in cells.items() if arm != "trl" and c
            )
        print(f"  {target:.0%}: {line}{ratio}", flush=True)


if __name__ == "__main__":
    main()
