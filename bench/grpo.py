"""GRPO step time by generation mode, side by side in one run: HF `generate`, vLLM colocated,
vLLM server (LoRA adapter sync) and async GRPO (LoRA, on the server), on the same model, prompts,
group size and lengths. Each mode runs in its own process, one after the other, through the code
a GRPO job runs (`trainer.grpo.run_grpo`, and the worker's `worker.vllm_server.start_server` for
the server modes), and reports the per-step metrics a job stores (trainer/callbacks.py).

Prints per step: generation, weight sync and the rest, generated tokens/s, the generation share;
and the ratios against HF. The first step of each mode is a warm-up (vLLM compiles per shape)
and is left out; start-up (model load, engine or server start) is printed apart.

    .venv/bin/python bench/grpo.py --model .mathrl/models/SmolLM2-135M-Instruct
    .venv/bin/python bench/grpo.py --model PATH --completions 32 --generations 8 --max-new-tokens 128 --steps 4

Issue 14's target on a 2-core CPU: generation per step >= 1.5x faster with vLLM (colocated) than
with HF. Server and async train a LoRA adapter (the only weight sync a CPU server has: full
weights go over NCCL), HF and colocated train every weight; their rest-of-step differs for that.
Async overlaps generation with training, so it has no generation share: compare its step time.
It is not in the default modes: on a 2-core CPU its rollout worker keeps both cores generating and
starves the trainer (557 s for its first step against 114.5 s for a sync server step, measured
side by side with `--modes server,async`); async pays off where generation and training have
separate devices.

`hf-nockpt` and `vllm-nockpt` are those modes with gradient_checkpointing off (TRL's default is
on): `--modes vllm,vllm-nockpt` prints what checkpointing costs a step, and the trainer's peak
memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODES = {  # mode -> the spec fields that pick it
    "hf": {"generation": {"backend": "hf"}},
    "hf-nockpt": {"generation": {"backend": "hf"}, "gradient_checkpointing": False},
    # the next step's batch generated while this one trains (trainer/overlap.py)
    "hf-overlap": {"generation": {"backend": "hf", "overlap": True}},
    # a fixed-size cache and the decode step compiled (CUDA graphs on a GPU), without and with overlap
    "hf-static": {"generation": {"backend": "hf", "hf_mode": "static"}},
    "hf-static-overlap": {"generation": {"backend": "hf", "hf_mode": "static", "overlap": True}},
    "vllm": {"generation": {"backend": "vllm", "mode": "colocate"}},
    "vllm-nockpt": {"generation": {"backend": "vllm", "mode": "colocate"}, "gradient_checkpointing": False},
    "server": {"generation": {"backend": "vllm", "mode": "server"}, "lora": {"r": 8}},
    "async": {"generation": {"backend": "vllm", "mode": "server"}, "lora": {"r": 8}, "algorithm": "async"},
}


class MetricsSink:
    """Keeps what a job would store; prints nothing."""

    def __init__(self) -> None:
        self.points: dict[int, dict[str, float]] = {}

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.points.setdefault(step, {}).update(values)

    def event(self, *a: Any, **k: Any) -> None: ...
    def progress(self, *a: Any, **k: Any) -> None: ...
    def samples(self, *a: Any, **k: Any) -> None: ...
    def checkpoint(self, *a: Any, **k: Any) -> None: ...
    def score(self, *a: Any, **k: Any) -> None: ...
    def endpoint(self, *a: Any, **k: Any) -> None: ...
    def should_stop(self, fresh: bool = False) -> bool:
        return False

    def draining(self) -> bool:
        return False


def spec_for(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "kind": "grpo",
        "model": args.model,
        "dataset": {"name": "add2-words-train", "limit": 4000},
        "max_steps": args.steps,
        "learning_rate": 1e-5,
        "num_generations": args.generations,
        "per_device_train_batch_size": args.completions,
        "max_completion_length": args.max_new_tokens,
        "rewards": [{"name": "accuracy"}],
        "logging_steps": 1,
        "save_steps": 10_000,
        "sample_every": 10_000,
        "seed": 0,
        **({} if mode == "async" else {"beta": 0.0}),  # async GRPO has no KL term to turn off
        **MODES[mode],
    }


def one_run(mode: str, args: argparse.Namespace) -> None:
    """Child process: one mode through run_grpo; prints the stored metrics as JSON."""
    from kinds import resolve_config
    from mathrl.specs import parse_spec
    from trainer.grpo import run_grpo
    from worker.vllm_server import needs_server, start_server

    spec = parse_spec(spec_for(mode, args))
    config = resolve_config(spec)
    out = Path(tempfile.mkdtemp(prefix=f"bench-grpo-{mode}-"))
    sink = MetricsSink()
    t0 = time.perf_counter()
    server = None
    if needs_server(spec):
        server, env = start_server(spec, config, args.model, out / "server.log", None, [])
        os.environ.update(env)
    try:
        run_grpo(
            spec,
            config,
            sink,
            model_path=args.model,
            data_dir=None,
            out_dir=out / "train",  # type: ignore[arg-type]
            vllm_server_url=server.url if server else None,
        )
    finally:
        if server is not None:
            server.stop()
    total = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux: the trainer's process
    result = {"mode": mode, "total": total, "steps": sink.points, "peak_rss_gib": peak}
    print("RESULT " + json.dumps(result), flush=True)


def run(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--one",
        mode,
        "--model",
        args.model,
        "--completions",
        str(args.completions),
        "--generations",
        str(args.generations),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--steps",
        str(args.steps),
    ]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{mode} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(line[7:])
    return result


def summary(result: dict[str, Any]) -> dict[str, float]:
    steps = [v for _, v in sorted(result["steps"].items(), key=lambda kv: int(kv[0])) if "step_time" in v]
    warm = steps[1:] or steps
    mean = lambda key: sum(s.get(key, 0.0) for s in warm) / len(warm)  # noqa: E731
    step, gen, sync = mean("step_time"), mean("generation_seconds"), mean("weight_sync_seconds")
    return {
        "step": step,
        "generation": gen,
        "sync": sync,
        "rest": step - gen - sync,
        "tokens_per_s": mean("generation_tokens_per_second"),
        "background": mean("background_generation_seconds"),
        "share": gen / step if step else 0.0,
        "startup": result["total"] - sum(s["step_time"] for s in steps),
        "steps": len(steps),
        "peak_rss_gib": result["peak_rss_gib"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--completions", type=int, default=32, help="completions per step")
    ap.add_argument("--generations", type=int, default=8, help="group size G")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per mode (the first is a warm-up)")
    ap.add_argument(
        "--modes",
        default="hf,vllm,server",
        help=f"comma-separated, of {', '.join(MODES)} (async: see above; slow on a small CPU)",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.model = str(Path(args.model).resolve())
    if args.one:
        return one_run(args.one, args)

    print(
        f"GRPO step bench: {Path(args.model).name}, {args.completions} completions/step (G={args.generations}), "
        f"max {args.max_new_tokens} new tokens, {args.steps} steps (first left out), {os.cpu_count()} CPU cores",
        flush=True,
    )
    rows: dict[str, dict[str, float]] = {}
    for mode in args.modes.split(","):
        rows[mode] = s = summary(run(mode, args))
        if mode == "async":
            print(
                f"  {mode:<6} step {s['step']:6.1f}s (generation overlapped with training); "
                f"start-up {s['startup']:.0f}s",
                flush=True,
            )
        else:
            beside = f"; the batch generated beside training in {s['background']:.1f}s" if s["background"] else ""
            print(
                f"  {mode:<6} step {s['step']:6.1f}s = {'waiting for ' if beside else ''}generation "
                f"{s['generation']:6.1f}s + weight sync "
                f"{s['sync']:4.1f}s + rest {s['rest']:5.1f}s; {s['tokens_per_s']:6.1f} generated tokens/s; "
                f"generation share {100 * s['share']:.0f}%; start-up {s['startup']:.0f}s; "
                f"trainer's peak memory {s['peak_rss_gib']:.1f} GiB{beside}",
                flush=True,
            )
    for mode, s in rows.items():  # gradient checkpointing off against on, the same mode otherwise
        base = rows.get(mode.removesuffix("-nockpt")) if mode.endswith("-nockpt") else None
        if base:
            print(
                f"{mode} vs {mode.removesuffix('-nockpt')}: rest of step (forward, backward, update) "
                f"{base['rest'] / s['rest']:.2f}x faster, whole step {base['step'] / s['step']:.2f}x faster"
            )
    hf = rows.get("hf")
    if hf:
        for mode, s in rows.items():
            if mode == "hf":
                continue
            gen = (
                f"generation per step {hf['generation'] / s['generation']:.2f}x faster, "
                if s["generation"] and not s["background"]
                else ""
            )
            print(f"{mode} vs hf: {gen}whole step {hf['step'] / s['step']:.2f}x faster")
    if "vllm" in rows and hf:
        ratio = hf["generation"] / rows["vllm"]["generation"]
        print(
            f"target: vLLM colocated generation >= 1.5x HF per step: {ratio:.2f}x "
            f"({'met' if ratio >= 1.5 else 'NOT met'})"
        )
    if "server" in rows and "async" in rows:
        print(f"async vs server (both LoRA): whole step {rows['server']['step'] / rows['async']['step']:.2f}x faster")


if __name__ == "__main__":
    main()
