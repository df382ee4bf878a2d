"""An SFT job's training beside a busy neighbour, with and without the thread settings a worker now
gives its job processes (runtime/cpu_threads.py: OMP_NUM_THREADS = the worker's cores / its job
slots, OMP_WAIT_POLICY=PASSIVE). Each arm runs the job's code (trainer.sft.run_sft) for `--steps`
steps in a fresh process and prints its training wall time; the neighbour is another torch
process doing matrix products without pause (another job, a vLLM server, the embedded API's
work), started before the job and stopped after it.

    .venv/bin/python bench/cpu_threads.py                          # SmolLM2-135M-Instruct, 50 steps
    .venv/bin/python bench/cpu_threads.py --model tiny --steps 20 --arms alone,busy-default,busy-passive

Arms:
- `alone`: the job alone, as before (torch's defaults: a thread per core, libgomp's spinning waits);
- `busy-default`: beside the neighbour, both with torch's defaults (the slowdown seen before);
- `busy-job-env`: beside the neighbour, the job with a one-slot worker's settings (threads = all
  cores, passive waits), the neighbour with torch's defaults;
- `busy-both`: beside the neighbour, both with a two-slot worker's settings (each half the cores,
  passive waits): two jobs of one worker.
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

from runtime.cpu_threads import THREAD_VARS, available_cores, job_thread_env  # noqa: E402

NEIGHBOUR = """
import time, torch
a = torch.randn(768, 768); b = torch.randn(768, 768)
while True:
    a @ b
"""


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (*THREAD_VARS, "OMP_WAIT_POLICY")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def arm_envs(arm: str, cores: int) -> tuple[dict[str, str], dict[str, str] | None]:
    """(the job's environment, the neighbour's or None)."""
    base = clean_env()
    if arm == "alone":
        return base, None
    if arm == "busy-default":
        return base, base
    if arm == "busy-job-env":
        return {**base, **job_thread_env(base, slots=1, cores=cores)}, base
    if arm == "busy-both":
        two = {**base, **job_thread_env(base, slots=2, cores=cores)}
        return two, two
    raise SystemExit(f"unknown arm {arm}")


def job(model: str, steps: int) -> None:
    """In the child: the SFT job's code, `steps` steps; prints the training seconds."""
    from kinds import resolve_config
    from mathrl.paths import default_data_dir
    from mathrl.specs import parse_spec
    from mathrl.specs.resolved import ResolvedSFT
    from runtime.cpu_threads import apply_thread_count
    from runtime.sink import PrintSink
    from trainer.sft import run_sft

    threads = apply_thread_count()
    spec = parse_spec(
        {
            "kind": "sft",
            "model": model,
            "dataset": {"name": "add2-words-train", "limit": 400},
            "max_steps": steps,
            "learning_rate": 1e-5,
            "per_device_train_batch_size": 4,
            "max_length": 64,
            "logging_steps": 10,
            "save_steps": 10**6,
            "seed": 7,
        }
    )
    with tempfile.TemporaryDirectory() as out:
        result = run_sft(spec, resolve_config(spec).of(ResolvedSFT), PrintSink(), model_path=model,
                         data_dir=default_data_dir(), out_dir=Path(out))  # fmt: skip
    import torch

    print(
        "RESULT "
        + json.dumps({"train_seconds": result["train_seconds"], "threads": threads or torch.get_num_threads()})
    )


def model_path(name: str, work: Path) -> str:
    if name == "tiny":
        from trainer.tiny import build_tiny_model

        return str(build_tiny_model(work / "tiny", chat=True))
    if name == "smollm2":
        from evaluator.models import cache_smollm2

        home = Path(os.environ.get("MATHRL_HOME", ".mathrl"))
        return str(cache_smollm2(home / "models" / "SmolLM2-135M-Instruct").resolve())
    return name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="smollm2, tiny or a model directory")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--arms", default="alone,busy-default,busy-job-env,busy-both")
    p.add_argument("--job", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.job:
        job(args.job, args.steps)
        return
    cores = available_cores()
    with tempfile.TemporaryDirectory() as tmp:
        model = model_path(args.model, Path(tmp))
        print(f"{cores} cores; SFT on {args.model}, {args.steps} steps of 4 rows", flush=True)
        results: dict[str, float] = {}
        for arm in args.arms.split(","):
            job_env, neighbour_env = arm_envs(arm, cores)
            neighbour = None
            if neighbour_env is not None:
                neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], env=neighbour_env)
                time.sleep(5)  # its imports done: it is computing when the job starts
            try:
                t0 = time.monotonic()
                proc = subprocess.run(
                    [sys.executable, __file__, "--job", model, "--steps", str(args.steps)],
                    env=job_env, capture_output=True, text=True, timeout=3600,
                )  # fmt: skip
                wall = time.monotonic() - t0
            finally:
                if neighbour is not None:
                    neighbour.kill()
                    neighbour.wait()
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not line:
                print(f"  {arm}: FAILED\n{proc.stderr[-2000:]}", flush=True)
                continue
            r = json.loads(line[-1][7:])
            results[arm] = r["train_seconds"]
            print(
                f"  {arm:<13} training {r['train_seconds']:.1f}s for {args.steps} steps ({r['threads']} threads; "
                f"process {wall:.1f}s)",
                flush=True,
            )
        if "alone" in results:
            for arm, seconds in results.items():
                print(f"  {arm:<13} {seconds / results['alone']:.2f}x alone", flush=True)


if __name__ == "__main__":
    main()
