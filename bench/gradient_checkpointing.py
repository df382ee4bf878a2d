"""A training step of the demo's tiny model with and without gradient checkpointing, side by side in one
run. TRL's SFTConfig and RewardConfig turn it on by default, and a job that leaves
`gradient_checkpointing` unset gets TRL's default (trainer/training_args.py). On a model this small
there is no memory to save, so the recomputed forward pass is pure cost.

    .venv/bin/python bench/gradient_checkpointing.py                  # tiny:4x128, batch 128 x 16 tokens
    .venv/bin/python bench/gradient_checkpointing.py --layers 2 --width 64 --batch 64

Each arm builds the model fresh (trainer.tiny, the demo's shape by default) and times `--steps` steps
of forward, backward and AdamW after 3 warm-up steps. The arms alternate `--repeats` times and the
median is printed, with the ratio of the two."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def step_seconds(model_dir: Path, checkpointing: bool, batch: int, length: int, steps: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    if checkpointing:  # as TRL's trainers enable it
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (batch, length))

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from trainer.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(tmp, hidden_size=args.width, layers=args.layers)
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats):
            for checkpointing in (True, False):
                times[checkpointing].append(step_seconds(model_dir, checkpointing, args.batch, args.length, args.steps))
    shape = f"tiny:{args.layers}x{args.width}, batch {args.batch} x {args.length} tokens"
    for checkpointing in (True, False):
        runs = ", ".join(f"{t * 1000:.1f}" for t in times[checkpointing])
        median = statistics.median(times[checkpointing]) * 1000
        print(f"{shape}: checkpointing {'on ' if checkpointing else 'off'} {median:.1f} ms/step (runs: {runs})")
    ratio = statistics.median(times[False]) / statistics.median(times[True])
    print(f"off / on: {ratio:.2f}")


if __name__ == "__main__":
    main()
