"""What a job's process runs for each kind: the `runner` a spec's JobKind names
(mathrl/kinds.py), called by worker/child.py with the job's `JobRun`. Each wires the kind's
implementation (evaluator/, trainer/) to the job's sink, directories and model resolution."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from mathrl.errors import NotAvailable
from mathrl.kinds import JobRun
from mathrl.specs.resolved import ResolvedEval, ResolvedGRPO, ResolvedSFT

if TYPE_CHECKING:
    from evaluator.backends.base import BackendOptions


def backend_options(run: JobRun) -> BackendOptions:
    """The operator's engine settings and the warm engine the supervisor gave this job, if any."""
    from evaluator.backends.base import BackendOptions
    from worker.warm_engine import given_engine

    return BackendOptions(run.settings.vllm.engine(), given_engine(run.settings))


def run_eval(run: JobRun) -> None:
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
        resolved_recipe=stored_recipe(run.config.of(ResolvedEval)),
        backend_options=backend_options(run),
        sandbox=run.settings.graders.sandbox(),
    )


def run_grpo(run: JobRun) -> None:
    from trainer.grpo import run_grpo
    from worker.vllm_server import URL_ENV

    run_grpo(
        run.spec,
        run.config.of(ResolvedGRPO),
        run.sink,
        model_path=run.model_path,
        data_dir=run.settings.data_dir,
        out_dir=run.out / "train",
        resolve_model=lambda ref: run.resolve(ref)[0],
        vllm_server_url=os.environ.get(URL_ENV),
        work_dir=run.work / "train",
        engine_settings=run.settings.vllm.engine(),
        sandbox=run.settings.graders.sandbox(),
    )


def run_sft(run: JobRun) -> None:
    from trainer.sft import run_sft

    run_sft(
        run.spec,
        run.config.of(ResolvedSFT),
        run.sink,
        model_path=run.model_path,
        data_dir=run.settings.data_dir,
        out_dir=run.out / "train",
        work_dir=run.work / "train",
    )


def run_reward_model(run: JobRun) -> None:
    from trainer.reward_model import run_reward_model

    spec = run.spec
    run_reward_model(
        spec,
        run.sink,
        model_path=run.model_path,
        policy_path=run.resolve(spec.policy)[0] if spec.policy else run.model_path,
        data_dir=run.settings.data_dir,
        out_dir=run.out / "train",
        model_ref=f"job:{run.job_id}",
        work_dir=run.work / "train",
        backend_options=backend_options(run),
    )


def run_grade(run: JobRun) -> None:
    """Each item's score and reason as the job's samples (graders that load a model)."""
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
        judge=judges(lambda ref: run.resolve(ref)[0], warm=backend_options(run).warm),
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


def run_generate(run: JobRun) -> None:
    """A chat or prompt answered (POST /v1/chat/completions, /v1/completions)."""
    from evaluator.chat import run_generate

    warm = backend_options(run).warm
    if run.spec.backend == "vllm" and warm is None:
        raise NotAvailable(
            "backend 'vllm' answers on the worker's warm engine, which this job did not get (the worker "
            "keeps none: worker.warm_engines is 0; or its engine of this LoRA adapter's base model was busy): set "
            "backend to 'auto' or 'hf'"
        )
    run_generate(run.spec, run.sink, run.model_path, warm)
