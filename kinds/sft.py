"""Supervised fine-tuning (`kind: sft`, spec: mathrl/specs/sft.py): trained as one process per GPU,
with a GPU memory plan; its knobs left unset (gradient checkpointing) resolve to TRL's defaults."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.settings import Settings
from kinds.base import Data, JobRun, Kind, Limit, Needs, checkpoints
from mathrl.specs import SFTSpec
from mathrl.specs.base import knob_defaults
from mathrl.specs.resolved import ResolvedSFT

if TYPE_CHECKING:
    from trainer.memory_plan import Training


class SFTKind(Kind[SFTSpec, ResolvedSFT]):
    spec = SFTSpec
    saves_models = True
    config = ResolvedSFT

    def resolve(self, spec: SFTSpec) -> ResolvedSFT:
        unset = spec.gradient_checkpointing is None
        return self.resolved(
            spec, {"gradient_checkpointing": knob_defaults(SFTSpec)["gradient_checkpointing"]} if unset else {}
        )

    def admit(self, spec: SFTSpec, config: ResolvedSFT, settings: Settings) -> None:
        return None

    def limits(self, spec: SFTSpec, config: ResolvedSFT) -> list[Limit]:
        return [
            Limit("/max_steps", spec.max_steps, "max_steps", "steps per job"),
            checkpoints(spec.max_steps, spec.save_steps),
            Limit("/max_length", config.max_length, "max_tokens", "tokens per sequence"),
        ]

    def memory(self, config: ResolvedSFT) -> Training | None:
        from trainer.memory_plan import Training

        lora = config.lora if config.lora is not None and config.lora.enabled else None
        return Training(
            micro_batch=config.per_device_train_batch_size,
            seq_len=config.max_length,
            lora_r=lora.r if lora else None,
            lora_targets=lora.target_modules if lora else "all-linear",
            gradient_checkpointing=config.gradient_checkpointing,
        )

    def needs(self, spec: SFTSpec) -> Needs:
        r = spec.resources
        return Needs(spec.model, training=True, processes=r.num_processes, world=r.num_processes * r.nodes)

    def data(self, spec: SFTSpec) -> Data:
        return Data(dataset=spec.dataset, heldout=spec.eval)

    def run(self, run: JobRun[SFTSpec, ResolvedSFT]) -> None:
        from trainer.sft import run_sft

        run_sft(
            run.spec,
            run.config,
            run.sink,
            model_path=run.model_path,
            data_dir=run.settings.data_dir,
            out_dir=run.out / "train",
            work_dir=run.work / "train",
        )
