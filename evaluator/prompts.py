"""Prompt templates. The GSM8K prompt asks for the '####' line the grader reads; the MATH
prompt asks for a \\boxed{} answer."""

from __future__ import annotations

import hashlib
from typing import Any

TEMPLATES: dict[str, dict[str, str]] = {
    "gsm8k": {
        "system": "You are a careful math tutor. Solve the problem step by step.",
        "user": (
            "{question}\n\nThink step by step, then give the final answer as a number "
            "on its own line in the form '#### <answer>'."
        ),
    },
    "math": {
        "system": "You are a careful math tutor. Solve the problem step by step.",
        "user": "{question}\n\nReason step by step, and put your final answer within \\boxed{{}}.",
    },
    "plain": {"system": "", "user": "{question}"},
    "arith-words": {"system": "", "user": "What is {question}? Give the final answer as a number."},
}


def messages(
    template: str, question: str, system_prompt: str | None = None, shots: list[tuple[str, str]] | None = None
) -> list[dict[str, str]]:
    """The prompt as chat messages (system, few-shot turns, the question)."""
    t = TEMPLATES[template]
    system = t["system"] if system_prompt is None else system_prompt
    turns: list[dict[str, str]] = []
    if system:
        turns.append({"role": "system", "content": system})
    for q, a in shots or []:
        turns.append({"role": "user", "content": t["user"].format(question=q)})
        turns.append({"role": "assistant", "content": a})
    turns.append({"role": "user", "content": t["user"].format(question=question)})
    return turns


def render(
    template: str,
    question: str,
    tokenizer: Any | None,
    system_prompt: str | None = None,
    shots: list[tuple[str, str]] | None = None,
) -> str:
    """The full prompt string: through the tokenizer's chat template when it has one."""
    turns = messages(template, question, system_prompt, shots)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        text: str = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        return text
    parts = [f"{m['content']}\n" if m["role"] != "assistant" else f"{m['content']}\n\n" for m in turns]
    return "".join(parts)


def template_hash(template: str, system_prompt: str | None, few_shot: int, chat_template: str | None) -> str:
    """Identifies the exact prompt recipe a score was made with."""
    h = hashlib.sha256()
    for part in (repr(TEMPLATES[template]), repr(system_prompt), str(few_shot), chat_template or ""):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]
