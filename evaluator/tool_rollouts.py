"""Multi-turn rollouts with a tool, on any generation backend (evaluator/backends: the same
`generate` every job calls): each turn generates for every open rollout until the format's call
stop; a turn that ends with a code block is called (evaluator/python_tool.py, the calls of a turn
as one batch), its output appended, and the rollout goes on; a turn without one is the rollout's
answer. After `max_calls` calls a rollout's next turn has no call stop: it must answer."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from evaluator.backends.base import Backend, Generation
from evaluator.python_tool import PythonTool
from evaluator.tool_formats import ToolFormat


@dataclass
class Rollout:
    prompt: str
    text: str = ""  # the model's turns and the tool's outputs, in order: the completion
    turns: list[dict[str, Any]] = field(default_factory=list)  # per call {code, output, error}, then {answer}
    tokens: int = 0  # the model's tokens, every turn's
    truncated: bool = False  # a turn hit max_new_tokens
    done: bool = False


def generate_with_tools(
    engine: Backend,
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    tool: PythonTool,
    fmt: ToolFormat,
    max_calls: int,
    max_new_tokens: int,
    stop: list[str],
    temperature: float,
    top_p: float,
    n: int,
    seed: int,
    batch_size: int,
    on_batch: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[list[list[Generation]], float]:
    """For each prompt its n rollouts as Generations (text: the whole rollout, its tool outputs
    included; `tool_turns`: each call, then the last turn as {answer}), and the seconds the calls'
    batches took (what the calls did is read off the turns: evaluator/scoring.py tool_metrics)."""
    tool_seconds = 0.0
    first = engine.generate(
        model, tokenizer, prompts, max_new_tokens=max_new_tokens, stop=[*stop, fmt.call_stop], temperature=temperature,
        top_p=top_p, n=n, seed=seed, batch_size=batch_size, on_batch=on_batch, should_stop=should_stop,
    )  # fmt: skip
    rollouts = [[Rollout(p) for _ in gens] for p, gens in zip(prompts, first, strict=True)]
    turn_gens = [g for gens in first for g in gens]
    open_ = [r for rs in rollouts for r in rs]
    for call_round in range(max_calls + 1):
        calls: list[tuple[Rollout, str]] = []
        for r, g in zip(open_, turn_gens, strict=True):
            r.text += g.text
            r.tokens += g.tokens
            r.truncated = r.truncated or g.truncated
            code = None if g.truncated or call_round == max_calls else fmt.call_in(g.text)
            if code is None:  # its answer (or what it wrote instead): the last of its turns
                r.done = True
                r.turns.append({"answer": g.text})
            else:
                calls.append((r, code))
        if not calls or (should_stop is not None and should_stop()):
            break
        t0 = time.monotonic()
        results = tool.run([(code, [t["code"] for t in r.turns if "code" in t]) for r, code in calls])
        tool_seconds += time.monotonic() - t0
        for (r, code), res in zip(calls, results, strict=True):
            output = res.text(tool.limits)
            r.turns.append({"code": code, "output": output, "error": res.error})
            r.text += fmt.returned(r.text, output)
        open_ = [r for r, _ in calls]
        last = call_round + 1 == max_calls  # the turn after the last call answers: no call stop
        gens = engine.generate(
            model, tokenizer, [r.prompt + r.text for r in open_], max_new_tokens=max_new_tokens,
            stop=list(stop) if last else [*stop, fmt.call_stop], temperature=temperature, top_p=top_p, n=1,
            seed=seed + call_round + 1, batch_size=batch_size, should_stop=should_stop,
        )  # fmt: skip
        turn_gens = [g[0] for g in gens]
    out = [
        [
            Generation(r.text, r.tokens, r.truncated, tool_turns=r.turns, answer_text=fmt.without_outputs(r.text))
            for r in rs
        ]
        for rs in rollouts
    ]
    return out, tool_seconds
