"""scripts/gpu-check, the GPU acceptance run, in its CPU form (`--device cpu`, the tiny model):
the suite runs it so the script cannot rot between the rare runs on a GPU. The floor on the
held-out gain is set out of reach here, so the run must end in exit status 1 with that failure
named, after every figure of the report was measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.gpu_figures import mfu
from trainer.throughput import gpu_peak_tflops as peak_tflops


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


@pytest.mark.quick
def test_a_relative_model_directory_becomes_an_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's spec refuses relative paths: the check's default model ($MATHRL_HOME/models/..., a
    relative .mathrl by default) failed on the lent H200 before this."""
    from service.gpu_check import prepare_model

    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert prepare_model("models/m", "cpu", tmp_path) == str(tmp_path / "models" / "m")


@pytest.mark.quick
def test_its_own_temporary_directory_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu-check's working directory (models, checkpoints) goes when it made it, unless --keep."""
    import tempfile

    import service.gpu_check as gpu_check

    made: list[Path] = []

    def fake_run(args: object, device: str, work: Path) -> dict[str, object]:
        (work / "model").mkdir()
        made.append(work)
        return {"passed": True}

    monkeypatch.setattr(gpu_check, "_run_check", fake_run)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for keep in (False, True):
        args = gpu_check.parser().parse_args(["--device=cpu"] + (["--keep"] if keep else []))
        assert gpu_check.run_check(args) == {"passed": True}
        assert made[-1].parent == tmp_path and made[-1].exists() is keep
