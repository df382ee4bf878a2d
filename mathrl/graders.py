"""Graders: typed, composable scoring of a completion against its gold answer, each giving a
score and a reason. The same objects score GRPO rewards (`rewards: [{name: grader, grader:
...}]`), eval items (`EvalSpec.grader`) and `POST /v1/graders:run`, which tries one on given
completions before a run is paid for. They are data: no user code runs on our machines.
Their implementations: evaluator/graders.py."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mathrl.errors import check_regex
from mathrl.modelref import ModelRef


class _Grader(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MathGrader(_Grader):
    """1 when the completion's final answer equals the gold answer by math-verify (fractions,
    decimals, percentages, sets, intervals, matrices...), else `wrong_score` (0), or
    `no_answer_score` (0) when it gives no final answer."""

    type: Literal["math"] = "math"
    answer_pattern: str | None = Field(
        None,
        max_length=512,
        description="A regex whose first match's group 1 is the answer; unset: the last \\boxed{}, a '####' "
        "line, 'the answer is ...', else the last number (not for a cut-off completion).",
    )

    wrong_score: float = Field(0.0, ge=-100, le=100, description="The score of an answer that differs from the gold.")
    no_answer_score: float = Field(
        0.0, ge=-100, le=100, description="The score of a completion with no final answer (e.g. -0.5, DeepSeekMath's)."
    )

    @model_validator(mode="after")
    def _pattern(self) -> MathGrader:
        check_regex("answer_pattern", self.answer_pattern, group=True)
        return self


class StringCheckGrader(_Grader):
    """1 when the chosen text passes the comparison with the reference, else 0."""

    type: Literal["string_check"] = "string_check"
    input: Literal["completion", "extracted"] = Field(
        "extracted", description="Compare the whole completion (stripped) or its extracted final answer."
    )
    operation: Literal["eq", "ne", "contains", "icontains"] = Field("eq", description="How the two are compared.")
    reference: str = Field(
        "{answer}", max_length=4000, description="What it is compared with; '{answer}' is replaced by the gold answer."
    )


class RegexGrader(_Grader):
    """A format check: 1 when the pattern is found in the completion (or when it is not, with
    `negate`), else 0."""

    type: Literal["regex"] = "regex"
    pattern: str = Field(
        ...,
        min_length=1,
        max_length=512,
        description="A regular expression, run on RE2 in linear time: Python's syntax without backreferences, "
        "lookarounds, atomic groups or possessive quantifiers (refused); \\d, \\w, \\s and \\b match ASCII "
        "only (\\p{N}, \\p{L} for Unicode).",
    )
    negate: bool = Field(False, description="Score 1 when the pattern is absent instead.")

    @model_validator(mode="after")
    def _pattern(self) -> RegexGrader:
        check_regex("pattern", self.pattern, group=False)
        return self


class BoxedFormatGrader(_Grader):
    """A format check: 1 when the completion ends its answer in a non-empty \\boxed{...} (nested
    braces counted), else 0."""

    type: Literal["boxed_format"] = "boxed_format"


class LengthPenaltyGrader(_Grader):
    """DAPO's soft overlong penalty: 0 up to max_length - buffer, then down linearly to -1 at
    max_length. Lengths are completion tokens where token ids are known (GRPO), else
    whitespace-separated words (eval items, /v1/graders:run)."""

    type: Literal["length_penalty"] = "length_penalty"
    max_length: int = Field(..., ge=1, le=131072, description="The length at which the penalty reaches -1.")
    buffer: int = Field(..., ge=1, le=131072, description="How long before max_length the penalty starts.")


class RewardModelGrader(_Grader):
    """The scalar score of a trained outcome reward model. Needs the model on a worker: GRPO and
    eval jobs run it; /v1/graders:run refuses it (the API runs no model)."""

    type: Literal["reward_model"] = "reward_model"
    model: ModelRef = Field(..., description="An RM path or 'job:<rm-job-id>'.")


SimpleGrader = Annotated[
    MathGrader | StringCheckGrader | RegexGrader | BoxedFormatGrader | LengthPenaltyGrader | RewardModelGrader,
    Field(discriminator="type"),
]


class WeightedPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grader: SimpleGrader
    weight: float = Field(1.0, ge=-100, le=100, description="This grader's weight in the sum.")


class WeightedGrader(_Grader):
    """The weighted sum of other graders' scores (e.g. math 1.0 + regex format 0.1)."""

    type: Literal["weighted"] = "weighted"
    graders: list[WeightedPart] = Field(..., min_length=1, max_length=16, description="The graders and their weights.")


Grader = Annotated[
    MathGrader
    | StringCheckGrader
    | RegexGrader
    | BoxedFormatGrader
    | LengthPenaltyGrader
    | RewardModelGrader
    | WeightedGrader,
    Field(discriminator="type"),
]
GRADER_TYPES = ("math", "string_check", "regex", "boxed_format", "length_penalty", "reward_model", "weighted")


def needs_model(grader: BaseModel) -> bool:
    if isinstance(grader, RewardModelGrader):
        return True
    return isinstance(grader, WeightedGrader) and any(needs_model(p.grader) for p in grader.graders)


class GraderItem(BaseModel):
    """One completion to grade: POST /v1/graders:run's items, and a 'grade' job's."""

    model_config = ConfigDict(extra="forbid")

    completion: str = Field(..., max_length=100_000, description="A model's completion.")
    answer: str | None = Field(None, max_length=10_000, description="The gold answer ('math' and '{answer}' need it).")
    prompt: str = Field("", max_length=100_000, description="The prompt it answered (reward models read it).")
