"""Benchmark evaluation jobs (`kind: eval`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from mathrl.errors import FieldError
from mathrl.graders import Grader
from mathrl.modelref import ModelRef
from mathrl.specs.base import Dtype, GenerationBackend, JobBase, RecipeField
from mathrl.specs.inputs import DatasetRef, Sampling
from mathrl.specs.tools import Tools


class EvalSpec(JobBase):
    kind: Literal["eval"] = Field("eval", description="Benchmark evaluation.")
    model: ModelRef
    benchmark: str = Field("gsm8k", min_length=1, max_length=128, description="A registered benchmark.")
    dataset: DatasetRef | None = Field(None, description="A user set instead of a registered benchmark.")
    recipe: RecipeField | None = Field(
        None,
        description="How questions become prompts: a registered recipe's name (e.g. 'lm-eval-gsm8k', which "
        "reproduces lm-evaluation-harness's 5-shot gsm8k) or a recipe given inline; unset: the benchmark's "
        "own. 'few_shot', 'system_prompt' and 'sampling.max_new_tokens', when given, override the recipe's.",
    )
    limit: int | None = Field(None, ge=1, le=1_000_000, description="Evaluate only the first N problems.")
    backend: GenerationBackend = Field("hf", description="Generation backend.")
    batch_size: int = Field(16, ge=1, le=4096, description="Prompts per generation batch (hf backend).")
    sampling: Sampling = Field(default_factory=Sampling, description="Decoding: greedy by default; n > 1 for pass@k.")
    k: list[Annotated[int, Field(ge=1, le=1024)]] = Field(
        default_factory=lambda: [1], max_length=32, description="k values for pass@k and maj@k (at most 32)."
    )
    few_shot: int | None = Field(
        None, ge=0, le=64, description="Worked examples put before each question; unset: the recipe's count."
    )
    grader: Grader | None = Field(
        None,
        description="A grader (mathrl/graders.py) scoring each item besides the accuracy: its score and reason "
        "are stored per item and its mean as the 'grader/mean' score.",
    )
    system_prompt: str | None = Field(None, max_length=4000, description="Overrides the recipe's system prompt.")
    dtype: Dtype = Field("auto", description="Model weights dtype.")
    tools: Tools | None = Field(
        None,
        description="Tools the model may call mid-answer (program-aided): its code runs in the python graders' "
        "sandbox and the output goes back into its context; sampling.max_new_tokens is then per model turn.",
    )

    @model_validator(mode="after")
    def _k_fits_n(self) -> EvalSpec:
        for k in self.k:
            if k < 1 or k > self.sampling.n:
                raise FieldError("k", f"k={k} needs sampling.n >= {k}: raise sampling.n or drop k={k}")
        if (self.resources.processes or 1) > 1 or self.resources.nodes > 1:
            raise FieldError(
                "resources",
                "resources.processes > 1 and resources.nodes > 1 are for training jobs (grpo, sft, reward_model); "
                "an eval job runs as one process on one node: drop them",
            )
        if self.tools is not None and self.tools.void_turns != "keep":
            raise FieldError(
                "tools/void_turns", "void_turns is how GRPO trains on void rollouts; an eval scores them: drop it"
            )
        return self
