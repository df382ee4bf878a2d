"""Multi-turn rollouts with a tool: the one loop, for eval jobs and for GRPO (`run_turns`).

Each turn generates for every open rollout until the format's call stop; a turn that ends with a
code block is called (evaluator/python_tool.py, the calls of a turn as one batch), its output
appended, and the rollout goes on; a turn without one is the rollout's answer. After `max_calls`
calls a rollout's next turn has no call stop. What generates a turn is the caller's: eval jobs
generate text on any backend (`generate_with_tools`); GRPO generates token ids on the trainer's own
engine (trainer/tool_grpo.py). docs/tools.md."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from evaluator.backends.base import Decoding, Generation, Generator
from evaluator.python_tool import Tool
from evaluator.tool_formats import ToolFormat

# the tokens a call's output may take beyond its characters: the format's text around it (a code
# block's fence, or the chat template's tool message and the next assistant header) and the note
# of why it stopped
TOOL_OUTPUT_MARGIN = 128


@dataclass
class Rollout:
    prompt: str
    text: str = ""  # the model's turns and the tool's outputs, in order: the completion
    turns: list[dict[str, Any]] = field(default_factory=list)  # per call {code, output, error}, then {answer}
    tokens: int = 0  # the model's tokens, every turn's
    truncated: bool = False  # a turn hit its token limit
    done: bool = False

    def receive(self, text: str) -> None:
        """A call's output comes back into the context (a token rollout also counts it: trainer/tool_grpo.py)."""
        self.text += text


@dataclass(frozen=True)
class Turn:
    """What the model wrote in one turn: its words (without the call stop), its token count, and
    whether it hit its token limit or ended its rollout whatever it holds (an end of sequence)."""

    text: str
    tokens: int
    truncated: bool = False
    final: bool = False


# (the open rollouts, whether their turn may call) -> each one's next turn
NextTurns = Callable[[list[Any], bool], list[Turn]]


def run_turns(
    rollouts: list[Any],
    first: list[Turn],
    next_turns: NextTurns,
    *,
    tool: Tool,
    fmt: ToolFormat,
    max_calls: int,
    should_stop: Callable[[], bool] | None = None,
) -> float:
    """Run `rollouts` (each a Rollout, given its first turn) to their ends; the seconds the calls'
    batches took. A rollout's `turns` then hold each call, and its last turn as {answer}."""
    tool_seconds = 0.0
    open_, turns = list(rollouts), first
    for call_round in range(max_calls + 1):
        calls: list[tuple[Rollout, str]] = []
        for r, t in zip(open_, turns, strict=True):
            r.text += t.text
            r.tokens += t.tokens
            r.truncated = r.truncated or t.truncated
            ended = t.final and not fmt.calls_at_end  # an end of sequence ends a code-block rollout
            code = None if t.truncated or ended or call_round == max_calls else fmt.call_in(t.text)
            if code is None:  # its answer (or what it wrote instead): the last of its turns
                r.done = True
                last: dict[str, Any] = {"answer": t.text}
                if fmt.holds_call(t.text):  # a call past max_calls or cut short: never run, yet no void turn
                    last["unrun_call"] = True
                r.turns.append(last)
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
            r.receive(fmt.returned(r.text, output))
        open_ = [r for r, _ in calls if not r.done]  # a token rollout whose budget the output spent is done
        if not open_:
            break
        turns = next_turns(open_, call_round + 1 < max_calls)  # the turn after the last call answers
    return tool_seconds


def generate_with_tools(
    gen: Generator,
    prompts: list[str],
    decoding: Decoding,
    *,
    tool: Tool,
    fmt: ToolFormat,
    max_calls: int,
    on_batch: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[list[list[Generation]], float]:
    """For each prompt its n rollouts as Generations (text: the whole rollout, its tool outputs
    included; `tool_turns`: each call, then the last turn as {answer}), and the seconds the calls'
    batches took (what the calls did is read off the turns: evaluator/scoring.py tool_metrics).
    `decoding.max_new_tokens` is per model turn. Where the generator's length is bounded (a vLLM
    engine's max_model_len), a turn is cut to the room its context leaves, and a rollout whose
    context fills it ends there, truncated, without asking the engine."""
    max_len, tokenizer, n = gen.max_model_len, gen.tokenizer, decoding.n

    def turns(texts: list[str], may_call: bool, n: int, seed: int, on_batch: Any = None) -> list[list[Generation]]:
        """Each text's n generations, each group of texts asking for what its room allows."""
        d = decoding.but(stop=(*decoding.stop, *fmt.stops(may_call)), n=n, seed=seed)
        if max_len is None:
            return gen.generate(texts, d, on_batch=on_batch, should_stop=should_stop)
        rooms = [max_len - len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts]
        out: list[list[Generation]] = [[Generation("", 0, True)] * n for _ in texts]  # no room: cut here
        for budget in sorted({min(d.max_new_tokens, r) for r in rooms if r > 0}, reverse=True):
            at = [i for i, r in enumerate(rooms) if r > 0 and min(d.max_new_tokens, r) == budget]
            made = gen.generate([texts[i] for i in at], d.but(max_new_tokens=budget), should_stop=should_stop)
            for i, g in zip(at, made, strict=True):
                out[i] = g  # a turn cut at its room reads as truncated (its length), so its rollout ends
        if on_batch is not None:
            on_batch(len(texts), len(texts))
        return out

    first = turns(prompts, True, n, decoding.seed, on_batch)
    rollouts = [[Rollout(p) for _ in gens] for p, gens in zip(prompts, first, strict=True)]
    rounds = [0]

    def next_turns(open_: list[Rollout], may_call: bool) -> list[Turn]:
        rounds[0] += 1
        gens = turns([r.prompt + r.text for r in open_], may_call, 1, decoding.seed + rounds[0])
        return [Turn(g[0].text, g[0].tokens, g[0].truncated) for g in gens]

    tool_seconds = run_turns(
        [r for rs in rollouts for r in rs],
        [Turn(g.text, g.tokens, g.truncated) for gens in first for g in gens],
        next_turns,
        tool=tool,
        fmt=fmt,
        max_calls=max_calls,
        should_stop=should_stop,
    )
    out = [
        [
            Generation(r.text, r.tokens, r.truncated, tool_turns=r.turns, answer_text=fmt.without_outputs(r.text))
            for r in rs
        ]
        for rs in rollouts
    ]
    return out, tool_seconds
