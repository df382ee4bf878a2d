"""How a model calls a tool, as data beside the prompt recipes (evaluator/recipes.py): where its call
ends, how its code is found in the turn, how the output comes back into the context, and what the
prompt tells the model (`ToolFormat`, FORMATS, `tool_format`). Two formats:

- `code-blocks`, ToRL's and Qwen2.5-Math-TIR's: a ```python block, then ```output, at which
  generation stops; the output follows as an output block;
- `chat-template`, the model's own tool calls (`ChatToolCalls`, bound to the model's tokenizer): the
  prompt carries `PYTHON_SCHEMA`, TRL's response parser finds the call, and the output comes back as
  the template's tool message.

docs/tools.md."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mathrl.errors import FieldError
from mathrl.recipe import Recipe


@dataclass(frozen=True)
class ToolFormat:
    name: str
    call_stop: str  # generation stops here: the turn's call is complete
    code: re.Pattern[str]  # the turn's last match's group 1 is the code the call runs
    output: str  # how a call's output comes back: '{output}' is replaced
    instruction: str  # what the prompt tells the model, after the recipe's system text
    chat_tools: list[dict[str, Any]] | None = None  # the tools a chat template renders in the prompt
    calls_at_end: bool = False  # a turn that ends its sequence may still call (the chat template's)

    def stops(self, may_call: bool) -> list[str]:
        """The stop strings a turn generates with: the call's, while it may still call."""
        return [self.call_stop] if may_call else []

    def for_tokenizer(self, tokenizer: Any) -> ToolFormat:
        """The format for a model's tokenizer (code blocks are plain text: the same for any)."""
        return self

    def call_in(self, turn: str) -> str | None:
        """The code a model turn calls, if it ends with a complete code block; else None (its answer)."""
        found = list(self.code.finditer(turn))
        if not found or turn[found[-1].end() :].strip():
            return None
        return found[-1].group(1)

    def holds_call(self, turn: str) -> bool:
        """Whether the turn writes a call, complete or not (one that is not run is no void turn)."""
        return "```python" in turn

    def returned(self, turn: str, output: str) -> str:
        """The text after the turn (cut at call_stop) that carries the call's output back."""
        return ("" if turn.endswith("\n") else "\n") + self.output.format(output=output)

    def write_trace(self, calls: list[tuple[str, str]], answer: str) -> str:
        """A worked answer in this format: each (code, output) call, then the answer (SFT on traces)."""
        return "".join(f"```python\n{code}\n```\n" + self.returned("\n", out) for code, out in calls) + answer

    def read_trace(self, text: str) -> tuple[list[tuple[str, str]], str] | None:
        """A code-block trace's calls and answer (what `write_trace` wrote); None for any other text."""
        pattern = re.compile(r"```python\n(.*?)\n```\n```output\n(.*?)\n```\n", re.S)
        calls, at = [], 0
        while (m := pattern.match(text, at)) is not None:
            calls.append((m.group(1), m.group(2)))
            at = m.end()
        return (calls, text[at:]) if calls else None

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


PYTHON_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code in a fresh interpreter and see what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to run; print what you need."}},
            "required": ["code"],
        },
    },
}
SENTINEL = "tool_output_5f1c9e"  # what the template renders in place of a call's output


class ChatToolCalls(ToolFormat):
    """The model's chat template's own tool calls, bound to its tokenizer (`for_tokenizer`)."""

    tokenizer: Any

    def __init__(self, tokenizer: Any = None) -> None:
        super().__init__(
            name="chat-template",
            call_stop=getattr(tokenizer, "eos_token", None) or "",
            code=re.compile(r"(?!)"),
            output="",
            instruction="Call the python tool to compute, then give the final answer in words after its output.",
            chat_tools=[PYTHON_SCHEMA],
            calls_at_end=True,
        )
        object.__setattr__(self, "tokenizer", tokenizer)
        if tokenizer is not None:
            object.__setattr__(self, "output", _tool_message_suffix(tokenizer))

    def stops(self, may_call: bool) -> list[str]:
        return []  # a turn ends at the model's end of sequence, as a chat turn does

    def for_tokenizer(self, tokenizer: Any) -> ToolFormat:
        return ChatToolCalls(tokenizer)

    def call_in(self, turn: str) -> str | None:
        """The code of the turn's first python call (TRL's response parser, the template's own); None:
        no call, another tool's, or arguments that are not {"code": <text>} (the turn is the answer)."""
        from trl.chat_template_utils import parse_response

        tok = self.tokenizer
        ids = tok(turn + self.call_stop, add_special_tokens=False).input_ids
        # TRL's wrapper reads it as text where the parser cannot (malformed JSON: no call); the prompt's
        # part of the turn (an assistant header, a <think> the template opens) is not in `turn`
        tools: list[Any] = list(self.chat_tools or [])
        parsed = parse_response(tok, ids, prefix=[], tools=tools)
        for call in parsed.get("tool_calls") or []:
            function = call.get("function") or {}
            args = function.get("arguments")
            if function.get("name") == "python" and isinstance(args, dict) and isinstance(args.get("code"), str):
                return str(args["code"])
        return None

    def holds_call(self, turn: str) -> bool:
        return self.call_in(turn) is not None

    def returned(self, turn: str, output: str) -> str:
        """The end of the model's turn, the tool message holding `output`, and the next assistant header."""
        return self.call_stop + self.output.replace(SENTINEL, output)

    def write_trace(self, calls: list[tuple[str, str]], answer: str) -> str:
        """Each call as the template writes an assistant's tool call, its output as the tool message, then
        the answer: the text the model would have written and been shown."""
        return "".join(self._call_text(code) + self.output.replace(SENTINEL, out) for code, out in calls) + answer

    def _call_text(self, code: str) -> str:
        """An assistant turn holding one python call, to its end of sequence, as the template renders it."""
        tok = self.tokenizer
        user = [{"role": "user", "content": "q"}]
        call = [{"type": "function", "function": {"name": "python", "arguments": {"code": code}}}]
        head = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True, tools=self.chat_tools)
        whole = tok.apply_chat_template(
            [*user, {"role": "assistant", "content": "", "tool_calls": call}],
            tokenize=False,
            add_generation_prompt=False,
            tools=self.chat_tools,
        )
        turn = str(whole)[len(str(head)) :]
        return turn[: turn.rfind(self.call_stop) + len(self.call_stop)]

    def recipe_for(self, recipe: Recipe) -> Recipe:
        if recipe.format != "chat":
            raise FieldError(
                "tools/format",
                "format 'chat-template' renders the prompt through the model's chat template: use a chat recipe, "
                "or format 'code-blocks'",
            )
        return super().recipe_for(recipe)

    def without_outputs(self, text: str) -> str:
        head, _, tail = (self.call_stop + self.output).partition(SENTINEL)
        return re.sub(re.escape(head) + r".*?" + re.escape(tail), "\n", text, flags=re.S)


def _tool_message_suffix(tokenizer: Any) -> str:
    """What the chat template writes after an assistant's tool call, past its end of sequence: the
    tool message (its content SENTINEL) and the next assistant header (TRL's `_get_tool_suffix_ids`,
    as text). Refuses a template that cannot carry the calls, or whose calls TRL cannot parse."""
    from evaluator.function_calls import check_template

    fix = "use format 'code-blocks', or a model whose chat template carries tools (Qwen2.5, Qwen3, SmolLM3)"
    check_template(tokenizer, "tools/format", fix)
    call = [{"type": "function", "function": {"name": "python", "arguments": {"code": "print(1)"}}}]
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": call}]
    prefix = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False, tools=[PYTHON_SCHEMA])
    full = tokenizer.apply_chat_template(
        [*chat, {"role": "tool", "name": "python", "content": SENTINEL}],
        tokenize=False,
        add_generation_prompt=True,
        tools=[PYTHON_SCHEMA],
    )
    eos = tokenizer.eos_token or ""
    end = prefix.rfind(eos) if eos else -1
    if end < 0 or not full.startswith(prefix[: end + len(eos)]) or SENTINEL not in full:
        raise FieldError(
            "tools/format", f"the model's chat template does not end a tool call with its end of sequence: {fix}"
        )
    return str(full)[end + len(eos) :]


def tool_format(name: str, tokenizer: Any) -> ToolFormat:
    """The format `name` for the model of `tokenizer` (`chat-template` reads its template)."""
    return FORMATS[name].for_tokenizer(tokenizer)


FORMATS: dict[str, ToolFormat] = {
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
FORMATS["chat-template"] = ChatToolCalls()
