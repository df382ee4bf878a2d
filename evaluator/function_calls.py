"""A chat's functions (OpenAI's `tools` on chat completions, a generate job's `function_tools`): offered
to the model through its chat template, and the calls it writes read back with TRL's response parser
(the same reader the python tool's 'chat-template' format uses, evaluator/tool_formats.py). The caller
runs the functions and sends their results back as tool messages, which the template renders."""

from __future__ import annotations

import json
import secrets
from typing import Any

from mathrl.errors import FieldError

FIX = "use a model whose chat template carries tools (Qwen2.5, Qwen3, SmolLM3), or call without tools"


def check_template(tokenizer: Any, field: str = "tools", fix: str = FIX) -> None:
    """Refuse a model whose chat template cannot render tool calls, or whose calls TRL cannot read (a
    FieldError at `field` saying `fix`)."""
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    if not supports_tool_calling(tokenizer):
        raise FieldError(field, f"the model's chat template renders no tool calls: {fix}")
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            add_response_schema(tokenizer)
        except ValueError:
            raise FieldError(field, f"TRL has no response parser for this model's chat template: {fix}") from None


def read_calls(tokenizer: Any, text: str, tools: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The answer's text and the function calls in it, as OpenAI's message has them (`tool_calls`: an id
    each, the arguments as JSON text). A call to a function not offered stays in the text."""
    from trl.chat_template_utils import parse_response

    eos = getattr(tokenizer, "eos_token", None) or ""
    ids = tokenizer(text + eos, add_special_tokens=False).input_ids
    offered_tools: list[Any] = list(tools)
    parsed = parse_response(tokenizer, ids, prefix=[], tools=offered_tools)
    offered = {t["function"]["name"] for t in tools}
    calls = []
    for call in parsed.get("tool_calls") or []:
        function = call.get("function") or {}
        name, args = function.get("name"), function.get("arguments")
        if name not in offered:
            return text, []
        calls.append(
            {
                "id": "call_" + secrets.token_hex(12),
                "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
        )
    if not calls:
        return text, []
    return str(parsed.get("content") or "").strip(), calls
