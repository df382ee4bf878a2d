"""scripts/gpu-check, the GPU acceptance run, in its CPU form (`--device cpu`, the tiny model):
the suite runs it so the script cannot rot between the rare runs on a GPU. The floor on the
held-out gain is set out of reach here, so the run must end in exit status 1 with that failure
named, after every figure of the report was measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from service.gpu_check import mfu
from tests.conftest import ROOT
from trainer.throughput import gpu_peak_tflops as peak_tflops


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
    print(f"\ngpu-check --device cpu: {report['seconds']}s, step {run['step_seconds']}s, MFU {run['mfu']}")


@pytest.mark.quick
def test_stated_peaks_and_the_mfu_formula() -> None:
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("NVIDIA H200") == 989.4 and peak_tflops("NVIDIA GH200 480GB") == 989.4
    assert peak_tflops("NVIDIA L40S") == 362.0 and peak_tflops("NVIDIA L4") == 121.0  # the longest key wins
    assert peak_tflops("Some Future GPU") is None
    # 100M params, 1000 trained and 500 generated tokens in 1 s on a 1 TFLOP/s device:
    # (6 * 1e8 * 1000 + 2 * 1e8 * 500) / 1e12 = 0.7
    run = {"step_seconds": 1.0, "trained_tokens_per_step": 1000, "generated_tokens_per_step": 500}
    assert mfu(run, 100_000_000, 1.0, devices=1) == pytest.approx(0.7)
    assert mfu(run, 100_000_000, 1.0, devices=2) == pytest.approx(0.35)
    assert mfu(run, 100_000_000, None, devices=1) is None


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHON"] = sys.executable
    return env


@pytest.mark.quick
def test_a_relative_model_directory_becomes_an_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's spec refuses relative paths: the check's default model ($MATHRL_HOME/models/..., a
    relative .mathrl by default) failed on the lent H200 before this."""
    from service.gpu_check import prepare_model

    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert prepare_model("models/m", "cpu", tmp_path) == str(tmp_path / "models" / "m")
