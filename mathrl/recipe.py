"""A prompt recipe: how a question becomes a prompt (the typed shape of the entries in
evaluator/benchmarks.py, and of a recipe given inline in an eval spec).

Chat recipes become messages (system, shots as user/assistant turns, the question) and go
through the model's chat template; text recipes become one string the way
lm-evaluation-harness builds its contexts: the description, then each shot as
``question + target_delimiter + answer + fewshot_delimiter``, then the question.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mathrl.errors import FieldError
from mathrl.regex import check_regex


class Shot(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(..., max_length=20_000, description="The worked example's question.")
    answer: str = Field(
        ..., max_length=20_000, description="The worked example's answer, as the model should write it."
    )


class Recipe(BaseModel):
    """Every field has a default, so an inline recipe names only what it changes."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["chat", "text"] = Field(
        "chat",
        description="'chat': messages through the model's chat template; 'text': one plain string, no chat "
        "template (lm-evaluation-harness's default).",
    )
    system: str = Field(
        "",
        max_length=4000,
        description="Chat: the system turn. Text: a description put before the shots (lm-eval's 'description').",
    )
    question: str = Field(
        "{question}",
        max_length=4000,
        description="How a question is written; '{question}' is replaced by it (no other braces are special).",
    )
    answer: str = Field(
        "{answer}",
        max_length=4000,
        description="How a shot's answer is written; '{answer}' is replaced by the shot's answer.",
    )
    few_shot: int = Field(0, ge=0, le=64, description="Worked examples put before each question.")
    shots: list[Shot] = Field(
        default_factory=list, max_length=64, description="Fixed worked examples (used before shots_from)."
    )
    shots_from: str | None = Field(
        None,
        max_length=128,
        description="A registered benchmark whose rows are the worked examples (e.g. 'gsm8k-train'), when "
        "'shots' is empty.",
    )
    shot_answer: Literal["solution", "gold"] = Field(
        "solution",
        description="Which part of a shots_from row is the example's answer: the worked solution or the gold.",
    )
    sampler: Literal["first_n", "random"] = Field(
        "first_n",
        description="'first_n': the first few_shot examples for every question; 'random': a fresh draw per question, "
        "in order, from random.Random(shot_seed) (lm-eval's default sampler, seed 1234).",
    )
    shot_seed: int = Field(1234, ge=0, le=2**32 - 1, description="Seed of the 'random' sampler (0 to 2**32 - 1).")
    target_delimiter: str = Field(" ", max_length=16, description="Text format: between a shot's question and answer.")
    fewshot_delimiter: str = Field("\n\n", max_length=16, description="Text format: after each shot.")
    stop: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Generation stops at the first of these strings; the completion is cut before it.",
    )
    answer_pattern: str | None = Field(
        None,
        max_length=512,
        description="A regex whose first match's group 1 is the answer (lm-eval's 'strict-match'); unset: "
        "the grader's own extraction (boxed, ####, 'the answer is', the last number).",
    )
    max_new_tokens: int | None = Field(
        None, ge=1, le=32768, description="Default completion length when the spec's sampling does not set one."
    )

    @model_validator(mode="after")
    def _shots_available(self) -> Recipe:
        if self.few_shot and not self.shots and self.shots_from is None:
            raise FieldError("few_shot", f"few_shot={self.few_shot} needs 'shots' or 'shots_from': give one, or set 0")
        if self.shots and self.few_shot > len(self.shots):
            raise FieldError(
                "few_shot", f"few_shot={self.few_shot} is more than the {len(self.shots)} shots given: lower it"
            )
        if "{question}" not in self.question:
            raise FieldError("question", "the question template must hold '{question}'")
        check_regex("answer_pattern", self.answer_pattern, group=True)
        return self

    def digest(self, chat_template: str | None = None) -> str:
        """Identifies the exact recipe (and the chat template it went through) a score was made with."""
        body = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        extra = chat_template if self.format == "chat" else ""
        return hashlib.sha256(f"{body}\0{extra or ''}".encode()).hexdigest()[:16]
