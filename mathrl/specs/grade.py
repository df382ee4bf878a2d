"""Grading jobs (`kind: grade`): given completions scored by a grader that loads a model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mathrl.errors import FieldError
from mathrl.graders import Grader, GraderItem
from mathrl.specs.base import Dtype, GenerationBackend, JobBase


class GradeSpec(JobBase):
    """Score given completions with a grader that loads a model (reward_model, score_model,
    label_model): what the graders routes submit for such graders, and wait for. Nothing is
    trained; each item's score and reason are stored as the job's samples."""

    kind: Literal["grade"] = Field("grade", description="Grading given completions.")
    grader: Grader = Field(..., description="The grader (mathrl/graders.py), with a reward model in it.")
    items: list[GraderItem] = Field(..., min_length=1, max_length=1000, description="At most 1000 per job.")
    backend: GenerationBackend | Literal["auto"] = Field(
        "hf",
        description="Where a score_model or label_model grader's model answers: 'vllm' the worker's warm vLLM "
        "engine, 'auto' that engine where the worker has vLLM, 'hf' transformers in the job's process.",
    )
    dtype: Dtype = Field("auto", description="The grading model's dtype.")

    @model_validator(mode="after")
    def _one_node(self) -> GradeSpec:
        if self.resources.nodes > 1 or (self.resources.processes or 1) > 1:
            raise FieldError("resources", "a grade job runs as one process on one node: drop resources.nodes/processes")
        return self
