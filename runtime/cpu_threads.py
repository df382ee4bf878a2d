"""How many CPU threads a job process computes with, and how its idle threads wait (`job_thread_env`,
`apply_thread_count`).

A job process gets `OMP_NUM_THREADS` (and MKL's and OpenBLAS's: THREAD_VARS) set to the cores this
worker may use (`available_cores`: its CPU affinity, capped by its cgroup's CPU quota) divided by
the jobs it runs at once, or the operator's `worker.job_threads`; and `OMP_WAIT_POLICY=PASSIVE`. A
value the operator already set in the worker's environment is kept. Why: docs/how-jobs-run.md; what
it changes (bench/cpu_threads.py): docs/benchmarks.md."""

from __future__ import annotations

import math
import os
from pathlib import Path

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def available_cores(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use: its CPU affinity, capped by the cgroup's CPU quota
    (cgroup v2 `cpu.max`, or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), rounded up."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _cgroup_quota(cgroup_root)
    return max(1, min(cores, math.ceil(quota))) if quota else max(1, cores)


def _cgroup_quota(root: Path) -> float | None:
    try:
        text = (root / "cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def job_thread_env(
    environ: dict[str, str], slots: int, threads: int | None = None, cores: int | None = None
) -> dict[str, str]:
    """The variables a job process of a worker running `slots` jobs at once gets (`threads`: the
    operator's count; `cores`: this machine's, by default), less those `environ` already sets."""
    n = threads or max(1, (cores or available_cores()) // max(1, slots))
    wanted = {name: str(n) for name in THREAD_VARS} | {"OMP_WAIT_POLICY": "PASSIVE"}
    return {k: v for k, v in wanted.items() if k not in environ}


def apply_thread_count() -> int | None:
    """In the job process: size torch's pool to OMP_NUM_THREADS (a process forked from the fork
    server inherits the server's pool, sized before the job's environment reached it)."""
    value = os.environ.get("OMP_NUM_THREADS")
    if not value or not value.isdigit():
        return None
    import torch

    torch.set_num_threads(int(value))
    return int(value)
