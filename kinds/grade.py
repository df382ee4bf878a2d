"""Grading given completions with a grader that loads a model (`kind: grade`, spec:
mathrl/specs/grade.py): what the graders routes submit for such graders. It loads no model of its
own; a score_model or label_model grader's one model may answer on the worker's warm vLLM engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.settings import Settings
from kinds.base import Data, JobRun, Kind, Limit, Needs
from mathrl.backends import names_vllm
from mathrl.graders import LabelModelGrader, RewardModelGrader, ScoreModelGrader, parts
from mathrl.specs import GradeSpec
from mathrl.specs.resolved import ResolvedConfig

if TYPE_CHECKING:
    from trainer.memory_plan import Training


class GradeKind(Kind[GradeSpec, ResolvedConfig]):
    spec = GradeSpec
    config = ResolvedConfig

    def resolve(self, spec: GradeSpec) -> ResolvedConfig:
        return self.resolved(spec, {})

    def admit(self, spec: GradeSpec, config: ResolvedConfig, settings: Settings) -> None:
        return None

    def limits(self, spec: GradeSpec, config: ResolvedConfig) -> list[Limit]:
        return []  # at most 1000 items (the spec); each grader's model answers once per item

    def memory(self, config: ResolvedConfig) -> Training | None:
        return None

    def needs(self, spec: GradeSpec) -> Needs:
        """A warm engine serves its one grading model (score_model, label_model); none when it has
        several, or reward models, which score with a head an engine does not run."""
        graders = [g for _, g in parts(spec.grader)]
        models = {g.model for g in graders if isinstance(g, ScoreModelGrader | LabelModelGrader)}
        one = len(models) == 1 and not any(isinstance(g, RewardModelGrader) for g in graders)
        vllm = names_vllm(spec.backend)
        wants = (vllm or spec.backend == "auto") and one
        engine = models.pop() if wants else None
        return Needs(None, engine_model=engine, vllm_field="backend" if vllm else None)

    def data(self, spec: GradeSpec) -> Data:
        return Data()

    def run(self, run: JobRun[GradeSpec, ResolvedConfig]) -> None:
        """Each item's score and reason as the job's samples."""
        from evaluator.chat import judges
        from evaluator.graders import grade_items
        from trainer.rm_scorer import rm_scorers

        items = run.spec.items
        results = grade_items(
            run.spec.grader,
            [i.completion for i in items],
            [i.answer for i in items],
            prompts=[i.prompt for i in items],
            rm_scorer=rm_scorers(lambda ref: run.resolve(ref)[0]),
            judge=judges(lambda ref: run.resolve(ref)[0], warm=run.warm),
            items=[i.fields or {} for i in items],
            sandbox=run.settings.graders.sandbox(),  # python graders: the operator's sandbox mode and limits
        )
        rows = []
        for item, r in zip(items, results, strict=True):
            data = {"answer": item.answer, "score": r.score, "reason": r.reason, "error": r.error, "sub": r.sub}
            rows.append({"prompt": item.prompt, "completion": item.completion, "data": data})
        run.sink.samples(0, rows)
        mean = sum(r.score for r in results) / len(results)
        run.sink.event("scored", f"{len(results)} items graded, mean score {mean:.4g}", data={"mean": mean})
