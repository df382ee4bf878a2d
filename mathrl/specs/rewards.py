"""GRPO's rewards by name (`rewards: [{name: ...}]`), each a grader or a reward model."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, model_validator

from mathrl.errors import FieldError
from mathrl.graders import BoxedFormatGrader, Grader, LengthPenaltyGrader, MathGrader, RewardModelGrader
from mathrl.modelref import ModelRef
from mathrl.specs.base import StrictModel

RewardName = Literal["accuracy", "binary", "format", "overlong", "reward_model", "grader"]
REWARD_NAMES: tuple[str, ...] = get_args(RewardName)


class RewardRef(StrictModel):
    name: RewardName = Field(
        ...,
        description="A named reward (each is a grader: RewardRef.as_grader), or 'grader' for the one in 'grader'.",
    )
    grader: Grader | None = Field(
        None, description="For 'grader': a grader (mathrl/graders.py) whose score is the reward."
    )
    weight: float = Field(1.0, ge=-100, le=100, description="Weight of this reward in the sum.")
    model: ModelRef | None = Field(None, description="For 'reward_model': the RM (a path or 'job:<id>').")
    buffer: int | None = Field(
        None,
        ge=1,
        le=131072,
        description="For 'overlong': tokens before max_completion_length over which the penalty ramps to -1 "
        "(DAPO's soft overlong punishment); default a quarter of max_completion_length.",
    )

    @model_validator(mode="after")
    def _model_only_for_rm(self) -> RewardRef:
        if self.name == "grader" and self.grader is None:
            raise FieldError("grader", "the 'grader' reward needs 'grader': e.g. {type: math}")
        if self.name != "grader" and self.grader is not None:
            raise FieldError("grader", f"'grader' is only for the 'grader' reward, not {self.name!r}: remove it")
        if self.buffer is not None and self.name != "overlong":
            raise FieldError("buffer", f"'buffer' is only for the 'overlong' reward, not {self.name!r}: remove it")
        if self.name == "reward_model" and self.model is None:
            raise FieldError("model", "the 'reward_model' reward needs 'model': an RM path or 'job:<rm-job-id>'")
        if self.name != "reward_model" and self.model is not None:
            raise FieldError("model", f"'model' is only for the 'reward_model' reward, not {self.name!r}: remove it")
        return self

    def as_grader(self, max_completion_length: int) -> Any:
        """The grader (mathrl/graders.py) this reward is: every named reward is one, so its
        formula has one implementation (evaluator/graders.py) in GRPO, eval and the graders
        route. `max_completion_length` is the run's, which 'overlong' penalises against."""
        if self.name == "grader":
            return self.grader
        if self.name == "accuracy":
            return MathGrader()
        if self.name == "binary":  # DeepSeekMath's rule reward: +1 right, -1 wrong, -0.5 no answer
            return MathGrader(wrong_score=-1.0, no_answer_score=-0.5)
        if self.name == "format":
            return BoxedFormatGrader()
        if self.name == "overlong":
            buffer = self.buffer or max(1, max_completion_length // 4)
            return LengthPenaltyGrader(max_length=max_completion_length, buffer=min(buffer, max_completion_length))
        assert self.name == "reward_model" and self.model is not None
        return RewardModelGrader(model=self.model)
