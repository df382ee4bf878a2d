"""What the GPU acceptance run (service/gpu_check.py) measures and reports: the sink that keeps a
run's events and metrics (`RecordSink`), a GRPO run's per-step figures (`step_figures`), MFU
(`model_flops_params`, `mfu`), the memory plan admission would compute (`memory_plan`), and the
report's short table (`table`)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.sink import PrintSink

if TYPE_CHECKING:
    from mathrl.specs.resolved import ResolvedConfig


class RecordSink(PrintSink):
    """The local sink (runtime.sink.PrintSink) that also keeps events and metrics by step, for
    the report; progress lines and metric lines are not printed (the table says it once)."""

    def __init__(self, echo: bool = True) -> None:
        super().__init__()
        self.echo = echo
        self.events: list[dict[str, Any]] = []
        self.metrics_by_step: dict[int, dict[str, float]] = {}

    def event(self, type: str, message: str = "", level: str = "info", data: dict[str, Any] | None = None) -> None:
        self.events.append({"type": type, "message": message, "level": level, "data": data})
        if self.echo:
            super().event(type, message, level, data)

    def progress(self, done: int, total: int, message: str = "") -> None:
        pass

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.metrics_by_step.setdefault(step, {}).update(values)

    def series(self, name: str) -> list[float]:
        return [v[name] for _, v in sorted(self.metrics_by_step.items()) if name in v]


def step_figures(sink: RecordSink, steps: int, world: int) -> dict[str, Any]:
    """Per-step medians over the run's steps (the first, which warms up kernels, left out when
    there are more), from the metrics trainer.callbacks.SinkCallback reports."""
    by_step = sorted(sink.metrics_by_step.items())
    rows = [v for s, v in by_step if "step_time" in v]
    if len(rows) > 2:
        rows = rows[1:]

    def med(name: str) -> float | None:
        values = [r[name] for r in rows if name in r]
        return statistics.median(values) if values else None

    step, gen = med("step_time"), med("generation_seconds")
    gen_tps = med("generation_tokens_per_second")
    # with overlap (trainer/overlap.py) the step waits `gen` for a batch generated beside training in `busy`
    busy = med("background_generation_seconds")
    # what the training pass took (prompt + completion tokens of the rows it trained: the loop
    # leaves zero-advantage completions out), not TRL's num_tokens, which counts every row generated
    trained_per_step = med("forward_tokens_per_step")
    generating = busy or gen
    generated_per_step = generating * gen_tps if generating and gen_tps else None
    out: dict[str, Any] = {
        "step_seconds": _r(step),
        "generation_seconds": _r(gen),
        "background_generation_seconds": _r(busy),
        "training_seconds": _r(med("training_seconds")),
        "generation_share": _r(med("generation_share")),
        "generated_tokens_per_step": _r(generated_per_step),
        "trained_tokens_per_step": _r(trained_per_step),
        "completions_per_step": _r(med("completions_per_step")),
        # the loop's own figures (trainer/grpo_loop.py, trainer/callbacks.py): the share of
        # completions the skip left in the training pass, and MFU of that pass alone
        "skip_trained_fraction": _r(med("skip/trained_fraction")),
        "training_mfu": _r(med("mfu"), 6),
    }
    if step:
        out["generated_tokens_per_second_per_device"] = _r(generated_per_step and generated_per_step / step / world)
        out["trained_tokens_per_second_per_device"] = _r(trained_per_step and trained_per_step / step / world)
    return out


def model_flops_params(model_path: str) -> int:
    """Parameters that do matrix work per token: the weights in the model's safetensors files
    (read from their headers; a tied LM head is stored once, and its embedding lookup does no
    multiply, so it counts once)."""
    import struct

    total = 0
    for f in sorted(Path(model_path).glob("*.safetensors")):
        with f.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, meta in header.items():
            if name != "__metadata__":
                n = 1
                for d in meta["shape"]:
                    n *= d
                total += n
    return total


def mfu(run: dict[str, Any], params: int, peak: float | None, devices: int) -> float | None:
    """Model FLOPs utilisation of a GRPO step: 6 FLOPs per parameter per trained token (forward
    and backward), 2 per parameter per generated token (the sampling forward; the prompt's
    prefill is counted in the trained tokens' forward only), attention's own FLOPs left out
    (under 5% at these lengths), over the step's time times the devices' peak."""
    step, trained, generated = (
        run.get("step_seconds"),
        run.get("trained_tokens_per_step"),
        run.get("generated_tokens_per_step"),
    )
    if not (step and trained and peak):
        return None
    flops = 6 * params * trained + 2 * params * (generated or 0)
    utilisation: float = flops / (step * peak * 1e12 * devices)
    return round(utilisation, 5)


def memory_plan(model_path: str, config: ResolvedConfig, env: dict[str, Any]) -> dict[str, Any]:
    """The plan admission computes for this job (trainer/memory_plan.py), on this GPU's memory."""
    from kinds import training_of
    from trainer.memory_plan import plan_job

    config_json = json.loads((Path(model_path) / "config.json").read_text())
    gpu_gib = env["gpus"][0]["memory_gib"] if env.get("gpus") else None
    return plan_job(training_of(config), config_json, gpu_gib).record()


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


def table(report: dict[str, Any]) -> str:
    env = report["environment"]
    gpu = env["gpus"][0]["name"] if env.get("gpus") else f"CPU ({env.get('cpu_cores')} cores)"
    lines = [
        f"device      {gpu} x{len(env.get('gpus', [])) or 1}; torch {env['torch']}, CUDA {env['cuda']}, "
        f"driver {env.get('driver')}",
        f"peak        {env.get('peak_tflops')} TFLOP/s ({env.get('peak_source')})",
        f"model       {report['model']['name']} ({report['model']['params'] / 1e6:.1f}M params)",
        f"before      {report['before']['accuracy']:.1%} on {report['before']['n']} held-out problems",
        "floor       "
        + (
            f"a gain of {report['min_gain']:+.1f} points (--min-gain)"
            if report["min_gain"] is not None
            else "none (the CPU's default: --min-gain sets one)"
        ),
        f"mathrl      {env.get('mathrl_commit')}",
    ]
    for run in report["runs"]:
        if "error" in run:
            lines.append(f"{run['backend']:<11} ERROR {run['error'][:200]}")
            continue
        plan = run.get("memory_plan") or {}
        lines.append(
            f"{run['backend']:<11} ({run.get('hf_mode') or 'engine'}) after {run['after']['accuracy']:.1%} "
            f"({run['gain_points']:+.1f} points); "
            f"step {run['step_seconds']}s (generation {run['generation_share']}), "
            f"tokens/s/device trained {run.get('trained_tokens_per_second_per_device')} "
            f"generated {run.get('generated_tokens_per_second_per_device')}; MFU {run['mfu']} "
            f"(training pass {run.get('training_mfu')}, trained share {run.get('skip_trained_fraction')}); "
            f"memory peak {run.get('peak_memory_gib')} GiB, plan {plan.get('estimate_gib')} GiB"
        )
    dp = report["data_parallel"]
    if "skipped" in dp:
        lines.append(f"ranks       skipped: {dp['skipped']}")
    elif "error" in dp:
        lines.append(f"ranks       ERROR {dp['error'][:200]}")
    else:
        lines.append(
            f"ranks       {dp['ranks']}: SFT loss vs one rank, worst relative difference "
            f"{dp['sft_worst_relative_loss_difference']:.2e}; GRPO step {dp['grpo']['step_seconds']}s"
        )
    lines.append(f"verdict     {'PASSED' if report['passed'] else 'FAILED'} in {report['seconds']}s")
    lines.extend(f"  - {f}" for f in report["failures"])
    return "\n".join(lines)
