"""A job process's CPU threads (runtime/cpu_threads.py): the worker's cores, capped by its cgroup's
CPU quota, divided by the jobs it runs at once; idle threads sleep; the operator's values win."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.cpu_threads import available_cores, job_thread_env
from tests.helpers.env import ROOT

pytestmark = pytest.mark.quick


def test_cores_are_the_affinity_capped_by_the_cgroup_quota(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    assert available_cores(tmp_path) == affinity  # no cgroup files: the affinity
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cores(tmp_path) == affinity  # no quota
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a core (a pod's limit of 500m)
    assert available_cores(tmp_path) == 1
    (tmp_path / "cpu.max").write_text(f"{(affinity + 3) * 100000} 100000\n")  # more than it has
    assert available_cores(tmp_path) == affinity
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()  # cgroup v1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("150000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert available_cores(tmp_path) == min(affinity, 2)


def test_a_jobs_share_of_the_cores_and_a_passive_wait() -> None:
    env = job_thread_env({}, slots=2, cores=8)
    assert env == {
        "OMP_NUM_THREADS": "4",
        "MKL_NUM_THREADS": "4",
        "OPENBLAS_NUM_THREADS": "4",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    assert job_thread_env({}, slots=4, cores=2)["OMP_NUM_THREADS"] == "1"  # at least one
    assert job_thread_env({}, slots=1, threads=3, cores=8)["OMP_NUM_THREADS"] == "3"  # worker.job_threads
    kept = job_thread_env({"OMP_NUM_THREADS": "6", "OMP_WAIT_POLICY": "ACTIVE"}, slots=1, cores=8)
    assert "OMP_NUM_THREADS" not in kept and "OMP_WAIT_POLICY" not in kept  # the operator's own
    assert kept["MKL_NUM_THREADS"] == "8"


def test_the_job_process_sizes_torchs_pool_from_its_environment() -> None:
    code = (
        "from runtime.cpu_threads import apply_thread_count; import torch; "
        "print(apply_thread_count(), torch.get_num_threads())"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1"]


def test_the_worker_command_tells_its_jobs_how_many_run_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from config.settings import Settings
    from service import cli

    seen: list[list[str]] = []
    monkeypatch.setenv("MATHRL_WORKER__JOB_SLOTS", "0")  # recorded, so the test's value goes again
    monkeypatch.delenv("MATHRL_WORKER__JOB_SLOTS")
    monkeypatch.setattr(os, "execv", lambda exe, cmd: seen.append(cmd))
    cli.worker(queues="cpu", concurrency=3, hostname="")
    assert seen and "3" in seen[0]
    assert os.environ["MATHRL_WORKER__JOB_SLOTS"] == "3"
    assert Settings().worker.job_slots == 3
