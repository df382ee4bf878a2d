"""GRPO with a tool: multi-turn rollouts as TRL's `rollout_func` (`ToolRollouts`), on the trainer's own
engine (the hf policy, `static` on its decode copy, or the colocated vLLM engine).

The turns are evaluator/tool_rollouts.py's `run_turns` over token ids (`TokenRollout`): each turn's
ids are kept as sampled, cut just past the call stop (`cut_at`); the call's output comes back as
tokens kept out of the loss (`env_mask`, TRL's `tool_mask`); `max_completion_length` is the whole
rollout's budget; the graded text is the model's own words (`answer_text`); a void rollout is kept,
dropped or penalised (`void_turns`, `VoidTurnPenalty`). How each works, and why TRL's own tool loop
is not used: docs/tools.md, "GRPO with the tool"."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from evaluator.backends.base import Generation
from evaluator.grading import extract_answer
from evaluator.python_tool import Tool
from evaluator.scoring import is_void, tool_metrics
from evaluator.tool_formats import ToolFormat
from evaluator.tool_rollouts import Rollout, Turn, run_turns
from mathrl.specs.tools import Tools


@dataclass
class TokenRollout(Rollout):
    """A rollout as token ids: the model's (mask 1, with their sampler log-probabilities) and the
    tool's (mask 0), within `budget` tokens in all."""

    budget: int = 0
    context: list[int] = field(default_factory=list)  # the prompt's ids
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tokenizer: Any = None
    call_stop: str = ""

    def receive(self, text: str) -> None:
        super().receive(text)
        after_stop = text.split(self.call_stop, 1)[-1]  # the model's own ids end with the stop
        ids = self.tokenizer(after_stop, add_special_tokens=False).input_ids[: self.budget - len(self.ids)]
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        if len(self.ids) >= self.budget:  # the output spent the rollout's budget: it ends here, cut
            self.done = self.truncated = True


def cut_at(ids: list[int], tokenizer: Any, stop: str) -> tuple[int, str] | None:
    """The fewest of `ids` whose text holds `stop`, and their text before it; None if it never does."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if stop not in text:
        return None
    lo, hi = 1, len(ids)  # holding the stop grows with the prefix: the first prefix that does
    while lo < hi:
        mid = (lo + hi) // 2
        if stop in tokenizer.decode(ids[:mid], skip_special_tokens=True):
            hi = mid
        else:
            lo = mid + 1
    head = tokenizer.decode(ids[:lo], skip_special_tokens=True)
    return lo, head[: head.index(stop)]


class ToolRollouts:
    """TRL's `rollout_func` for a GRPO job with `tools`: `(prompts, trainer) -> {prompt_ids,
    completion_ids, logprobs, env_mask, answer_text, void_turn}`, a rollout per prompt row (TRL's
    sampler has already repeated each question for its group)."""

    def __init__(self, tool: Tool, fmt: ToolFormat, tools: Tools) -> None:
        self.tool, self.fmt, self.tools = tool, fmt, tools

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, Any]:
        tokenizer = trainer.processing_class
        prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
        budget = int(trainer.max_completion_length)
        rollouts = [
            TokenRollout(p, budget=budget, context=list(ids), tokenizer=tokenizer, call_stop=self.fmt.call_stop)
            for p, ids in zip(prompts, prompt_ids, strict=True)
        ]
        gen_seconds = [0.0]

        def turns(open_: list[TokenRollout], may_call: bool) -> list[Turn]:
            g0 = time.perf_counter()
            out = self._turns(trainer, open_, may_call)
            gen_seconds[0] += time.perf_counter() - g0
            return out

        first = turns(rollouts, True)
        tool_seconds = run_turns(
            rollouts, first, turns, tool=self.tool, fmt=self.fmt, max_calls=self.tools.python.max_calls
        )
        answers = [self.fmt.without_outputs(r.text) for r in rollouts]
        found = [extract_answer(a, r.truncated) for a, r in zip(answers, rollouts, strict=True)]
        gens = [Generation(r.text, r.tokens, r.truncated, tool_turns=r.turns) for r in rollouts]
        void = [is_void(g, a) for g, a in zip(gens, found, strict=True)]
        if self.tools.void_turns == "drop":
            for r, v in zip(rollouts, void, strict=True):
                if v:
                    r.mask = [0] * len(r.mask)
        self._log(trainer, gens, found, tool_seconds, gen_seconds[0])
        any_logprobs = trainer.use_vllm
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": [r.ids for r in rollouts],
            "logprobs": [r.logprobs for r in rollouts] if any_logprobs else None,
            "env_mask": [r.mask for r in rollouts],
            "answer_text": answers,
            "void_turn": void,
        }

    def _turns(self, trainer: Any, open_: list[TokenRollout], may_call: bool) -> list[Turn]:
        """Each open rollout's next turn, generated on the trainer's engine from its context's ids."""
        stops = self.fmt.stops(may_call)
        stop = stops[0] if stops else None  # the chat template's turn ends at its end of sequence
        room = [r.budget - len(r.ids) for r in open_]
        contexts = [r.context + r.ids for r in open_]
        ids, logprobs = generate_turn(trainer, contexts, max(room), stop)
        eos = set(trainer.eos_token_ids)
        tokenizer = trainer.processing_class
        out: list[Turn] = []
        sampled: list[list[float] | None] = list(logprobs) if logprobs is not None else [None] * len(ids)
        for r, row, lps, left in zip(open_, ids, sampled, room, strict=True):
            cut = cut_at(row, tokenizer, stop) if stop else None
            if cut is not None and cut[0] <= left:
                keep, text, truncated, final = cut[0], cut[1], False, False
            else:
                keep = min(len(row), left)
                ended = keep > 0 and row[keep - 1] in eos
                text = tokenizer.decode(row[:keep], skip_special_tokens=True)
                truncated, final = not ended, ended
            r.ids += row[:keep]
            r.mask += [1] * keep
            r.logprobs += list(lps[:keep]) if lps is not None else [0.0] * keep
            out.append(Turn(text, keep, truncated=truncated, final=final))
        return out

    def _log(self, trainer: Any, gens: list[Generation], found: list[str | None], tool_s: float, gen_s: float) -> None:
        mode = "train" if trainer.model.training else "eval"
        metrics = trainer._metrics[mode]
        for name, value in tool_metrics(list(zip(gens, found, strict=True))).items():
            metrics[name].append(value)
        metrics["tool/seconds"].append(tool_s)
        timings = getattr(trainer, "timings", None)
        if timings is not None and mode == "train":  # read per step by trainer/callbacks.py
            timings["generation_seconds"] += gen_s
            timings["tool_seconds"] += tool_s
            timings["generated_tokens"] += float(sum(g.tokens for g in gens))
            timings["generated_completions"] += float(len(gens))


def generate_turn(
    trainer: Any, contexts: list[list[int]], max_new_tokens: int, stop: str | None
) -> tuple[list[list[int]], list[list[float]] | None]:
    """One turn for each context (token ids) on the trainer's engine, sampling as its rollouts do:
    the new ids (past `stop`, where one is written, and to the end of sequence), and with vLLM their
    log-probabilities."""
    max_new_tokens = max(1, max_new_tokens)
    if trainer.use_vllm:
        gen = trainer.vllm_generation
        saved = gen.generation_kwargs
        extra = {"stop": [stop], "include_stop_str_in_output": True} if stop else {}
        gen.generation_kwargs = {**(saved or {}), "max_tokens": max_new_tokens, **extra}
        try:
            _, ids, logprobs, _ = gen.generate(prompts=contexts, images=None, num_generations=1)
        finally:
            gen.generation_kwargs = saved
        return [list(x) for x in ids], [[lp[0] for lp in seq] for seq in logprobs]
    from trl.models import unwrap_model_for_generation

    from trainer.hf_generation import decode

    decoding = {**trainer._decoding(), "max_new_tokens": max_new_tokens}
    stops = {"stop_strings": [stop], "tokenizer": trainer.processing_class} if stop else {}
    pad = trainer.processing_class.pad_token_id
    if trainer.hf_mode == "static":
        trainer._sync_decode_copy()
        return decode(trainer._decode_copy.model, contexts, pad_token_id=pad, **decoding, **stops), None
    with unwrap_model_for_generation(
        trainer.model_wrapped,
        trainer.accelerator,
        gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
        gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
    ) as model:
        return decode(model, contexts, pad_token_id=pad, **decoding, **stops), None


class VoidTurnPenalty:
    """The reward `void_turns: penalize` adds: -penalty for a void rollout, 0 for any other."""

    def __init__(self, penalty: float) -> None:
        self.penalty = penalty
        self.__name__ = "void_turn"

    def __call__(self, completions: list[Any], void_turn: list[bool] | None = None, **_: Any) -> list[float]:
        if void_turn is None:  # a held-out reward set, scored without the rollout loop
            return [0.0] * len(completions)
        return [-self.penalty if v else 0.0 for v in void_turn]
