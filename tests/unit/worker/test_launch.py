"""Multi-process training jobs: the command a job is launched with (accelerate launch, DeepSpeed,
one process per GPU); the 2-process CPU jobs through the real service are
tests/system/test_multiprocess_jobs.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from mathrl.specs import parse_spec
from tests.helpers.jobs import grpo, sft
from worker.attempt import AttemptDir
from worker.launch import describe, job_command, job_exit_code


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
    from mathrl.specs.presets import resolve_grpo

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
