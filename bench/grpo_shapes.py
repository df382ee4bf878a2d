"""One GRPO step at realistic shapes, as a GRPO job runs it (trainer.grpo.run_grpo, through
service.gpu_check.grpo_run: the same step figures, MFU and memory check as the acceptance run), on
models of published shapes with random weights: no download. The shapes' config files are in
bench/shapes/ (Qwen2.5-1.5B and Qwen2.5-7B as published).

The tokenizer is one token per character over the model's whole vocabulary, so a GSM8K prompt is
as many tokens as it has characters (prompts over `--prompt` tokens are dropped, as a job drops
them); a random model almost never samples its end-of-sequence token, so every completion is
`--completion` tokens long. Rewards are all 0 on random text, so the zero-advantage skip and
dynamic sampling are off: every completion goes through the training pass, as in a step where
every group has signal.

    python bench/grpo_shapes.py                                   # 1.5B full, then 7B LoRA (needs a GPU)
    python bench/grpo_shapes.py --runs qwen2.5-1.5b:full --completion 256 --steps 2 --hf-mode dynamic
    python bench/grpo_shapes.py --runs qwen2.5-1.5b:full --profile 2   # + where step 2's time goes
    python bench/grpo_shapes.py --runs qwen2.5-1.5b:full,qwen2.5-1.5b:full-overlap --steps 3   # overlap's gain

`--profile N` records step N with torch.profiler (bench/step_profile.py) and prints, for its
generation and its training pass, the device time and the top CUDA kernels (on a CPU: operators).

Each run is its own process, `--steps` steps (the first warms up kernels and is left out of the
medians). Prints a line per run and writes the figures as JSON (`--json`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ROOT / "bench" / "shapes"
sys.path.insert(0, str(ROOT))

from bench.step_profile import print_summary, profiled  # noqa: E402


def char_tokenizer(vocab: int) -> Any:
    """One token per printable character, the rest of the model's vocabulary as `<tN>` tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<eos>": 0, "<pad>": 1, "<unk>": 2}
    for ch in string.printable:
        words.setdefault(ch, len(words))
    for i in range(len(words), vocab):
        words[f"<t{i}>"] = i
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    return fast


def build_model(shape: str, work: Path) -> Path:
    """The shape's config with random weights (bf16, initialised on the GPU) and the tokenizer, saved
    where a job's model path can point."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = work / Path(shape).name
    config = AutoConfig.from_pretrained(SHAPES / shape if (SHAPES / shape).is_dir() else shape)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    char_tokenizer(config.vocab_size).save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return out


def job(model: Path, lora: bool, args: argparse.Namespace, overlap: bool = False) -> dict[str, Any]:
    return {
        "kind": "grpo",
        "model": str(model),
        "dataset": {"name": "gsm8k-train", "limit": 2000},
        "max_steps": args.steps,
        "learning_rate": 1e-6,
        "beta": 0.0,
        "num_generations": args.g,
        "global_batch_size": args.batch,
        "per_device_train_batch_size": args.micro,
        "max_prompt_length": args.prompt,
        "max_completion_length": args.completion,
        "rewards": [{"name": "accuracy"}],
        "skip_zero_advantage": False,
        "dynamic_sampling": False,
        "logging_steps": 1,
        "save_steps": 10**6,
        "sample_every": 10**6,
        "generation": {
            "backend": "hf",
            **({"hf_mode": args.hf_mode} if args.hf_mode else {}),
            **({"overlap": True} if overlap else {}),
        },
        **({"lora": {"enabled": True, "r": 16, "alpha": 32, "target_modules": "all-linear"}} if lora else {}),
    }


def one(run: str, args: argparse.Namespace) -> dict[str, Any]:
    """One shape in this process: build, run the job's steps, measure."""
    from service.gpu_check import _data_dir, environment, grpo_run

    shape, kind = run.rsplit(":", 1)
    overlap = kind.endswith("-overlap")  # the next step generated while this one trains (trainer/overlap.py)
    kind = kind.removesuffix("-overlap")
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    work = Path(tempfile.mkdtemp(prefix="grpo-shapes-"))
    try:
        t0 = time.monotonic()
        model = build_model(shape, work)
        built = time.monotonic() - t0
        env = environment(device)
        with contextlib.ExitStack() as stack:
            prof = stack.enter_context(profiled(args.profile)) if args.profile else None
            spec = job(model, kind == "lora", args, overlap)
            figures = grpo_run(spec, str(model), _data_dir(), work / "out", env, "hf")
        row = {"run": run, "build_seconds": round(built, 1), "gpu": (env.get("gpus") or [{}])[0], **figures}
        if prof is not None and prof.done:
            row["profile"] = prof.summary()
        return row
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--runs",
        default="qwen2.5-1.5b:full,qwen2.5-7b:lora",
        help="shape:full|lora, comma-separated; a '-overlap' suffix (full-overlap) turns generation.overlap on",
    )
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--g", type=int, default=8)
    p.add_argument("--batch", type=int, default=128, help="completions a step")
    p.add_argument("--micro", type=int, default=16, help="completions a micro-batch of the training pass")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--completion", type=int, default=1024)
    p.add_argument("--hf-mode", help="generation.hf_mode (default: the spec's 'auto')")
    p.add_argument("--profile", type=int, default=0, metavar="STEP", help="profile this step (0: none)")
    p.add_argument("--json", default="grpo-shapes.json")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args), default=str), flush=True)
        return
    from service.gpu_ranks import child_env

    results = []
    for run in args.runs.split(","):
        cmd = [sys.executable, __file__, "--one", run, *sys.argv[1:]]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=child_env())
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not lines:
            row: dict[str, Any] = {"run": run, "error": proc.stderr[-3000:]}
            print(f"{run}: FAILED ({proc.returncode})\n{proc.stderr[-3000:]}", flush=True)
        else:
            row = json.loads(lines[-1][len("RESULT ") :])
            plan = row.get("memory_plan") or {}
            print(
                f"{run}: step {row['step_seconds']}s (generation {row['generation_seconds']}s, training "
                f"{row['training_seconds']}s; generated beside training "
                f"{row.get('background_generation_seconds')}s); tokens/s/GPU trained "
                f"{row.get('trained_tokens_per_second_per_device')} "
                f"generated {row.get('generated_tokens_per_second_per_device')}; MFU step {row.get('mfu')}, "
                f"training pass {row.get('training_mfu')}; peak {row.get('peak_memory_gib')} GiB, plan "
                f"{plan.get('estimate_gib')} GiB",
                flush=True,
            )
            if row.get("profile"):
                print_summary(row["profile"])
        row["process_seconds"] = round(time.monotonic() - t0, 1)
        results.append(row)
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
