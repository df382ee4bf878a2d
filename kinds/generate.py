"""Answering a chat or a prompt (`kind: generate`, spec: mathrl/specs/generate.py): what the
OpenAI-shaped sampling routes submit; one process, on the worker's warm vLLM engine when asked."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.settings import Settings
from kinds.base import Data, JobRun, Kind, Limit, Needs
from mathrl.backends import names_vllm
from mathrl.specs import GenerateSpec
from mathrl.specs.resolved import ResolvedConfig

if TYPE_CHECKING:
    from trainer.memory_plan import Training


class GenerateKind(Kind[GenerateSpec, ResolvedConfig]):
    spec = GenerateSpec
    config = ResolvedConfig

    def resolve(self, spec: GenerateSpec) -> ResolvedConfig:
        return self.resolved(spec, {})

    def admit(self, spec: GenerateSpec, config: ResolvedConfig, settings: Settings) -> None:
        return None

    def limits(self, spec: GenerateSpec, config: ResolvedConfig) -> list[Limit]:
        # the operator's limit on tokens, as for every kind (n <= 16 is the spec's own cap)
        return [Limit("/max_tokens", spec.max_tokens, "max_tokens", "new tokens per choice")]

    def memory(self, config: ResolvedConfig) -> Training | None:
        return None

    def needs(self, spec: GenerateSpec) -> Needs:
        vllm = names_vllm(spec.backend)
        # a call with functions is answered on transformers (evaluator/chat.py): no engine for it
        engine = spec.model if (vllm or spec.backend == "auto") and not spec.function_tools else None
        return Needs(spec.model, engine_model=engine, vllm_field="backend" if vllm else None)

    def data(self, spec: GenerateSpec) -> Data:
        return Data()

    def run(self, run: JobRun[GenerateSpec, ResolvedConfig]) -> None:
        from evaluator.chat import run_generate

        # backend vllm without the warm engine it answers on: NotAvailable (evaluator/backends/vllm.py VLLM.chat)
        run_generate(run.spec, run.sink, run.model_path, run.warm, sandbox=run.settings.graders.sandbox())
