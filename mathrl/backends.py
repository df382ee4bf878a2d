"""The generation backends a job can name, each declared once here: its name and what it
generates on. The specs' choices (`GenerationBackend`, read off this registry), the resolved config,
the worker (which package a job needs), the memory plan and the trainer (TRL's `use_vllm`) all read
this entry; the evaluator registers each one's implementation under the same name
(evaluator/backends/: `BACKENDS`), and a quick test holds the two registries equal
(tests/unit/worker/test_generation.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from mathrl.registry import Registry

TRLGeneration = Literal["transformers", "vllm"]  # how TRL's GRPOTrainer generates: use_vllm False or True
ChatGeneration = Literal["transformers", "warm engine"]  # what a backend's Chat answers a generate job with


@dataclass(frozen=True)
class BackendInfo:
    name: str
    vllm: bool  # generates on vLLM: the worker needs the vllm package, a warm engine can serve it
    description: str
    # how GRPO's trainer (TRL) generates its rollouts with this backend; None: TRL cannot, and a
    # GRPO job naming it is refused (mathrl/specs/grpo.py), never run on another backend instead
    trl: TRLGeneration | None = None
    # how a generate job (a chat or completion call, a batch) is answered with this backend (its
    # `Backend.chat` in evaluator/backends/: transformers in the job's process, or the worker's warm
    # engine; a quick test holds the two to each other); None: it cannot be, and a generate job naming
    # it is refused (mathrl/specs/generate.py), never answered on transformers instead
    chats: ChatGeneration | None = None


GENERATION_BACKENDS: Registry[BackendInfo] = Registry("generation backend")
for _info in (
    BackendInfo("hf", vllm=False, description="Hugging Face transformers' generate, in the job's process",
                trl="transformers", chats="transformers"),
    BackendInfo("vllm", vllm=True, description="vLLM's engine (in the process, a server beside it, or a warm one)",
                trl="vllm", chats="warm engine"),
):  # fmt: skip
    GENERATION_BACKENDS.add(_info.name, _info)

if TYPE_CHECKING:
    GenerationBackend = str
else:  # the specs' choices, read off the registry: pydantic validates and documents them as an enum
    GenerationBackend = Literal[tuple(GENERATION_BACKENDS)]


def uses_vllm(name: str) -> bool:
    """Whether the backend `name` ('auto' is resolved first by the spec) generates on vLLM."""
    return GENERATION_BACKENDS[name].vllm


def trl_uses_vllm(name: str) -> bool:
    """Whether GRPO's trainer generates with vLLM (TRL's use_vllm) on the backend `name`; a backend
    TRL cannot run raises ValueError (a GRPO spec refuses it first: `GRPOSpec`'s generation check)."""
    info = GENERATION_BACKENDS[name]
    if info.trl is None:
        raise ValueError(f"GRPO's trainer (TRL) cannot generate with the {name!r} backend")
    return info.trl == "vllm"


def names_vllm(choice: str) -> bool:
    """A spec's backend choice that names a vLLM backend outright ('auto' names none: it picks)."""
    return choice != "auto" and uses_vllm(choice)
