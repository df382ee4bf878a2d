"""Benchmark evaluation (`kind: eval`, spec: mathrl/specs/eval.py): its recipe is resolved at submit,
it runs as one process and may answer on the worker's warm vLLM engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.settings import Settings
from kinds.base import Data, JobRun, Kind, Limit, Needs
from mathrl.backends import uses_vllm
from mathrl.errors import FieldError
from mathrl.specs import EvalSpec
from mathrl.specs.resolved import ResolvedEval
from runtime.errors import Refused

if TYPE_CHECKING:
    from trainer.memory_plan import Training


class EvalKind(Kind[EvalSpec, ResolvedEval]):
    spec = EvalSpec
    config = ResolvedEval

    def resolve(self, spec: EvalSpec) -> ResolvedEval:
        return self.resolved(spec, {})

    def admit(self, spec: EvalSpec, config: ResolvedEval, settings: Settings) -> None:
        """The recipe the eval runs with, resolved now (an unknown name or a few-shot count over the
        pool is a 422, not a failed job), stored in its config with the completion length."""
        from evaluator.benchmarks import UnknownBenchmark
        from evaluator.recipes import UnknownRecipe, resolve_recipe

        try:
            recipe = resolve_recipe(spec)
        except UnknownRecipe as exc:
            raise Refused("recipe", f"{exc}. Use one of these, or give a recipe inline", "Unknown recipe") from None
        except UnknownBenchmark as exc:
            raise Refused("recipe/shots_from", f"{exc}: the recipe's shots come from it", "Unknown benchmark") from None
        except FieldError as exc:
            raise Refused(exc.field, str(exc), "Invalid recipe") from None
        config.recipe = recipe.record()
        config.sampling = config.sampling.model_copy(update={"max_new_tokens": recipe.max_new_tokens})

    def limits(self, spec: EvalSpec, config: ResolvedEval) -> list[Limit]:
        return [
            Limit("/sampling/n", config.sampling.n, "max_generations_per_step", "completions per question"),
            Limit("/sampling/max_new_tokens", config.sampling.max_new_tokens, "max_tokens", "tokens per completion"),
        ]

    def memory(self, config: ResolvedEval) -> Training | None:
        return None

    def needs(self, spec: EvalSpec) -> Needs:
        vllm = uses_vllm(spec.backend)
        return Needs(spec.model, engine_model=spec.model if vllm else None, vllm_field="backend" if vllm else None)

    def data(self, spec: EvalSpec) -> Data:
        return Data(dataset=spec.dataset, benchmark=spec.benchmark if spec.dataset is None else None)

    def run(self, run: JobRun[EvalSpec, ResolvedEval]) -> None:
        from evaluator.backends.base import BackendOptions
        from evaluator.chat import judges
        from evaluator.recipes import stored_recipe
        from evaluator.run import run_eval
        from trainer.rm_scorer import rm_scorers

        spec = run.spec
        graded = spec.grader is not None
        run_eval(
            spec,
            run.sink,
            model_path=run.model_path,
            data_dir=run.settings.data_dir,
            results_dir=run.out / "eval",
            model_ref=spec.model,
            checkpoint=run.checkpoint,
            work_dir=run.work / "eval",
            rm_scorer=rm_scorers(lambda ref: run.resolve(ref)[0]) if graded else None,
            judge=judges(lambda ref: run.resolve(ref)[0]) if graded else None,
            resolved_recipe=stored_recipe(run.config),
            backend_options=BackendOptions(run.settings.vllm.engine(), run.warm),
            sandbox=run.settings.graders.sandbox(),
        )
