"""How a model calls a tool, as data beside the prompt recipes (evaluator/recipes.py): where its call
ends (the stop string), how its code is found in the turn, how the output comes back into the
context, and what the prompt tells the model. `code-blocks` is ToRL's and Qwen2.5-Math-TIR's: a
```python block, then ```output, at which generation stops; the tool's output follows as an output
block, and the model goes on after it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from mathrl.recipe import Recipe


@dataclass(frozen=True)
class ToolFormat:
    name: str
    call_stop: str  # generation stops here: the turn's call is complete
    code: re.Pattern[str]  # the turn's last match's group 1 is the code the call runs
    output: str  # how a call's output comes back: '{output}' is replaced
    instruction: str  # what the prompt tells the model, after the recipe's system text

    def call_in(self, turn: str) -> str | None:
        """The code a model turn calls, if it ends with a complete code block; else None (its answer)."""
        found = list(self.code.finditer(turn))
        if not found or turn[found[-1].end() :].strip():
            return None
        return found[-1].group(1)

    def returned(self, turn: str, output: str) -> str:
        """The text after the turn (cut at call_stop) that carries the call's output back."""
        return ("" if turn.endswith("\n") else "\n") + self.output.format(output=output)

    def recipe_for(self, recipe: Recipe) -> Recipe:
        """The recipe with the tool's instruction after its system text (a chat's system turn, a text
        recipe's description). The call's stop string is the rollout loop's to add (a rollout's last
        turn goes without it: evaluator/tool_rollouts.py)."""
        system = f"{recipe.system}\n\n{self.instruction}" if recipe.system else self.instruction
        if recipe.format == "text":
            system += "\n\n"
        return recipe.model_copy(update={"system": system})

    def without_outputs(self, text: str) -> str:
        """The model's own words of a rollout: the tool's output blocks taken out (what is graded)."""
        head, _, tail = self.output.partition("{output}")
        return re.sub(re.escape(head) + r".*?" + re.escape(tail), "\n", text, flags=re.S)


FORMATS = {
    "code-blocks": ToolFormat(
        name="code-blocks",
        call_stop="```output",
        code=re.compile(r"```python\n(.*?)```", re.S),
        output="```output\n{output}\n```\n",
        instruction=(
            "You may run Python to compute: write the code in a ```python block and end it with ```output. "
            "Its printed output is then shown to you in an output block, and you go on from there. "
            "Give the final answer in words after the last output."
        ),
    ),
}
