"""Where one GRPO step's time goes: torch.profiler over one optimizer step of the job's trainer
(trainer.grpo_loop.MathrlGRPOTrainer), split into generation and the training pass.

`profiled(step)` patches the trainer class for the process (bench/grpo_shapes.py `--profile`
calls it in its child): the step's generation calls run inside a `mathrl.generation` range, and
the profiler records the whole step. `summary()` then gives, for each part, its device time and
its top operations: the CUDA kernels by their own device time on a GPU, the CPU operators by
their own CPU time on a CPU (where nothing else runs). A kernel belongs to generation when the
operator that launched it started inside a generation range; everything else in the step is the
training pass (its forward, backward, optimizer, and the log-prob passes TRL makes).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

GENERATION = "mathrl.generation"


class StepProfile:
    """The profiler of one step and what it recorded."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.prof: Any = None
        self.done = False

    def start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.prof = profile(activities=activities)
        self.prof.__enter__()

    def stop(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.prof.__exit__(None, None, None)
        self.done = True

    def summary(self, top: int = 15) -> dict[str, Any]:
        """{'device': 'cuda'|'cpu', 'parts': {part: {'seconds', 'top': [[name, seconds, share], ...]}}}."""
        import torch

        cuda = torch.cuda.is_available()
        events = list(self.prof.events())
        ranges = [(e.time_range.start, e.time_range.end) for e in events if e.name == GENERATION]

        def part(start: float) -> str:
            return "generation" if any(a <= start <= b for a, b in ranges) else "training"

        by_part: dict[str, dict[str, float]] = {"generation": defaultdict(float), "training": defaultdict(float)}
        for e in events:
            if e.name == GENERATION or getattr(e, "device_type", None) != torch.autograd.DeviceType.CPU:
                continue
            where = part(e.time_range.start)
            if cuda:
                for k in e.kernels:
                    by_part[where][k.name] += k.duration / 1e6  # microseconds
            elif e.self_cpu_time_total > 0:
                by_part[where][e.name] += e.self_cpu_time_total / 1e6
        parts = {}
        for name, ops in by_part.items():
            total = sum(ops.values())
            ranked = sorted(ops.items(), key=lambda kv: -kv[1])[:top]
            parts[name] = {
                "seconds": round(total, 3),
                "top": [[op, round(s, 4), round(s / total, 3) if total else 0.0] for op, s in ranked],
            }
        return {"device": "cuda" if cuda else "cpu", "step": self.step, "parts": parts}


@contextlib.contextmanager
def profiled(step: int) -> Iterator[StepProfile]:
    """Profile optimizer step `step` (1-based) of every MathrlGRPOTrainer made inside the block."""
    from transformers import TrainerCallback

    from trainer.grpo_loop import MathrlGRPOTrainer

    prof = StepProfile(step)

    class Window(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == step - 1 and prof.prof is None:
                prof.start()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == step and prof.prof is not None and not prof.done:
                prof.stop()

    init, generate = MathrlGRPOTrainer.__init__, MathrlGRPOTrainer._generate_single_turn

    def patched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.add_callback(Window())

    def patched_generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.profiler.record_function(GENERATION):
            return generate(self, *args, **kwargs)

    MathrlGRPOTrainer.__init__ = patched_init  # type: ignore[method-assign]
    MathrlGRPOTrainer._generate_single_turn = patched_generate  # type: ignore[method-assign]
    try:
        yield prof
    finally:
        MathrlGRPOTrainer.__init__ = init  # type: ignore[method-assign]
        MathrlGRPOTrainer._generate_single_turn = generate  # type: ignore[method-assign]


def print_summary(summary: dict[str, Any]) -> None:
    unit = "CUDA kernels by device time" if summary["device"] == "cuda" else "CPU operators by self CPU time"
    for name, p in summary["parts"].items():
        print(f"  step {summary['step']} {name}: {p['seconds']:.3f} s; top {unit}:", flush=True)
        for op, seconds, share in p["top"]:
            print(f"    {seconds:9.4f} s  {share:6.1%}  {op[:110]}", flush=True)
