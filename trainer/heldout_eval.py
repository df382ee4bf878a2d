"""Held-out evaluation during training (a spec's `eval: {benchmark, limit, every}`): every N
optimizer steps, and after the last, the weights being trained answer the benchmark's first
`limit` problems greedily and are graded as eval jobs grade (evaluator.grading.grade, the
benchmark's own recipe). Stored per step as the series `heldout/accuracy`, `heldout/ci_low`,
`heldout/ci_high` (Wilson 95%) and `heldout/seconds`, and as a `heldout` event.

Generation: a GRPO job's colocated vLLM engine, which already holds the policy, after syncing
the step's weights into it (so no second engine starts); otherwise the trained model itself
through evaluator.hf_backend. One process generates (the main rank); the others wait.

The time it takes is kept out of the step's training time (`eval_seconds` in the trainer's
timings, trainer/callbacks.py)."""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback

from evaluator import prompts
from evaluator.benchmarks import get_benchmark
from evaluator.data import load_benchmark
from evaluator.grading import grade
from evaluator.metrics import wilson_interval
from evaluator.recipes import RECIPES
from mathrl.sink import Sink
from mathrl.specs import HeldoutEval


class HeldoutEvalCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(self, spec: HeldoutEval, sink: Sink, tokenizer: Any, data_dir: str | None) -> None:
        self.spec, self.sink, self.tokenizer = spec, sink, tokenizer
        self.bench = get_benchmark(spec.benchmark)
        self.recipe = RECIPES[self.bench.recipe]
        self.problems = load_benchmark(self.bench, data_dir, spec.limit)
        self.texts = [prompts.render(self.recipe, p.question, tokenizer) for p in self.problems]
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
            correct = sum(
                grade(t, p.gold, pattern=self.recipe.answer_pattern, truncated=cut).correct
                for t, p, cut in zip(texts, self.problems, truncated, strict=True)
            )
            n = len(self.problems)
            low, high = wilson_interval(correct, n)
            seconds = time.monotonic() - t0
            point = {
                "heldout/accuracy": correct / n,
                "heldout/ci_low": low,
                "heldout/ci_high": high,
                "heldout/seconds": seconds,
            }
            self.series.append({"step": step, **point})
            self.sink.metrics(step, point)
            self.sink.event(
                "heldout",
                f"step {step}: {self.bench.name} accuracy {correct / n:.1%} (95% CI {low:.1%}-{high:.1%}) on {n} "
                f"problems, {backend}, {seconds:.1f}s",
                data={"step": step, "benchmark": self.bench.name, "n": n, "correct": correct, "backend": backend},
            )
        acc.wait_for_everyone()
        timings = getattr(self.trainer, "timings", None)
        if timings is not None:
            timings["eval_seconds"] = timings.get("eval_seconds", 0.0) + time.monotonic() - t0
        return point

    def _colocated_engine(self) -> Any:
        gen = getattr(self.trainer, "vllm_generation", None)
        if gen is None or getattr(gen, "mode", None) != "colocate" or getattr(gen, "llm", None) is None:
            return None
        return gen

    def _generate(self, engine: Any) -> tuple[list[str], list[bool], str]:
        if engine is not None:
            from vllm import SamplingParams

            if self._longest is None:  # the prompts are fixed: measured once
                self._longest = max(len(self.tokenizer(t, add_special_tokens=False).input_ids) for t in self.texts)
            room = engine.max_model_length - self._longest if engine.max_model_length else self.spec.max_new_tokens
            params = SamplingParams(
                temperature=0.0, max_tokens=max(1, min(self.spec.max_new_tokens, room)), stop=self.recipe.stop
            )
            outs = [o.outputs[0] for o in engine.llm.generate(self.texts, params, use_tqdm=False)]
            return [o.text for o in outs], [o.finish_reason == "length" for o in outs], "the colocated vLLM engine"
        from evaluator import hf_backend

        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        was_training, side = model.training, self.tokenizer.padding_side
        model.eval()
        try:
            gens = hf_backend.generate(
                model,
                self.tokenizer,
                self.texts,
                max_new_tokens=self.spec.max_new_tokens,
                stop=self.recipe.stop,
                batch_size=50,
            )
        finally:
            model.train(was_training)
            self.tokenizer.padding_side = side
        return [g[0].text for g in gens], [g[0].truncated for g in gens], "hf"
