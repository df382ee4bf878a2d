"""The GPU acceptance run's data-parallel check (service/gpu_check.py): the same SFT job on one rank
and on N (torchrun; one process per GPU, or gloo on the CPU), their losses compared, and GRPO's step
on N ranks. Each rank runs the job's own code (`rank_main`, started as `service.gpu_check --rank-job`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from runtime.processes import is_main
from service.gpu_figures import RecordSink, step_figures

if TYPE_CHECKING:
    from mathrl.specs import GRPOSpec, SFTSpec

ROOT = Path(__file__).resolve().parent.parent  # the checkout the ranks import


SFT_STEPS = 10


def sft_job(model: str, per_device: int) -> dict[str, Any]:
    """SFT on the example's task with one global batch of 16 whatever the ranks: one rank with
    16 rows, or two with 8 each, see the same rows in each step and should log the same losses."""
    return {
        "kind": "sft",
        "model": model,
        "dataset": {"name": "add2-words-train", "limit": 400},
        "max_steps": SFT_STEPS,
        "learning_rate": 1e-5,
        "per_device_train_batch_size": per_device,
        "max_length": 128,
        "logging_steps": 1,
        "save_steps": 10**6,
        "seed": 7,
    }


def rank_main(kind: str, job: str, log: str) -> None:
    """One rank of a data-parallel run (started by torchrun): runs the job's code, rank 0 writes
    the logged metrics to `log` as JSON."""
    from kinds import resolve_config
    from mathrl.paths import default_data_dir
    from mathrl.specs import parse_spec
    from mathrl.specs.resolved import ResolvedGRPO, ResolvedSFT

    spec = cast("SFTSpec | GRPOSpec", parse_spec(json.loads(job)))  # an SFT or a GRPO job, as kind says
    sink = RecordSink(echo=False)
    out = Path(log).with_suffix(".out")
    model = spec.model
    data_dir = default_data_dir()
    t0 = time.monotonic()
    if kind == "sft":
        from trainer.sft import run_sft

        sft = cast("SFTSpec", spec)
        run_sft(sft, resolve_config(sft).of(ResolvedSFT), sink, model_path=model, data_dir=data_dir, out_dir=out)
    else:
        from trainer.grpo import run_grpo

        grpo = cast("GRPOSpec", spec)
        run_grpo(grpo, resolve_config(grpo).of(ResolvedGRPO), sink, model_path=model, data_dir=data_dir, out_dir=out)
    if is_main():
        Path(log).write_text(
            json.dumps({"metrics": sink.metrics_by_step, "seconds": time.monotonic() - t0}, default=float)
        )


def child_env() -> dict[str, str]:
    """This process's environment for a child that imports the checkout: ROOT first on PYTHONPATH,
    the rest kept (an offline bundle's site directory, docs/gpu.md)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def ranks_run(kind: str, job: dict[str, Any], ranks: int, work: Path) -> dict[str, Any]:
    """The job on `ranks` data-parallel processes (torchrun; one per GPU, or gloo on the CPU)."""
    log = work / f"{kind}-{ranks}.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={ranks}",
        "-m",
        "service.gpu_check",
        "--rank-job",
        kind,
        json.dumps(job),
        str(log),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=child_env())
    if proc.returncode != 0 or not log.exists():
        raise RuntimeError(f"{kind} on {ranks} ranks failed ({proc.returncode}): {proc.stderr[-3000:]}")
    data = json.loads(log.read_text())
    return {"metrics": {int(k): v for k, v in data["metrics"].items()}, "seconds": data["seconds"]}


def data_parallel(model: str, grpo: dict[str, Any], work: Path, ranks: int) -> dict[str, Any]:
    """SFT on 1 rank (batch 16) and `ranks` ranks (16 / ranks each): worst relative difference of
    the logged losses; GRPO's step on `ranks` ranks."""
    one = ranks_run("sft", sft_job(model, 16), 1, work)
    many = ranks_run("sft", sft_job(model, 16 // ranks), ranks, work)
    a = {s: v["loss"] for s, v in one["metrics"].items() if "loss" in v}
    b = {s: v["loss"] for s, v in many["metrics"].items() if "loss" in v}
    common = sorted(set(a) & set(b))
    worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in common) if common else None
    g = ranks_run("grpo", {**grpo, "max_steps": 4}, ranks, work)
    sink = RecordSink(echo=False)
    sink.metrics_by_step = g["metrics"]
    return {
        "ranks": ranks,
        "sft_losses_one_rank": [round(a[s], 5) for s in common],
        "sft_losses_ranks": [round(b[s], 5) for s in common],
        "sft_worst_relative_loss_difference": worst,
        "grpo": step_figures(sink, steps=4, world=ranks),
    }
