"""A generate job's sampling on transformers (evaluator/chat.py), as chat.completions runs it."""

from __future__ import annotations

from typing import Any

import pytest

from evaluator.chat import run_generate
from mathrl.specs import parse_spec

pytestmark = pytest.mark.quick


class Recorded:
    """What a job process's sink keeps of a generate job: its samples and events."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.rows += rows

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        self.events.append((kind, message))

    def should_stop(self) -> bool:
        return False


def _answers(model: str, **over: Any) -> list[str]:
    spec = parse_spec(
        {"kind": "generate", "model": model, "prompt": "1 + 1 =", "temperature": 1.0, "max_tokens": 12, **over}
    )
    sink = Recorded()
    run_generate(spec, sink, model)
    return [r["completion"] for r in sink.rows]


def test_calls_without_a_seed_differ_and_with_one_repeat(tiny_model: str) -> None:
    """OpenAI's repeated calls differ unless they send a seed; a missing seed was 0, so every
    sampled call (a pass@k script's k calls) got the same answer."""
    seeded = [_answers(tiny_model, seed=3) for _ in range(2)]
    assert seeded[0] == seeded[1]
    unseeded = {tuple(_answers(tiny_model)) for _ in range(3)}
    assert len(unseeded) > 1, unseeded
