"""Checkpoints and resume: saving atomically, finding the newest complete checkpoint, saving
the final model.

A checkpoint directory appears under its final name only once every file in it is written
(written to a staging directory beside it, then renamed), so a crash or a full disk mid-save
never leaves a half-written `checkpoint-N` for a resumed job to load. A failed write stops
the job with a CheckpointWriteError naming the step and the cause; the earlier checkpoints
stay as they were."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from runtime.errors import CheckpointWriteError as CheckpointWriteError  # raised here; its callers import it from here
from runtime.sink import Sink


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _staging(target: Path) -> Path:
    return target.with_name(f".{target.name}.partial")


@contextmanager
def atomic_dir(target: Path, what: str) -> Iterator[Path]:
    """Yield a staging directory to write into; on success it becomes `target` in one rename."""
    staging = _staging(target)
    shutil.rmtree(staging, ignore_errors=True)  # left by a crash mid-save
    try:
        staging.mkdir(parents=True)
        yield staging
        for f in staging.rglob("*"):  # on disk before the rename makes them visible
            if f.is_file():
                _fsync(f)
        if target.exists():  # the same step saved again (a resumed run): replace it
            shutil.rmtree(target)
        os.rename(staging, target)
        _fsync(target.parent)
    except Exception as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointWriteError(f"{what} write failed: {type(exc).__name__}: {exc}") from exc


@contextmanager
def ranks_dir(trainer: Any, target: Path, what: str) -> Iterator[Path]:
    """atomic_dir for every rank of a run: the main rank makes the staging directory and, once
    every rank has written its part (per-rank RNG state, ZeRO-3 shards) into it, renames it."""
    acc = trainer.accelerator
    if acc.num_processes == 1:
        with atomic_dir(target, what) as staging:
            yield staging
        return
    if acc.is_main_process:
        with atomic_dir(target, what) as staging:
            acc.wait_for_everyone()  # the staging directory exists
            yield staging
            acc.wait_for_everyone()  # every rank has written
    else:
        acc.wait_for_everyone()
        yield _staging(target)
        acc.wait_for_everyone()
    acc.wait_for_everyone()  # renamed: no rank goes on before the checkpoint is in place


def save_checkpoints_atomically(trainer: Any) -> None:
    """Make a transformers Trainer write each checkpoint-N through atomic_dir: it saves into
    a staging run directory (args.output_dir pointed there for the call), then it is renamed."""
    inner = trainer._save_checkpoint

    def save(model: Any, trial: Any, *args: Any, **kwargs: Any) -> None:
        out = Path(trainer.args.output_dir)
        name = f"checkpoint-{trainer.state.global_step}"
        with ranks_dir(trainer, out / name, f"checkpoint at step {trainer.state.global_step}") as staging:
            run_dir = staging / "run"
            trainer.args.output_dir = str(run_dir)
            try:
                inner(model, trial, *args, **kwargs)
            finally:
                trainer.args.output_dir = str(out)
            if trainer.accelerator.num_processes > 1:
                trainer.accelerator.wait_for_everyone()
            if trainer.accelerator.is_main_process:
                for f in (run_dir / name).iterdir():
                    f.rename(staging / f.name)
                shutil.rmtree(run_dir)

    trainer._save_checkpoint = save


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The newest complete TRL checkpoint (one with its trainer state written)."""
    best: tuple[int, Path] | None = None
    for d in out_dir.glob("checkpoint-*"):
        m = re.fullmatch(r"checkpoint-(\d+)", d.name)
        if m and (d / "trainer_state.json").exists():
            step = int(m.group(1))
            if best is None or step > best[0]:
                best = (step, d)
    return best[1] if best else None


def save_final(
    trainer: Any, tokenizer: Any, out_dir: Path, sink: Sink, seconds: float, work_dir: Path | None = None
) -> dict[str, Any]:
    """Save the trained model (LoRA adapters merged into their base) to out_dir/final, so
    evaluation and later jobs load it like any model, and report it. With `work_dir` (a job
    attempt's own directory) it is written there and the sink moves it to out_dir/final."""
    final = (work_dir or out_dir) / "final"
    if trainer.is_deepspeed_enabled:  # ZeRO-3 shards the weights: every rank joins in gathering them
        with ranks_dir(trainer, final, "final model") as staging:
            trainer.save_model(str(staging))
            if trainer.accelerator.is_main_process:
                tokenizer.save_pretrained(str(staging))
    elif trainer.accelerator.is_main_process:
        model = trainer.accelerator.unwrap_model(trainer.model)
        if hasattr(model, "merge_and_unload"):  # a peft model
            model = model.merge_and_unload()
        with atomic_dir(final, "final model") as staging:
            model.save_pretrained(str(staging))
            tokenizer.save_pretrained(str(staging))
    trainer.accelerator.wait_for_everyone()
    step = trainer.state.global_step
    sink.checkpoint(step, str(out_dir / "final"), kind="final", source=str(final))
    sink.event("trained", f"{step} steps in {seconds:.1f}s", data={"train_seconds": seconds, "steps": step})
    return {"steps": step, "train_seconds": seconds, "final": str(out_dir / "final")}
