"""A transformers TrainerCallback that reports a TRL run through a Sink: metrics every logging
step (plus step time and tokens/s), sampled completions with their rewards every N steps,
checkpoints as they are saved, and a stop request between steps (a drain also saves that step)."""

from __future__ import annotations

import math
import time
from typing import Any

from transformers import TrainerCallback

from mathrl.modelref import OPENAI_METRICS
from runtime.sink import Sink


class SinkCallback(TrainerCallback):
    def __init__(
        self,
        sink: Sink,
        sample_every: int = 10,
        samples_per_step: int = 8,
        total_steps: int | None = None,
        checkpoint_dir: str | None = None,
        metrics_events: bool = False,
    ):
        self.sink = sink
        # a 'metrics' event per log, as OpenAI's fine-tuning jobs list them (their loss curve in the events)
        self.metrics_events = metrics_events
        # where saved checkpoints go (the job's directory) when the trainer writes them elsewhere
        # (the attempt's own args.output_dir): the sink moves each one there as it records it
        self.checkpoint_dir = checkpoint_dir
        self.sample_every = sample_every
        self.samples_per_step = samples_per_step
        self.total_steps = total_steps
        self.trainer: Any = None  # set after the trainer is built (samples are read from it)
        self.rewards: list[Any] = []  # the reward functions: their samples not checked in time are logged
        self._t_step = time.monotonic()
        self._step_times: list[float] = []
        self._tokens_at_log: float | None = None
        self._t_log = time.monotonic()
        self.stopped = False
        self._peak: tuple[float | None, str] | None = None  # the device's peak FLOP/s, and how it was taken

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._t_step = self._t_log = time.monotonic()
        if self.total_steps is None and state.max_steps > 0:  # epochs asked for: the trainer has counted the steps
            self.total_steps = state.max_steps
        if state.global_step:
            self.sink.event("resumed", f"resumed from step {state.global_step}", data={"step": state.global_step})

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        now = time.monotonic()
        self._step_times.append(now - self._t_step)
        self._t_step = now
        step = state.global_step
        if self.trainer is not None and step % self.sample_every == 0:
            self._record_samples(step)
        if self.total_steps:
            self.sink.progress(step, self.total_steps, "training")
        if _any_rank(self.sink.should_stop(fresh=True), args):  # read now: no step starts after a cancel
            self.stopped = True
            control.should_training_stop = True
            # a drain (the worker is shutting down): save this step, the job resumes from it on
            # another worker. Every rank decides alike, or the ranks of a sharded save would wait
            # for each other for ever.
            if _any_rank(self.sink.draining(), args):
                control.should_save = True

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        if not logs:
            return
        values: dict[str, float] = {}
        for key, value in logs.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                values[key] = float(value)
        if self._step_times:
            breakdown = self._step_breakdown(args)
            held = breakdown.pop("eval_seconds", 0.0)  # held-out evaluation (trainer/heldout_eval.py): not a step's
            values["step_time"] = (sum(self._step_times) - held) / len(self._step_times)
            values.update(breakdown)
            self._step_times = []
        timeouts = 0.0
        for reward in self.rewards:
            if getattr(reward, "timed_out", 0):  # trainer/rewards.py: cumulative, logged once there are any
                values[f"rewards/{reward.__name__}/timed_out"] = float(reward.timed_out)
                timeouts += float(reward.timed_out)
        if self.rewards:
            values["reward/timeouts"] = timeouts  # samples so far scored as wrong for overrunning their check
        tokens = logs.get("num_tokens")
        now = time.monotonic()
        if isinstance(tokens, (int, float)):
            if self._tokens_at_log is not None and now > self._t_log:
                values["tokens_per_second"] = (tokens - self._tokens_at_log) / (now - self._t_log)
            self._tokens_at_log = float(tokens)
        self._t_log = now
        if values:
            self.sink.metrics(state.global_step, values)
            if self.metrics_events:
                self._metrics_event(state.global_step, values)

    def _metrics_event(self, step: int, values: dict[str, float]) -> None:
        named = {OPENAI_METRICS[k]: v for k, v in values.items() if k in OPENAI_METRICS}
        if not named:  # (the trainer's summary at the end: its runtime, no step's metrics)
            return
        total = self.total_steps or step
        shown = ", ".join(f"{k} {v:.4g}" for k, v in named.items())
        self.sink.event("metrics", f"step {step}/{total}" + (f": {shown}" if shown else ""),
                        data={"step": step, "total_steps": total, **named})  # fmt: skip

    def _step_breakdown(self, args: Any) -> dict[str, float]:
        """Per step, averaged over the steps since the last log: generation seconds, weight-sync
        seconds, the rest ('training_seconds': scoring, log-probs, backward, optimizer), generated
        tokens per second of generation, generation's share of the step (TimedGRPOTrainer), and
        the completions generated per step by all ranks together ('completions_per_step'). With
        overlap, 'generation_seconds' is what the step waited for its batch, and
        'background_generation_seconds' what generating it took beside the last step's training."""
        pop = getattr(self.trainer, "pop_timings", None)
        if pop is None:
            return {}
        t = pop()
        held = t.get("eval_seconds", 0.0)
        n, wall = len(self._step_times), sum(self._step_times) - held
        gen, sync = t["generation_seconds"], t["weight_sync_seconds"]
        tool = t.get("tool_seconds", 0.0)  # a tool job's calls (trainer/tool_grpo.py), beside generation
        out = {
            "generation_seconds": gen / n,
            "weight_sync_seconds": sync / n,
            "training_seconds": max(wall - gen - sync - tool, 0.0) / n,
            "generation_share": gen / wall if wall > 0 else 0.0,
        }
        busy = t.get("background_generation_seconds", 0.0)  # overlap: generation ran beside training
        if busy > 0:
            out["background_generation_seconds"] = busy / n
        if busy or gen:
            out["generation_tokens_per_second"] = t["generated_tokens"] / (busy or gen)
        if tool:
            out["tool_seconds"] = tool / n
            out["tool_share"] = tool / wall if wall > 0 else 0.0
        out["completions_per_step"] = _sum_ranks(t.get("generated_completions", 0.0), args) / n
        out.update({k: v for k, v in t.items() if k.startswith("reward/")})
        out["eval_seconds"] = held
        train = wall - gen - sync - tool
        if t.get("forward_tokens"):  # prompt + completion tokens of the rows the training pass took
            out["forward_tokens_per_step"] = t["forward_tokens"] / n
        if t.get("forward_tokens") and train > 0:
            out["trained_tokens_per_second"] = t["trained_tokens"] / train
            out.update(self._mfu(t, train))
        return out

    def _mfu(self, t: dict[str, float], seconds: float) -> dict[str, float]:
        """Model FLOPs utilisation of the training part of the steps (trainer/throughput.py)."""
        from trainer.throughput import flops_per_token, peak_flops

        if self._peak is None:
            self._peak = peak_flops()
            self.sink.event("throughput", f"MFU is counted against {self._peak[1]}", data={"peak": self._peak[0]})
        peak = self._peak[0]
        if not peak:
            return {}
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        context = t["forward_tokens"] / max(t["forward_rows"], 1.0)
        return {"mfu": flops_per_token(model, context) * t["forward_tokens"] / (seconds * peak)}

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        name = f"checkpoint-{state.global_step}"
        written = f"{args.output_dir}/{name}"
        target = f"{self.checkpoint_dir}/{name}" if self.checkpoint_dir else written
        self.sink.checkpoint(state.global_step, target, kind="checkpoint", source=written)

    def _record_samples(self, step: int) -> None:
        logs = getattr(self.trainer, "_logs", None)
        if not logs or not logs.get("completion"):
            return
        prompts = list(logs["prompt"])[-self.samples_per_step :]
        completions = list(logs["completion"])[-self.samples_per_step :]
        rewards = {name: list(v)[-self.samples_per_step :] for name, v in logs["rewards"].items()}
        advantages = list(logs["advantages"])[-self.samples_per_step :]
        items = []
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            data: dict[str, Any] = {"rewards": {k: _num(v[i]) for k, v in rewards.items() if i < len(v)}}
            if i < len(advantages):
                data["advantage"] = _num(advantages[i])
            items.append({"prompt": _text(p), "completion": _text(c), "data": data})
        self.sink.samples(step, items)


def _any_rank(flag: bool, args: Any) -> bool:
    """True when any rank of a multi-process run says so: every rank stops at the same step
    (one rank stopping alone would leave the others waiting in the next step's all-reduce)."""
    return bool(_all_ranks(1.0 if flag else 0.0, "MAX", args))


def _sum_ranks(value: float, args: Any) -> float:
    """`value` summed over the ranks of a multi-process run (every rank logs the same steps)."""
    return _all_ranks(value, "SUM", args)


def _all_ranks(value: float, op: str, args: Any) -> float:
    """`value` all-reduced with `op` (a torch.distributed.ReduceOp name) over the run's ranks."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    import torch

    t = torch.tensor([value], dtype=torch.float64, device=args.device)
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    return float(t.item())


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _text(x: Any) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, list):
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in x)
    return str(x)
