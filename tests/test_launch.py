"""Multi-process training jobs: the command a job is launched with, and 2-process CPU jobs
(accelerate launch, torchrun, gloo DDP) through the real service."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select

from mathrl.specs import parse_spec
from store.db import session_scope
from store.models import Metric, Sample
from tests.conftest import Service, wait_for
from worker.attempt import AttemptDir
from worker.launch import describe, job_command, job_exit_code

ARITH = {"name": "arith-train"}


def grpo(**over: Any) -> dict[str, Any]:
    return {
        "kind": "grpo",
        "model": "org/m",
        "dataset": ARITH,
        "max_steps": 4,
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_completion_length": 6,
        "logging_steps": 1,
        "save_steps": 2,
        "learning_rate": 1e-4,
        "sample_every": 2,
        **over,
    }


def sft(**over: Any) -> dict[str, Any]:
    return {
        "kind": "sft",
        "model": "tiny:2x64",
        "dataset": {**ARITH, "limit": 500},
        "max_steps": 20,
        "learning_rate": 1e-3,
        "per_device_train_batch_size": 16,
        "max_length": 32,
        "logging_steps": 2,
        "save_steps": 10,
        **over,
    }


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


# ---- the command -------------------------------------------------------------------------


@pytest.mark.quick
def test_four_gpu_job_is_launched_with_four_processes() -> None:
    cmd = job_command(parse_spec(grpo(resources={"gpus": 4})), "j1", "w1", 1, have_deepspeed=False)
    assert cmd[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert flag(cmd, "--num_processes") == "4" and flag(cmd, "--num_machines") == "1"
    assert "--multi_gpu" in cmd and flag(cmd, "--mixed_precision") == "bf16" and "--use_deepspeed" not in cmd
    assert cmd[-5:] == ["-m", "worker.child", "j1", "w1", "1"]
    assert describe(cmd) == "4 processes (accelerate launch, DDP)"


@pytest.mark.quick
def test_zero3_job_is_launched_with_deepspeed_stage_3() -> None:
    spec = parse_spec(grpo(resources={"gpus": 4}, deepspeed_zero3=True))
    cmd = job_command(spec, "j1", "w1", 1, have_deepspeed=True)
    assert "--use_deepspeed" in cmd and "--multi_gpu" not in cmd
    assert flag(cmd, "--zero_stage") == "3" and flag(cmd, "--zero3_init_flag") == "true"
    assert flag(cmd, "--zero3_save_16bit_model") == "true" and flag(cmd, "--offload_param_device") == "none"
    assert flag(cmd, "--num_processes") == "4" and cmd[-5:] == ["-m", "worker.child", "j1", "w1", "1"]
    # no DeepSpeed on the worker: launched without it, and every rank fails with the reason
    assert "--use_deepspeed" not in job_command(spec, "j1", "w1", 1, have_deepspeed=False)


@pytest.mark.quick
@pytest.mark.parametrize(
    "spec",
    [
        grpo(),
        grpo(resources={"gpus": 1}),
        sft(),
        {"kind": "eval", "model": "org/m", "resources": {"gpus": 2}},  # eval is one process (vLLM shards itself)
    ],
)
def test_single_process_jobs_run_the_plain_job_process(spec: dict[str, Any]) -> None:
    assert job_command(parse_spec(spec), "j1", "w1", 1) == [sys.executable, "-m", "worker.child", "j1", "w1", "1"]


@pytest.mark.quick
def test_cpu_processes_use_torchrun_with_the_cores_shared() -> None:
    cmd = job_command(parse_spec(sft(resources={"processes": 2})), "j1", "w1", 1, cpu_count=8)
    assert flag(cmd, "--num_processes") == "2" and flag(cmd, "--num_cpu_threads_per_process") == "4"
    assert flag(cmd, "--mixed_precision") == "no"
    assert describe(cmd) == "2 processes (accelerate launch, CPU, gloo)"


@pytest.mark.quick
@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        (sft(resources={"gpus": 2, "processes": 4}), "processes", "set processes=2"),
        ({"kind": "eval", "model": "org/m", "resources": {"processes": 2}}, "resources", "training jobs"),
        (sft(resources={"processes": 0}), "processes", "greater than or equal to 1"),
    ],
)
def test_bad_process_counts_name_the_field(spec: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ValidationError) as e:
        parse_spec(spec)
    assert words in str(e.value) and field in str(e.value)


@pytest.mark.quick
def test_global_batch_counts_every_process() -> None:
    from mathrl.presets import resolve_grpo

    config = resolve_grpo(parse_spec(grpo(resources={"processes": 2}, global_batch_size=32)))
    assert config["world_size"] == 2 and config["gradient_accumulation_steps"] == 2


@pytest.mark.quick
def test_exit_code_and_error_of_a_multi_process_job(tmp_path: Path) -> None:
    assert job_exit_code(0, tmp_path) == 0 and job_exit_code(1, tmp_path) == 1
    (tmp_path / "exit-code").write_text("2")  # the main rank stopped on request; the launcher says 1
    assert job_exit_code(1, tmp_path) == 2 and job_exit_code(-9, tmp_path) == -9
    (tmp_path / "exit-code").write_text("0")  # the main rank finished, another rank failed
    assert job_exit_code(1, tmp_path) == 1
    (tmp_path / "error-rank-1.txt").write_text("RuntimeError: boom")
    assert AttemptDir(tmp_path).read_error() == "rank 1: RuntimeError: boom"
    (tmp_path / "error.txt").write_text("ValueError: main")
    assert AttemptDir(tmp_path).read_error() == "ValueError: main"


# ---- through the service -------------------------------------------------------------------


def job_processes(job_id: str) -> list[int]:
    """Every process on this machine running a part of the job (launcher or rank)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                args = (d / "cmdline").read_bytes().split(b"\0")
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if job_id.encode() in args and state != "Z":
                pids.append(int(d.name))
    return pids


def assert_stored_once(db_url: str, job_id: str, events: list[Any]) -> None:
    for kind in ("started", "training", "trained", "final"):
        assert [e.type for e in events].count(kind) == 1, kind
    launched = [e for e in events if e.type == "launched"]
    assert len(launched) == 1 and launched[0].data["processes"] == 2
    assert "launched 2 processes" in launched[0].message
    assert next(e for e in events if e.type == "started").data["processes"] == 2  # the DDP world formed
    with session_scope(db_url) as s:
        per_step = s.execute(
            select(Metric.step, func.count())
            .where(Metric.job_id == job_id, Metric.name == "loss")
            .group_by(Metric.step)
        ).all()
        samples = s.execute(
            select(Sample.step, func.count()).where(Sample.job_id == job_id).group_by(Sample.step)
        ).all()
    assert per_step and all(n == 1 for _, n in per_step)
    assert all(n <= 8 for _, n in samples), samples  # one rank's samples per step, not two


@pytest.mark.slow
def test_two_process_sft_and_grpo_jobs_train_once(service: Service, tiny_model: str, db_url: str) -> None:
    c = service.client()
    t0 = time.monotonic()
    job = c.jobs.create(sft(resources={"processes": 2}))
    done = c.jobs.wait(job.id, timeout=240)
    assert done.status == "succeeded", done.error
    sft_seconds = time.monotonic() - t0
    events = c.jobs.events(job.id)
    assert_stored_once(db_url, job.id, events)
    with session_scope(db_url) as s:
        steps = s.scalars(select(Metric.step).where(Metric.job_id == job.id, Metric.name == "loss")).all()
    assert sorted(steps) == list(range(2, 21, 2))
    assert not job_processes(job.id)

    t0 = time.monotonic()
    job = c.jobs.create(grpo(model=tiny_model, dataset={**ARITH, "limit": 200}, resources={"processes": 2}))
    done = c.jobs.wait(job.id, timeout=240)
    assert done.status == "succeeded", done.error
    events = c.jobs.events(job.id)
    assert_stored_once(db_url, job.id, events)
    print(f"2-process sft 20 steps: {sft_seconds:.1f}s, grpo 4 steps: {time.monotonic() - t0:.1f}s")


@pytest.mark.slow
def test_cancel_stops_every_rank(service: Service) -> None:
    c = service.client()
    job = c.jobs.create(sft(max_steps=100_000, logging_steps=1000, save_steps=100_000, resources={"processes": 2}))
    wait_for(lambda: any(e.type == "training" for e in c.jobs.events(job.id)), 180, 0.5, "training to start")
    running = job_processes(job.id)
    assert len(running) >= 3, running  # the launcher and two ranks
    assert c.jobs.cancel(job.id).cancel_requested
    done = c.jobs.wait(job.id, timeout=60, poll=0.2)
    assert done.status == "cancelled", done.error
    wait_for(lambda: not job_processes(job.id), 10, what="every process of the job to exit")
    # the ranks stopped together between steps (not killed after the grace period): rank 0 said so
    exit_code = Path(service.env["MATHRL_ARTIFACT_DIR"]) / "jobs" / job.id / "attempt-1" / "exit-code"
    assert exit_code.read_text() == "2"
