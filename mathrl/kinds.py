"""What each layer needs to know of a job kind, in one entry: `JobKind`, which a spec class of
mathrl/specs/<kind>.py carries as its `job` (the class and its name in `AnySpec` are the whole
registration; `KINDS` is read off them). The worker runs `runner` in the job's process with a
`JobRun`, launches `training` kinds as one process per GPU (and on Ray past one node), gives
`warm_engine` kinds the worker's warm vLLM engine when their backend asks for vLLM; the API
runs `admit` at submit and `resolve` fills the stored config. Functions are named as
'module:function' strings because they live in the layers above this one (the worker, the
trainer, the API), which this package never imports."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mathrl.specs.resolved import ResolvedConfig


@dataclass(frozen=True)
class JobKind:
    runner: str  # 'module:function(run: JobRun) -> None', called in the job's process
    training: bool = False  # one process per GPU through accelerate; resources.processes; Ray past one node
    warm_engine: bool = False  # served by the worker's warm vLLM engine when its backend is 'vllm' or 'auto'
    loads_model: bool = True  # its `model` is resolved to a local path before the runner starts
    memory_plan: bool = False  # its GPU memory is planned at submit and again in the job (mathrl/memory_plan.py)
    admit: str | None = None  # 'module:function(spec, config, settings) -> None', the API's checks at submit
    resolve: str | None = None  # 'module:function(spec) -> dict', what the stored config adds to the spec


@dataclass
class JobRun:
    """What a runner gets: the job, where it writes, and how it resolves other models."""

    spec: Any
    config: ResolvedConfig  # the job's resolved config (mathrl/specs/resolved.py): `run.config.of(ResolvedGRPO)`
    sink: Any  # worker.sink.DatabaseSink: events, metrics, samples, checkpoints
    settings: Any  # service.settings.Settings
    job_id: str
    model_path: str  # the spec's `model` as a local path ('' for kinds that load no model)
    checkpoint: str | None  # '<job>@step-N' when the model is another job's checkpoint
    resolve: Callable[[str], tuple[str, str | None]]  # any model reference -> (path, checkpoint)
    work: Path  # this attempt's directory
    out: Path  # the job's directory (what outlives the attempt)


def function(ref: str) -> Callable[..., Any]:
    """The function a 'module:function' string names."""
    module, _, name = ref.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn
