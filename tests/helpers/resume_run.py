"""Run by tests/system/test_resume.py in a process of its own, so that it can be killed with SIGKILL:
one SFT or GRPO training run through the code a job runs (trainer.sft.run_sft,
trainer.grpo.run_grpo: checkpoints written into `work`, promoted into `out`, a run that finds
a checkpoint in `out` resumes from it). Every metric the process logs (its log_history, as
the job's sink receives it) is appended to `log` as a JSON line; with `kill_at`, the process
SIGKILLs itself as it logs that step.

    python tests/helpers/resume_run.py sft|grpo MODEL DATA_DIR OUT WORK LOG [KILL_AT]
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from runtime.sink import PrintSink  # noqa: E402

STEPS, SAVE_EVERY = 8, 3

SFT = {
    "kind": "sft",
    "dataset": {"name": "arith", "split": "train", "limit": 400},
    "max_steps": STEPS,
    "learning_rate": 1e-3,
    "per_device_train_batch_size": 16,
    "max_length": 32,
    "logging_steps": 1,
    "save_steps": SAVE_EVERY,
    "warmup_ratio": 0.25,
    "seed": 7,
}
# one generation round per optimizer step and one update per round (TRL otherwise buffers
# generations across steps), a reward that differs between a random model's completions
# (their length: the overlong penalty over the whole completion), sampling at temperature 1;
# accuracy (0 for a random model) gives the curriculum its verdicts
GRPO = {
    "kind": "grpo",
    "dataset": {"name": "arith", "split": "train", "limit": 400},
    "max_steps": STEPS,
    "num_generations": 4,
    "per_device_train_batch_size": 8,
    "max_completion_length": 12,
    "num_iterations": 1,
    "rewards": [{"name": "accuracy"}, {"name": "overlong", "buffer": 12}],
    # mathrl's loop with state: the curriculum's pass rates must come back from the checkpoint
    # (draws depend on them), dynamic sampling's extra rounds must draw the same questions again
    "curriculum": True,
    "dynamic_sampling": {"metric": "reward", "max_rounds": 2},
    "learning_rate": 1e-3,
    "logging_steps": 1,
    "save_steps": SAVE_EVERY,
    "seed": 7,
}


class LogSink(PrintSink):
    def __init__(self, log: Path, kill_at: int | None) -> None:
        super().__init__()
        self.log, self.kill_at = log, kill_at

    def metrics(self, step: int, values: dict[str, float]) -> None:
        with self.log.open("a") as f:
            f.write(json.dumps({"step": step, "pid": os.getpid(), **values}) + "\n")
        if step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def event(self, type: str, message: str = "", level: str = "info", data: dict[str, Any] | None = None) -> None:
        if type in ("resumed", "training"):
            super().event(type, message, level, data)

    def progress(self, done: int, total: int, message: str = "") -> None:
        pass


def main(kind: str, model: str, data_dir: str, out: str, work: str, log: str, kill_at: str | None = None) -> None:
    from kinds import resolve_config
    from mathrl.specs import parse_spec
    from mathrl.specs.resolved import ResolvedGRPO, ResolvedSFT

    sink = LogSink(Path(log), int(kill_at) if kill_at else None)
    spec = parse_spec({**(SFT if kind == "sft" else GRPO), "model": model})
    if kind == "sft":
        from trainer.sft import run_sft

        run_sft(
            spec,
            resolve_config(spec).of(ResolvedSFT),
            sink,
            model_path=model,
            data_dir=data_dir,
            out_dir=Path(out),
            work_dir=Path(work),
        )
    else:
        from trainer.grpo import run_grpo

        run_grpo(
            spec,
            resolve_config(spec).of(ResolvedGRPO),
            sink,
            model_path=model,
            data_dir=data_dir,
            out_dir=Path(out),
            work_dir=Path(work),
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
