"""Model FLOPs utilisation (MFU): the FLOPs a training step needed, from the model's shape, against a
stated peak of the device it ran on.

`flops_per_token`: 6 x parameters plus attention's 12 x layers x hidden x context per trained token,
the training forward and backward only. `peak_flops`: NVIDIA GPUs by name (`GPU_PEAK_TFLOPS`, dense
bf16, `gpu_peak_tflops`), a CPU from its cores, clock and vector width; `MATHRL_PEAK_TFLOPS`
overrides both. Where the formula and the peaks come from: docs/grpo-loop.md, "Per-step metrics"."""

from __future__ import annotations

import os
from typing import Any

GPU_PEAK_TFLOPS: dict[str, float] = {
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.4,  # SXM
    "H200": 989.4,
    "GH200": 989.4,
    "B200": 2250.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10G": 125.0,
    "A10": 125.0,
    "RTX 4090": 165.2,
}


def gpu_peak_tflops(name: str) -> float | None:
    """The dense bf16 peak of the GPU `name` (torch.cuda.get_device_name): the longest key it
    contains wins ("H100 PCIe" before "H100"); None for a card the table does not know."""
    for key in sorted(GPU_PEAK_TFLOPS, key=len, reverse=True):
        if key in name:
            return GPU_PEAK_TFLOPS[key]
    return None


def peak_flops(threads: int | None = None) -> tuple[float | None, str]:
    """This process's device peak in FLOP/s and how it was taken (None: unknown)."""
    override = os.environ.get("MATHRL_PEAK_TFLOPS")
    if override:
        return float(override) * 1e12, f"MATHRL_PEAK_TFLOPS={override}"
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        tflops = gpu_peak_tflops(name)
        if tflops is None:
            return None, f"{name}: no peak known (set MATHRL_PEAK_TFLOPS)"
        return tflops * 1e12, f"{name}: {tflops:.1f} TFLOPS dense bf16"
    return _cpu_peak(threads or torch.get_num_threads())


def _cpu_peak(cores: int) -> tuple[float | None, str]:
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return None, "CPU: /proc/cpuinfo unreadable (set MATHRL_PEAK_TFLOPS)"
    mhz = next((float(line.split(":")[1]) for line in info.splitlines() if line.startswith("cpu MHz")), None)
    if mhz is None:
        return None, "CPU: no clock in /proc/cpuinfo (set MATHRL_PEAK_TFLOPS)"
    flags = next((line for line in info.splitlines() if line.startswith("flags")), "").split()
    per_cycle, isa = (64, "AVX-512") if "avx512f" in flags else ((32, "AVX2") if "avx2" in flags else (8, "SSE"))
    peak = cores * mhz * 1e6 * per_cycle
    return peak, f"CPU: {cores} cores x {mhz / 1000:.2f} GHz x {per_cycle} FP32 FLOPs/cycle ({isa})"


def flops_per_token(model: Any, context: float) -> float:
    """Training FLOPs per token (forward and backward) of `model` at mean sequence length `context`."""
    params: int = sum(p.numel() for p in model.parameters())
    cfg = getattr(model, "config", None)
    layers: int = getattr(cfg, "num_hidden_layers", 0) or 0
    hidden: int = getattr(cfg, "hidden_size", 0) or 0
    return 6.0 * params + 12.0 * layers * hidden * context
