"""Tools a job's rollouts may call (`tools` on eval and GRPO jobs): today a python interpreter, behind
the python graders' sandbox, in code blocks or the chat template's own calls (evaluator/tool_formats.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mathrl.errors import FieldError
from mathrl.specs.base import StrictModel

TOOL_FORMATS = ("code-blocks", "chat-template")  # evaluator/tool_formats.py FORMATS: the test holds the two equal


class PythonTool(StrictModel):
    max_calls: int = Field(4, ge=1, le=16, description="Calls a rollout may make; the turn after the last has none.")
    timeout_s: float = Field(5.0, gt=0.0, le=60.0, description="Wall seconds a call may run; then it is stopped.")
    max_output_chars: int = Field(
        1024, ge=16, le=16384, description="What of a call's output goes back into the context, in characters."
    )


class Tools(StrictModel):
    python: PythonTool = Field(default_factory=PythonTool, description="A python interpreter, a fresh state a call.")
    format: Literal["code-blocks", "chat-template"] = Field(
        "code-blocks",
        description="How the model calls it: 'code-blocks', a ```python block, then ```output (ToRL's and "
        "Qwen2.5-Math-TIR's format), the output coming back as an output block; 'chat-template', the model's "
        "own tool calls, for models whose chat template carries tools (Qwen2.5, Qwen3, SmolLM3): the prompt holds "
        "the python tool's schema, and the output comes back as the template's tool message. Needs a chat recipe.",
    )
    void_turns: Literal["keep", "drop", "penalize"] = Field(
        "keep",
        description="GRPO only. A void rollout ends with a turn holding neither a code block nor an answer "
        "(SimpleTIR's void turn): 'keep' trains on it as any other; 'drop' leaves it out of the loss (SimpleTIR); "
        "'penalize' adds -void_turn_penalty to its reward.",
    )
    void_turn_penalty: float = Field(
        1.0, gt=0.0, le=10.0, description="GRPO only: what void_turns='penalize' takes off a void rollout's reward."
    )

    @model_validator(mode="after")
    def _penalty_needs_penalize(self) -> Tools:
        if self.void_turn_penalty != 1.0 and self.void_turns != "penalize":
            raise FieldError(
                "void_turn_penalty", "void_turn_penalty is for void_turns='penalize': set it or drop the penalty"
            )
        return self
