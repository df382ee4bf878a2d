"""GRPO policy training (`kind: grpo`, spec: mathrl/specs/grpo.py): its knobs resolved from TRL's
defaults, the preset and the spec (mathrl/specs/presets.py), trained as one process per GPU (less a
vLLM server's in server mode), with a GPU memory plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.settings import Settings
from kinds.base import Data, JobRun, Kind, Limit, LimitName, Needs, checkpoints
from mathrl.backends import names_vllm, uses_vllm
from mathrl.specs import GRPOSpec
from mathrl.specs.presets import resolve_grpo
from mathrl.specs.resolved import ResolvedGRPO

if TYPE_CHECKING:
    from trainer.memory_plan import Training


class GRPOKind(Kind[GRPOSpec, ResolvedGRPO]):
    spec = GRPOSpec
    saves_models = True
    config = ResolvedGRPO

    def resolve(self, spec: GRPOSpec) -> ResolvedGRPO:
        return self.resolved(spec, resolve_grpo(spec))

    def admit(self, spec: GRPOSpec, config: ResolvedGRPO, settings: Settings) -> None:
        return None  # every rule of its knobs is the spec's own (resolve_grpo raises at parse)

    def limits(self, spec: GRPOSpec, config: ResolvedGRPO) -> list[Limit]:
        many: LimitName = "max_generations_per_step"
        return [
            Limit("/max_steps", spec.max_steps, "max_steps", "steps per job"),
            checkpoints(spec.max_steps, spec.save_steps),
            Limit("/global_batch_size", config.global_batch_size, many, "completions per step"),
            Limit("/num_generations", config.num_generations, many, "completions per step"),
            Limit(
                "/max_completion_length",
                config.max_prompt_length + config.max_completion_length,
                "max_tokens",
                "tokens per sequence (max_prompt_length + max_completion_length)",
                counted=True,
            ),
        ]

    def memory(self, config: ResolvedGRPO) -> Training | None:
        from trainer.memory_plan import DEFAULT_VLLM_UTILIZATION, Training

        colocated = uses_vllm(config.generation_backend) and config.generation_mode == "colocate"
        hf = not uses_vllm(config.generation_backend)
        static = hf and config.generation.resolved_hf_mode() == "static"
        overlap = hf and config.generation.overlap
        on_copy = "+".join(name for name, on in (("static", static), ("overlap", overlap)) if on)
        utilization = config.generation.gpu_memory_utilization or DEFAULT_VLLM_UTILIZATION
        lora = config.lora if config.lora is not None and config.lora.enabled else None
        return Training(
            micro_batch=config.per_device_train_batch_size,
            seq_len=config.max_prompt_length + config.max_completion_length,
            lora_r=lora.r if lora else None,
            lora_targets=lora.target_modules if lora else "all-linear",
            gradient_checkpointing=config.gradient_checkpointing,
            reference_model=(config.beta or 0.0) > 0 and lora is None,
            vllm_fraction=float(utilization if colocated else 0.0),
            zero3_world=config.world_size if config.deepspeed_zero3 else 1,
            copy_decode_batch=config.global_batch_size // config.world_size if on_copy else 0,
            copy_decode_why=on_copy or "static",
            prompt_len=config.max_prompt_length,
        )

    def needs(self, spec: GRPOSpec) -> Needs:
        processes = spec.training_processes  # in server mode: the GPUs its vLLM server does not take
        return Needs(
            spec.model,
            training=True,
            processes=processes,
            world=spec.training_world,
            deepspeed=spec.deepspeed_zero3 and processes > 1,
            vllm_server=spec.generation.mode == "server",
            vllm_field="generation.backend" if names_vllm(spec.generation.backend) else None,
        )

    def data(self, spec: GRPOSpec) -> Data:
        return Data(dataset=spec.dataset, heldout=spec.eval)

    def run(self, run: JobRun[GRPOSpec, ResolvedGRPO]) -> None:
        from trainer.grpo import run_grpo

        run_grpo(
            run.spec,
            run.config,
            run.sink,
            model_path=run.model_path,
            data_dir=run.settings.data_dir,
            out_dir=run.out / "train",
            resolve_model=lambda ref: run.resolve(ref)[0],
            vllm_server_url=run.vllm_server_url,
            work_dir=run.work / "train",
            engine_settings=run.settings.vllm.engine(),
            sandbox=run.settings.graders.sandbox(),
        )
