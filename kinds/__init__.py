"""Each job kind's home on the server: one module per kind (kinds/<kind>.py), each a `Kind`
(kinds/base.py) with every hook the rest of the server calls: `resolve` (its stored config),
`admit` and `limits` (the API at submit), `memory` (its GPU memory plan), `needs` (what the worker
gives it: its model, processes, GPUs, a vLLM server or warm engine), `data` (the dataset and
held-out set it reads) and `run` (in the job's process). A new kind is its spec in the SDK
(mathrl/specs/<kind>.py, named in `AnySpec`), its home here, and one line in `HOMES`;
tests/unit/kinds/test_homes.py fails when the two disagree or a home misses a hook."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kinds.base import Data as Data
from kinds.base import JobRun as JobRun
from kinds.base import Kind as Kind
from kinds.base import Limit as Limit
from kinds.base import Needs as Needs
from kinds.eval import EvalKind
from kinds.generate import GenerateKind
from kinds.grade import GradeKind
from kinds.grpo import GRPOKind
from kinds.reward_model import RewardModelKind
from kinds.session import SessionKind
from kinds.sft import SFTKind
from mathrl.registry import Registry
from mathrl.specs import AnySpec
from mathrl.specs.resolved import ResolvedConfig, resolved

if TYPE_CHECKING:
    from trainer.memory_plan import Training

HOMES: Registry[Kind[Any, Any]] = Registry("job kind")
for _home in (EvalKind(), GRPOKind(), RewardModelKind(), SFTKind(), GradeKind(), GenerateKind(), SessionKind()):
    HOMES.add(_home.name, _home)


def model_savers() -> str:
    """The kinds whose jobs save models ('job:<id>' can name them), for a refusal to list."""
    return ", ".join(name for name, kind in HOMES.items() if kind.saves_models)


def home(spec: AnySpec) -> Kind[Any, Any]:
    """The home of a spec's kind."""
    return HOMES[spec.kind]


def resolve_config(spec: AnySpec) -> ResolvedConfig:
    """The concrete configuration a job runs with, stored on the job row at submit time."""
    config: ResolvedConfig = home(spec).resolve(spec)
    return config


def training_of(config: Any) -> Training:
    """What a job's memory plan estimates (trainer/memory_plan.py), from its resolved config (a
    model or the stored JSON); ValueError for a kind that has no plan."""
    config = resolved(config)
    training = HOMES[config.kind].memory(config)
    if training is None:
        raise ValueError(f"no memory plan for {config.kind!r} jobs")
    return training
