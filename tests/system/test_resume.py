"""Exact resume (issue 16): an SFT and a GRPO run SIGKILLed mid-way and resumed from their last
checkpoint log the same values, step for step, and end with the same weights as an
uninterrupted run with the same seed. That needs the optimizer, the LR scheduler, every RNG
(sampling included, for GRPO) and the data cursor restored, not only the weights.

The store keeps the first value of a metric step, so it cannot show a replayed step that
diverged: each process's own logged values (what its log_history sends the sink, written to a
file by tests/helpers/resume_run.py) are compared instead.

Tolerance: on this CPU the resumed runs are bitwise equal to the uninterrupted one (same fp32
kernels in the same order); the comparison allows 1e-6 relative so that a BLAS picking another
summation order (another thread count) does not fail it, while any state not restored (a fresh
optimizer moment, a scheduler at step 0, another sample or batch) moves values by orders of
magnitude more."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.env import ROOT, data_dir

pytestmark = pytest.mark.slow

RUNNER = ROOT / "tests" / "helpers" / "resume_run.py"
KILL_AT = 5  # checkpoints at 3 and 6 (resume_run.SAVE_EVERY): killed after step 5, 2 steps to replay
# logged values that are not a function of the training state: wall time and throughput
TIMING = {
    "step_time",
    "tokens_per_second",
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "generation_seconds",
    "weight_sync_seconds",
    "training_seconds",
    "generation_share",
    "generation_tokens_per_second",
    "trained_tokens_per_second",
    "mfu",
    "reward/seconds_p50",
    "reward/seconds_p95",
}


def _run(kind: str, model: str, out: Path, work: Path, log: Path, kill_at: int | None = None) -> int:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONHASHSEED": "0"}
    args = [sys.executable, str(RUNNER), kind, model, data_dir(), str(out), str(work), str(log)]
    r = subprocess.run(
        args + ([str(kill_at)] if kill_at else []), env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert r.returncode in (0, -9), r.stdout[-2000:] + r.stderr[-4000:]
    return r.returncode


def _logged(log: Path) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for line in log.read_text().splitlines():
        row = json.loads(line)
        if "loss" in row:  # the per-step log lines (the end-of-training summary has train_loss)
            steps[row.pop("step")] = {k: v for k, v in row.items() if k != "pid" and k not in TIMING}
    return steps


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


@pytest.mark.parametrize("kind", ["sft", "grpo"])
def test_a_killed_and_resumed_run_matches_an_uninterrupted_one(kind: str, tiny_model: str, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    whole, broken = tmp_path / "whole", tmp_path / "broken"
    assert _run(kind, tiny_model, whole / "train", whole / "attempt-1", tmp_path / "whole.jsonl") == 0
    assert _run(kind, tiny_model, broken / "train", broken / "attempt-1", tmp_path / "a1.jsonl", KILL_AT) == -9
    assert sorted(p.name for p in (broken / "train").iterdir()) == ["checkpoint-3"]  # what the kill left
    assert _run(kind, tiny_model, broken / "train", broken / "attempt-2", tmp_path / "a2.jsonl") == 0

    reference, first, resumed = (_logged(tmp_path / f) for f in ("whole.jsonl", "a1.jsonl", "a2.jsonl"))
    assert sorted(reference) == list(range(1, 9))
    assert sorted(first) == list(range(1, KILL_AT + 1)) and sorted(resumed) == list(range(4, 9))
    for process, steps in (("killed", first), ("resumed", resumed)):
        for step, values in steps.items():
            assert values.keys() == reference[step].keys(), (process, step)
            off = {k: (v, reference[step][k]) for k, v in values.items() if not _close(v, reference[step][k])}
            assert not off, f"{kind}: the {process} run's step {step} differs from the uninterrupted run's: {off}"
    # a test of something: the values move from step to step (a constant loss would match anyway)
    assert len({round(v["loss"], 6) for v in reference.values()}) >= 4, reference

    a = load_file(str(whole / "train" / "final" / "model.safetensors"))
    b = load_file(str(broken / "train" / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    start = load_file(str(Path(tiny_model) / "model.safetensors"))
    assert any(not torch.equal(a[k], start[k]) for k in a)  # training changed the weights
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-6, atol=1e-7, msg=lambda m, k=k: f"{kind} weight {k}: {m}")
    print(
        f"{kind}: steps 1-{KILL_AT} then (killed) resumed 4-8 match the uninterrupted run; "
        f"max |weight diff| {max(float((a[k] - b[k]).abs().max()) for k in a):.3g}"
    )
