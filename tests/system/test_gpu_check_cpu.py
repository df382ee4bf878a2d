"""`scripts/gpu-check --device cpu` end to end (its pure parts: tests/unit/service/test_gpu_check.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.env import ROOT


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHON"] = sys.executable
    return env


@pytest.mark.slow
def test_gpu_check_runs_the_job_code_on_cpu_and_its_floor_can_fail(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    cmd = [
        str(ROOT / "scripts" / "gpu-check"),
        "--device=cpu",
        "--steps=3",
        "--heldout=4",
        "--eval-tokens=16",
        "--min-gain=101",
        f"--work={tmp_path / 'work'}",
        f"--out={out}",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=_env())
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["passed"] is False
    assert any("--min-gain 101" in f for f in report["failures"]), report["failures"]
    assert "FAILED" in proc.stdout and "verdict" in proc.stdout  # the table
    env = report["environment"]
    assert env["device"] == "cpu" and env["torch"] and env["peak_tflops"] > 0 and "measured" in env["peak_source"]
    assert set(env["engines"]) == {"vllm", "flash_attn"}
    assert report["model"]["name"] == "tiny" and report["model"]["params"] > 0
    assert report["before"]["n"] == 4
    (run,) = report["runs"]  # hf only: vLLM runs on a GPU
    assert run["backend"] == "hf" and run["steps"] == 3
    assert run["step_seconds"] > 0 and 0 < run["generation_share"] < 1
    assert run["trained_tokens_per_step"] > 0 and run["generated_tokens_per_step"] > 0
    assert 0 < run["mfu"] < 1
    assert run["after"]["n"] == 4 and isinstance(run["gain_points"], float)
    assert run["memory_plan"]["estimate_gib"] > 0
    assert "skipped" in report["data_parallel"]
    # the floor is stated; the code's commit and vLLM's CPU build are recorded
    assert report["min_gain"] == 101 and "a gain of +101.0 points (--min-gain)" in proc.stdout
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:  # a checkout (CI's is one)
        assert env["mathrl_commit"].startswith(head.stdout.strip())
    assert env["packages"]["vllm"].endswith("(cpu build)")
    assert (tmp_path / "work").is_dir()  # --work is kept
    print(f"\ngpu-check --device cpu: {report['seconds']}s, step {run['step_seconds']}s, MFU {run['mfu']}")
