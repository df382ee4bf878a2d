"""Job specs the tests submit, and what a 2-process job must have stored once."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from store.db import session_scope
from store.models import Metric, Sample


def eval_spec(model: str, **over: Any) -> dict[str, Any]:
    return {
        "kind": "eval",
        "model": model,
        "benchmark": "gsm8k",
        "limit": 4,
        "batch_size": 4,
        "sampling": {"max_new_tokens": 16},
        **over,
    }


ARITH = {"name": "arith-train"}


def grpo(**over: Any) -> dict[str, Any]:
    return {
        "kind": "grpo",
        "model": "org/m",
        "dataset": ARITH,
        "max_steps": 4,
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_completion_length": 6,
        "logging_steps": 1,
        "save_steps": 2,
        "learning_rate": 1e-4,
        "sample_every": 2,
        **over,
    }


def sft(**over: Any) -> dict[str, Any]:
    return {
        "kind": "sft",
        "model": "tiny:2x64",
        "dataset": {**ARITH, "limit": 500},
        "max_steps": 20,
        "learning_rate": 1e-3,
        "per_device_train_batch_size": 16,
        "max_length": 32,
        "logging_steps": 2,
        "save_steps": 10,
        **over,
    }


def assert_stored_once(db_url: str, job_id: str, events: list[Any]) -> None:
    for kind in ("started", "training", "trained", "final"):
        assert [e.type for e in events].count(kind) == 1, kind
    launched = [e for e in events if e.type == "launched"]
    assert len(launched) == 1 and launched[0].data["processes"] == 2
    assert "launched 2 processes" in launched[0].message
    assert next(e for e in events if e.type == "started").data["processes"] == 2  # the DDP world formed
    with session_scope(db_url) as s:
        per_step = s.execute(
            select(Metric.step, func.count())
            .where(Metric.job_id == job_id, Metric.name == "loss")
            .group_by(Metric.step)
        ).all()
        samples = s.execute(
            select(Sample.step, func.count()).where(Sample.job_id == job_id).group_by(Sample.step)
        ).all()
    assert per_step and all(n == 1 for _, n in per_step)
    assert all(n <= 8 for _, n in samples), samples  # one rank's samples per step, not two


# jobs in a pool no test worker serves: stored, never run
PARKED = {"pool": "abuse-parked"}


def parked_eval(**over: Any) -> dict[str, Any]:
    return {"kind": "eval", "model": "org/model", "limit": 5, "resources": dict(PARKED), **over}


def parked_session(**over: Any) -> dict[str, Any]:
    """A Tinker training session's job (`load`: the saved state it starts from)."""
    return {"kind": "session", "model": "org/model", "session": "s", "resources": dict(PARKED), **over}


def parked_grpo(**over: Any) -> dict[str, Any]:
    return {"kind": "grpo", "model": "org/m", "dataset": {"name": "gsm8k-train"}, "resources": dict(PARKED), **over}


# pipeline steps
def sft_step(steps: int = 30, save_steps: int = 10) -> dict[str, Any]:
    return {
        "kind": "sft",
        "model": "tiny:2x64",
        "dataset": {**ARITH, "limit": 2000},
        "max_steps": steps,
        "per_device_train_batch_size": 16,
        "learning_rate": 1e-3,
        "logging_steps": 5,
        "save_steps": save_steps,
    }


def eval_step(model: str) -> dict[str, Any]:
    return {
        "kind": "eval",
        "model": model,
        "benchmark": "arith",
        "limit": 8,
        "batch_size": 8,
        "sampling": {"max_new_tokens": 4},
    }
