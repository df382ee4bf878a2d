"""Checkpoints and resume: finding the newest complete checkpoint, saving the final model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mathrl.sink import Sink


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


def save_final(trainer: Any, tokenizer: Any, out_dir: Path, sink: Sink, seconds: float) -> dict[str, Any]:
    """Save the trained model (LoRA adapters merged into their base) to out_dir/final, so
    evaluation and later jobs load it like any model, and report it."""
    final = out_dir / "final"
    model = trainer.model
    if hasattr(model, "merge_and_unload"):  # a peft model
        model = model.merge_and_unload()
    model.save_pretrained(str(final))
    tokenizer.save_pretrained(str(final))
    step = trainer.state.global_step
    sink.checkpoint(step, str(final), kind="final")
    sink.event("trained", f"{step} steps in {seconds:.1f}s", data={"train_seconds": seconds, "steps": step})
    return {"steps": step, "train_seconds": seconds, "final": str(final)}
