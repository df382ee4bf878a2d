"""Evaluation throughput: batched HF vs one-at-a-time HF, and vLLM vs batched HF, on the same
model, problems and sampling settings, in one run. Targets on a 2-core CPU: batched >= 4x
one-at-a-time; vLLM >= batched HF.

    .venv/bin/python bench/eval.py --model .mathrl/models/SmolLM2-135M-Instruct --limit 32
    .venv/bin/python bench/eval.py --model PATH --vllm-python .venv/bin/python [--vllm-eager]

--vllm-eager also runs vLLM with MATHRL_VLLM__ENFORCE_EAGER=1 (no torch.compile): its start-up
and generation speed beside the compiled engine's (vLLM keeps compiled graphs in ~/.cache/vllm,
so a compiled engine's first start on a machine is longer than the one measured after it).

--random-init DIR builds a model with DIR's config.json and random weights (speed only;
for machines the weights cannot travel to). Generation time only; start-up is reported apart.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def prompts_for(model: str, limit: int, data_dir: str) -> list[str]:
    from evaluator import prompts
    from evaluator.benchmarks import get_benchmark
    from evaluator.data import load_benchmark
    from evaluator.models import load_tokenizer

    tok = load_tokenizer(model)
    bench = get_benchmark("gsm8k")
    return [prompts.render(bench.recipe, p.question, tok) for p in load_benchmark(bench, data_dir, limit)]


def time_backend(backend: str, model: str, texts: list[str], max_new_tokens: int, batch_size: int) -> dict:
    from evaluator.backends import Decoding
    from evaluator.backends import backend as named
    from evaluator.models import load_tokenizer

    tok = load_tokenizer(model)
    t0 = time.perf_counter()
    gen = named(backend).load(model, tok, seed=0, max_model_len=2048)
    startup = time.perf_counter() - t0
    gen.generate(texts[:2], Decoding(8, batch_size=2))  # warm-up
    t1 = time.perf_counter()
    gens = gen.generate(texts, Decoding(max_new_tokens, batch_size=batch_size))
    seconds = time.perf_counter() - t1
    tokens = sum(g[0].tokens for g in gens)
    return {
        "backend": backend,
        "batch_size": batch_size,
        "seconds": seconds,
        "startup": startup,
        "problems_per_s": len(texts) / seconds,
        "tokens_per_s": tokens / seconds,
        "tokens": tokens,
        "texts": [g[0].text for g in gens],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=False)
    ap.add_argument("--random-init", help="directory with config.json and tokenizer files")
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--vllm-python", help="python of an environment with vLLM (e.g. .venv/bin/python)")
    ap.add_argument("--vllm-eager", action="store_true", help="also run vLLM without torch.compile")
    ap.add_argument("--skip-hf", action="store_true", help="vLLM runs only")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one backend, print JSON
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]
    from mathrl.paths import default_data_dir

    data_dir = args.data_dir or default_data_dir()
    model = args.model
    if args.random_init:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        model = tempfile.mkdtemp(prefix="mathrl-random-")
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.random_init)).save_pretrained(model)
        AutoTokenizer.from_pretrained(args.random_init).save_pretrained(model)
    texts = prompts_for(model, args.limit, data_dir)
    if args.one:
        backend, bs = args.one.split(":")
        r = time_backend(backend, model, texts, args.max_new_tokens, int(bs))
        print("RESULT " + json.dumps(r))
        return

    def run(spec: str, python: str = sys.executable, env: dict[str, str] | None = None) -> dict:
        cmd = [
            python,
            __file__,
            "--model",
            model,
            "--limit",
            str(args.limit),
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--data-dir",
            data_dir,
            "--one",
            spec,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})})
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"{spec} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
        return json.loads(line[7:])

    import torch

    device = (
        torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({__import__('os').cpu_count()} cores)"
    )
    print(
        f"eval bench: {Path(model).name}, {args.limit} GSM8K problems, greedy, "
        f"max {args.max_new_tokens} new tokens, {device}"
    )
    rows = [] if args.skip_hf else [run("hf:1"), run(f"hf:{args.limit}")]
    vllm = eager = None
    if args.vllm_python:
        vllm = run(f"vllm:{args.limit}", args.vllm_python)
        rows.append(vllm)
        if args.vllm_eager:
            eager = run(f"vllm:{args.limit}", args.vllm_python, {"MATHRL_VLLM__ENFORCE_EAGER": "1"})
            eager["backend"] = "vllm eager"
            rows.append(eager)
    for r in rows:
        print(
            f"  {r['backend']:<10} batch {r['batch_size']:>4}: {r['problems_per_s']:7.3f} problems/s "
            f"{r['tokens_per_s']:8.1f} tokens/s  ({r['seconds']:.1f}s generating, {r['startup']:.1f}s start-up)"
        )
    if not args.skip_hf:
        one, batched = rows[0], rows[1]
        print(f"batched HF / one-at-a-time HF: {batched['problems_per_s'] / one['problems_per_s']:.2f}x (target >= 4)")
        same = sum(a == b for a, b in zip(one["texts"], batched["texts"], strict=True))
        print(f"  identical completions, batched vs one-at-a-time: {same}/{len(texts)}")
        if vllm is not None:
            print(f"vLLM / batched HF: {vllm['problems_per_s'] / batched['problems_per_s']:.2f}x (target >= 1)")
            same = sum(a == b for a, b in zip(vllm["texts"], batched["texts"], strict=True))
            print(f"  identical completions, vLLM vs batched HF: {same}/{len(texts)}")
    if vllm is not None and eager is not None:
        print(
            f"vLLM eager vs compiled: start-up {eager['startup']:.1f} s vs {vllm['startup']:.1f} s, generation "
            f"{eager['tokens_per_s'] / vllm['tokens_per_s']:.2f}x the compiled engine's tokens/s"
        )
        same = sum(a == b for a, b in zip(vllm["texts"], eager["texts"], strict=True))
        print(f"  identical completions, eager vs compiled: {same}/{len(texts)}")


if __name__ == "__main__":
    main()
