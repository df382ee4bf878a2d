"""The parts of mathrl's GRPO loop a spec switches on (trainer/grpo_loop.py): dynamic sampling and
the pass-rate curriculum, each a block whose fields carry their defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mathrl.specs.base import StrictModel


class DynamicSampling(StrictModel):
    """Drop groups with no grading signal and generate more questions in their place (DAPO)."""

    enabled: bool = Field(True, description="false: off (true or false may also stand for the whole block).")
    metric: Literal["correct", "reward"] | None = Field(
        None,
        description="The signal whose variance within a group decides whether it is kept: 'correct', the "
        "correctness verdict of an accuracy or binary reward (a length or format term varies among all-wrong "
        "answers too), or 'reward', the weighted sum of the rewards. Unset: 'correct' where the rewards hold an "
        "accuracy or binary reward, else 'reward' (the resolved config says which).",
    )
    max_rounds: int = Field(
        3, ge=1, le=16, description="Generation rounds per step at most; a step still short trains on what it has."
    )


class Curriculum(StrictModel):
    """Draw questions by their pass rate so far, favouring those neither always nor never solved."""

    enabled: bool = Field(True, description="false: off (true or false may also stand for the whole block).")
    decay: float = Field(0.5, gt=0, le=1, description="Weight of a question's newest group in its pass rate.")
    floor: float = Field(
        0.01, gt=0, le=1, description="Added to every question's weight, so that none is never drawn again."
    )
