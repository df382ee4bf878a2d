"""Held-out evaluation during training (a spec's `eval`): `HeldoutEvalCallback` scores the weights
being trained every `every` optimizer steps and after the last.

With `eval: {benchmark, limit}` the benchmark's first `limit` problems are answered greedily and
graded as eval jobs grade: the series `heldout/accuracy`, `heldout/ci_low`, `heldout/ci_high`,
`heldout/seconds`, and a `heldout` event. With `eval: {file}` (OpenAI's validation file) the job's
own rewards score the answers: `heldout/reward`. It generates through `backend(name)`, as eval jobs
do: `vllm` on a GRPO job's colocated engine where it has one, else `hf` on the trained model; the
time is kept out of the step's. docs/grpo-loop.md, "Held-out evaluation during training"."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from evaluator import prompts
from evaluator.benchmarks import get_benchmark
from evaluator.data import load_benchmark, load_custom_set
from evaluator.grading import grade
from evaluator.metrics import wilson_interval
from evaluator.recipes import RECIPES
from mathrl.specs import DatasetRef, HeldoutEval
from runtime.sink import Sink
from trainer.data import item_column, render_prompt

if TYPE_CHECKING:
    from evaluator.backends import Generator


class HeldoutEvalCallback(TrainerCallback):
    def __init__(
        self,
        spec: HeldoutEval,
        sink: Sink,
        tokenizer: Any,
        data_dir: str | None,
        rewards: tuple[list[Any], list[float]] | None = None,
        tooling: Any = None,
    ) -> None:
        """`rewards`: the GRPO job's reward functions and weights, which score an `eval.file` set;
        `tooling`: a tool job's (trainer/grpo.py ToolSetup): its held-out answers call the tool too."""
        self.spec, self.sink, self.tokenizer = spec, sink, tokenizer
        self.rewards = rewards
        self.tooling = tooling
        if spec.file is not None:
            if rewards is None:
                raise ValueError("eval.file is scored by a GRPO job's rewards: this job has none")
            self.name = spec.file
            self.recipe = RECIPES["math-chat"]
            path = spec._path or spec.file
            self.problems = load_custom_set(DatasetRef(path=path, format="messages"), spec.limit)
            chat_tools = tooling.fmt.chat_tools if tooling is not None else None
            self.texts = [render_prompt(p, "math-chat", tokenizer, chat_tools) for p in self.problems]
        else:
            assert spec.benchmark is not None
            bench = get_benchmark(spec.benchmark)
            self.name, self.recipe = bench.name, RECIPES[bench.recipe]
            if tooling is not None:  # the prompt tells the model how to call the tool, as in training
                self.recipe = tooling.fmt.recipe_for(self.recipe)
            self.problems = load_benchmark(bench, data_dir, spec.limit)
            chat_tools = tooling.fmt.chat_tools if tooling is not None else None
            self.texts = [prompts.render(self.recipe, p.question, tokenizer, tools=chat_tools) for p in self.problems]
        self._longest: int | None = None
        self.trainer: Any = None  # set once the trainer is built
        self.series: list[dict[str, float]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        step = state.global_step
        if step % self.spec.every == 0 or step == state.max_steps:
            self.score(step)

    def score(self, step: int) -> dict[str, float] | None:
        acc = self.trainer.accelerator
        t0 = time.monotonic()
        engine = self._colocated_engine()
        if engine is not None:
            engine.sync_weights()  # every rank: each holds its own engine
            self.trainer._last_loaded_step = step  # TRL would sync the same weights again before generating
        point = None
        if acc.is_main_process:
            texts, truncated, backend = self._generate(engine)
            point = (
                self._reward_point(texts)
                if self.rewards is not None and self.spec.file
                else self._accuracy_point(texts, truncated)
            )
            point["heldout/seconds"] = time.monotonic() - t0
            correct = point.pop("correct", None)
            self.series.append({"step": step, **point})
            self.sink.metrics(step, point)
            n = len(self.problems)
            what = (
                f"mean reward {point['heldout/reward']:.4g}"
                if "heldout/reward" in point
                else f"accuracy {point['heldout/accuracy']:.1%} (95% CI {point['heldout/ci_low']:.1%}-"
                f"{point['heldout/ci_high']:.1%})"
            )
            self.sink.event(
                "heldout",
                f"step {step}: {self.name} {what} on {n} problems, {backend}, {point['heldout/seconds']:.1f}s",
                data={"step": step, "benchmark": self.name, "n": n, "correct": correct, "backend": backend, **point},
            )
        acc.wait_for_everyone()
        timings = getattr(self.trainer, "timings", None)
        if timings is not None:
            timings["eval_seconds"] = timings.get("eval_seconds", 0.0) + time.monotonic() - t0
        return point

    def _accuracy_point(self, texts: list[str], truncated: list[bool]) -> dict[str, float]:
        correct = sum(
            grade(t, p.gold, pattern=self.recipe.answer_pattern, truncated=cut).correct
            for t, p, cut in zip(texts, self.problems, truncated, strict=True)
        )
        n = len(self.problems)
        low, high = wilson_interval(correct, n)
        return {"heldout/accuracy": correct / n, "heldout/ci_low": low, "heldout/ci_high": high, "correct": correct}

    def _reward_point(self, texts: list[str]) -> dict[str, float]:
        """The job's rewards on the answers, weighted and summed as in training (None: left out)."""
        assert self.rewards is not None
        functions, weights = self.rewards
        columns = {"answer": [p.gold for p in self.problems], "item": item_column(self.problems)}
        total = [0.0] * len(texts)
        for reward, weight in zip(functions, weights, strict=True):
            for i, value in enumerate(reward(texts, prompts=self.texts, **columns)):
                total[i] += weight * (value or 0.0)
        return {"heldout/reward": sum(total) / max(1, len(total))}

    def _colocated_engine(self) -> Any:
        gen = getattr(self.trainer, "vllm_generation", None)
        if gen is None or getattr(gen, "mode", None) != "colocate" or getattr(gen, "llm", None) is None:
            return None
        return gen

    @contextlib.contextmanager
    def _generator(self, engine: Any) -> Iterator[tuple[Generator, str]]:
        """What the answers are generated on, and its name for the event: TRL's colocated vLLM engine
        (its weights synced for the step), else the trained model on transformers, in eval mode
        while held."""
        from evaluator.backends import backend

        if engine is not None:
            yield (
                backend("vllm").generator(engine.llm, self.tokenizer, engine.max_model_length),
                "the colocated vLLM engine",
            )
            return
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        was_training, side = model.training, self.tokenizer.padding_side
        model.eval()
        try:
            yield backend("hf").generator(model, self.tokenizer), "hf"
        finally:
            model.train(was_training)
            self.tokenizer.padding_side = side

    def _generate(self, engine: Any) -> tuple[list[str], list[bool], str]:
        """Greedy answers (with the job's tool: the loop eval jobs run, evaluator/tool_rollouts.py, each
        answer the model's own words, the tool's outputs taken out), which are truncated, and where."""
        from evaluator.backends import Decoding
        from evaluator.tool_rollouts import generate_with_tools

        decoding = Decoding(self.spec.max_new_tokens, tuple(self.recipe.stop), batch_size=50)
        with self._generator(engine) as (gen, where):
            if self.tooling is not None:
                t = self.tooling
                gens, _ = generate_with_tools(
                    gen, self.texts, decoding, tool=t.tool, fmt=t.fmt, max_calls=t.tools.python.max_calls
                )
                answers = [g[0].answer_text or "" for g in gens]
                return answers, [g[0].truncated for g in gens], f"{where}, with the tool"
            if engine is not None:  # vLLM schedules the whole set, and refuses a prompt past its length
                if self._longest is None:  # the prompts are fixed: measured once
                    self._longest = max(len(self.tokenizer(t, add_special_tokens=False).input_ids) for t in self.texts)
                room = gen.max_model_len - self._longest if gen.max_model_len else decoding.max_new_tokens
                decoding = decoding.but(max_new_tokens=max(1, min(decoding.max_new_tokens, room)), batch_size=None)
            gens = gen.generate(self.texts, decoding)
            return [g[0].text for g in gens], [g[0].truncated for g in gens], where
