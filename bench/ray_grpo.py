"""Per-step time of one GRPO job on Ray Train workers against the local paths, side by side in
one run, so the Ray overhead is a number: the same job (model, G=8, a global batch of 32
completions, steps) run through the embedded service as

  local, 1 process           (resources: {})
  local, 2 processes         (resources.processes=2: accelerate launch, gloo)
  Ray, 1 worker              (a pool the service runs on Ray)
  Ray, 2 workers on 2 nodes  (resources.nodes=2)

on a 2-node Ray cluster started here (ray.cluster_utils.Cluster, 1 CPU each: each rank gets one
core, like the local 2-process run's torchrun ranks).

    .venv/bin/python bench/ray_grpo.py [--steps 20] [--model tiny|smollm2|PATH] [--completion-length 16]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--completion-length", type=int, default=16)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]

    import httpx
    from ray.cluster_utils import Cluster

    from mathrl.client import Client
    from service.embedded import demo_key, embedded_env, embedded_service, prepare_model

    work = Path(tempfile.mkdtemp(prefix="mathrl-bench-ray-"))
    model_path = prepare_model(args.model, work)
    home = work / "svc"
    database = embedded_env(home)["MATHRL_DATABASE__URL"]
    port = _free_port()
    t0 = time.monotonic()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": True,
            "dashboard_port": port,
            "env_vars": {"MATHRL_DATABASE__URL": database},
        },
    )
    cluster.add_node(num_cpus=1, env_vars={"MATHRL_DATABASE__URL": database})
    address = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(f"{address}/api/version", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    print(f"2-node Ray cluster up in {time.monotonic() - t0:.1f}s")
    ray_env = {
        "MATHRL_RAY__ADDRESS": address,
        "MATHRL_RAY__POOLS": json.dumps(["ray-1"]),
        "MATHRL_RAY__PYTHON": sys.executable,
    }
    body: dict[str, Any] = {
        "kind": "grpo",
        "model": model_path,
        "dataset": {"name": "arith", "split": "train", "limit": 5000},
        "max_steps": args.steps,
        "num_generations": 8,
        "global_batch_size": 32,
        "max_completion_length": args.completion_length,
        "learning_rate": 1e-5,
        "logging_steps": 1,
        "save_steps": 10**6,
        "sample_every": 10,
        "rewards": [{"name": "accuracy"}, {"name": "format", "weight": 0.1}],
    }
    runs = [
        ("local, 1 process", {"per_device_train_batch_size": 32, "resources": {}}),
        ("local, 2 processes (accelerate)", {"per_device_train_batch_size": 16, "resources": {"processes": 2}}),
        ("Ray, 1 worker", {"per_device_train_batch_size": 32, "resources": {"pool": "ray-1"}}),
        ("Ray, 2 workers on 2 nodes", {"per_device_train_batch_size": 16, "resources": {"nodes": 2}}),
    ]
    roots = [str(Path(model_path).resolve().parent)]
    skip = max(1, args.steps // 10)  # the first steps warm caches
    results: dict[str, tuple[float, float, float]] = {}
    print(f"GRPO, model {Path(model_path).name}, G=8, 32 completions a step, {args.steps} steps, CPU")
    try:
        with embedded_service(home, 0, roots, queues="cpu,ray,ray-1", extra_env=ray_env) as (url, env):
            client = Client(url, api_key=demo_key(env))
            for name, over in runs:
                t1 = time.monotonic()
                job = client.jobs.create({**body, **over})
                done = client.jobs.wait(job.id, timeout=3600, poll=0.5)
                wall = time.monotonic() - t1
                assert done.status == "succeeded", (name, done.error)
                series = {m.name: m for m in client.jobs.metrics(job.id)}
                steps = [p.value for p in series["step_time"].points][skip:]
                made = {p.value for p in series["completions_per_step"].points}
                results[name] = (statistics.median(steps), statistics.mean(steps), wall)
                print(
                    f"  {name:34s} per-step median {statistics.median(steps) * 1000:8.1f} ms   mean "
                    f"{statistics.mean(steps) * 1000:8.1f} ms   completions/step {sorted(made)}   "
                    f"job wall {wall:6.1f} s"
                )
    finally:
        cluster.shutdown()
    one, two = results["local, 1 process"][0], results["local, 2 processes (accelerate)"][0]
    r1, r2 = results["Ray, 1 worker"][0], results["Ray, 2 workers on 2 nodes"][0]
    print(f"Ray 1 worker / local 1 process:            {r1 / one:.3f}")
    print(f"Ray 2 workers / local 2 processes:         {r2 / two:.3f}")
    extra = results["Ray, 2 workers on 2 nodes"][2] - results["local, 2 processes (accelerate)"][2]
    print(f"job wall, Ray 2 workers - local 2 processes: {extra:+.1f} s (submission, Ray Train's worker group)")


if __name__ == "__main__":
    main()
