"""Reward-model training (`kind: reward_model`, spec: mathrl/specs/reward_model.py): samples its
policy's solutions (on a warm engine if one is given), labels them and trains, one process per GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.settings import Settings
from kinds.base import Data, JobRun, Kind, Limit, LimitName, Needs
from mathrl.backends import uses_vllm
from mathrl.specs import RewardModelSpec
from mathrl.specs.resolved import ResolvedRewardModel

if TYPE_CHECKING:
    from trainer.memory_plan import Training


class RewardModelKind(Kind[RewardModelSpec, ResolvedRewardModel]):
    spec = RewardModelSpec
    saves_models = True
    config = ResolvedRewardModel

    def resolve(self, spec: RewardModelSpec) -> ResolvedRewardModel:
        checkpointing = spec.gradient_checkpointing
        if checkpointing is None:  # the trainer's own default: TRL's RewardTrainer on, transformers' Trainer off
            checkpointing = spec.type == "outcome"
        return self.resolved(spec, {"gradient_checkpointing": checkpointing})

    def admit(self, spec: RewardModelSpec, config: ResolvedRewardModel, settings: Settings) -> None:
        return None

    def limits(self, spec: RewardModelSpec, config: ResolvedRewardModel) -> list[Limit]:
        many: LimitName = "max_generations_per_step"
        return [
            Limit("/sampling/max_new_tokens", config.sampling.max_new_tokens, "max_tokens", "tokens per completion"),
            Limit("/samples_per_question", config.samples_per_question, many, "completions per question"),
            Limit("/max_length", config.max_length, "max_tokens", "tokens per sequence"),
        ]

    def memory(self, config: ResolvedRewardModel) -> Training | None:
        return None  # not planned yet: a sequence-classification head over the policy's shape

    def needs(self, spec: RewardModelSpec) -> Needs:
        r = spec.resources
        vllm = "backend" if uses_vllm(spec.backend) else None
        world = r.num_processes * r.nodes
        return Needs(
            spec.model, training=True, processes=r.num_processes, world=world, vllm_field=vllm, vllm_model=spec.policy
        )

    def data(self, spec: RewardModelSpec) -> Data:
        return Data(dataset=spec.dataset)

    def run(self, run: JobRun[RewardModelSpec, ResolvedRewardModel]) -> None:
        from evaluator.backends.base import BackendOptions
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
            backend_options=BackendOptions(run.settings.vllm.engine(), run.warm),
        )
