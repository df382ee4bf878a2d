"""What a job kind is on the server: the `Kind` protocol every home implements (kinds/<kind>.py),
what a runner gets (`JobRun`), what a kind needs from the worker (`Needs`) and a per-job limit
(`Limit`). The API, the worker and the memory plan call these hooks; none of them asks a spec
what kind it is."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

from config.settings import Settings
from mathrl.specs import DatasetRef, HeldoutEval, JobBase
from mathrl.specs.resolved import ResolvedConfig

if TYPE_CHECKING:
    from evaluator.backends.base import WarmEngineAddress
    from runtime.sink import Sink
    from trainer.memory_plan import Training

S = TypeVar("S", bound=JobBase)
C = TypeVar("C", bound=ResolvedConfig)


@dataclass
class JobRun(Generic[S, C]):
    """What a runner gets: the job, where it writes, and how it resolves other models."""

    spec: S
    config: C  # the job's resolved config, as its kind's model (mathrl/specs/resolved.py)
    sink: Sink  # worker.sink.DatabaseSink: events, metrics, samples, checkpoints
    settings: Settings
    job_id: str
    model_path: str  # the spec's `model` as a local path ('' for kinds that load no model)
    checkpoint: str | None  # '<job>@step-N' when the model is another job's checkpoint
    resolve: Callable[[str], tuple[str, str | None]]  # any model reference -> (path, checkpoint)
    work: Path  # this attempt's directory
    out: Path  # the job's directory (what outlives the attempt)
    warm: WarmEngineAddress | None = None  # the worker's warm vLLM engine its supervisor gave this job
    vllm_server_url: str | None = None  # the job's own vLLM server (GRPO in server mode)


@dataclass(frozen=True)
class Needs:
    """What a job needs from the worker that runs it."""

    model: str | None  # the model resolved to a local path before the runner starts (None: it loads none)
    training: bool = False  # launched as training: accelerate (processes > 1), Ray Train past one node
    processes: int = 1  # processes on one node (accelerate launch; 1: the plain job process)
    world: int = 1  # training processes in all (Ray Train workers), less a vLLM server's GPUs
    deepspeed: bool = False  # ZeRO-3 across its processes
    vllm_server: bool = False  # the worker starts a vLLM server beside it (worker/vllm_server.py)
    engine_model: str | None = None  # the model a warm vLLM engine would serve it (None: it wants none)
    engine_if_warm: bool = False  # only an engine the worker has warm already: never start one for it
    engine_lora_rank: int = 0  # the job loads LoRA adapters of this rank into the engine itself
    vllm_field: str | None = None  # the field that asks for vLLM by name: a worker without vLLM fails it at once
    vllm_model: str | None = None  # the model vLLM loads, where not `engine_model` or `model` (an RM's policy)

    @property
    def vllm_loads(self) -> str | None:
        """The model a vLLM engine of the job would load (where the job names vLLM: `vllm_field`)."""
        return self.vllm_model or self.engine_model or self.model


@dataclass(frozen=True)
class Data:
    """The data a job reads, by the spec's field that names each: its questions (`dataset`, or a
    registered `benchmark`) and its held-out set (`eval`). The API checks their sources, files and
    benchmarks at submit, and the worker fetches or finds them, through this hook, not by asking
    the spec which fields it has."""

    dataset: DatasetRef | None = None
    heldout: HeldoutEval | None = None  # the spec's `eval` field
    benchmark: str | None = None  # a registered benchmark it reads instead of a dataset (`benchmark`)


# the server's per-job limits (config.settings.LimitsSettings) a kind's values are held to
LimitName = Literal["max_steps", "max_generations_per_step", "max_tokens", "max_checkpoints_per_job"]


@dataclass(frozen=True)
class Limit:
    """One of a job's values held to one of the server's per-job limits: over it, a 422 at `pointer`."""

    pointer: str
    value: int | None
    limit: LimitName
    what: str  # the limit's unit, in the refusal: 'steps per job'
    fix: str = "lower it"  # what to do
    counted: bool = False  # the value is a count the job's fields make, not the field's own value

    def refusal(self, cap: int) -> str:
        """What the 422 says: the field and its value, or the count and its unit where it is counted."""
        said = (
            f"{self.value} {self.what.split(' per ')[0]}"
            if self.counted
            else f"{self.pointer.lstrip('/')}={self.value}"
        )
        return f"{said} is over this server's limit of {cap} {self.what}: {self.fix}"


class Kind(ABC, Generic[S, C]):
    """A job kind's home. Subclasses set `spec` (the SDK's spec class, whose `kind` names the home)
    and `config` (its resolved config's model), and implement every hook: a home that misses one
    cannot be made, so the registry (kinds/__init__.py) fails at import, not at run time."""

    spec: ClassVar[type[JobBase]]
    config: ClassVar[type[ResolvedConfig]]
    # whether its jobs save models ('job:<id>' names them): a trainer's do, an eval's do not
    saves_models: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return str(self.spec.model_fields["kind"].default)

    @abstractmethod
    def resolve(self, spec: S) -> C:
        """The config the job runs with, stored on its row at submit (no I/O: the SDK's rules)."""

    @abstractmethod
    def admit(self, spec: S, config: C, settings: Settings) -> None:
        """The kind's own checks at submit, beyond the common ones (sources, benchmarks, limits,
        placement, memory): raise runtime.errors.Refused naming the field. May fill `config`."""

    @abstractmethod
    def limits(self, spec: S, config: C) -> list[Limit]:
        """The job's values the server's per-job limits apply to."""

    @abstractmethod
    def memory(self, config: C) -> Training | None:
        """What its GPU memory plan estimates (trainer/memory_plan.py); None: the kind has no plan."""

    @abstractmethod
    def needs(self, spec: S) -> Needs:
        """What it needs from the worker: its model loaded, processes, GPUs, engines."""

    @abstractmethod
    def data(self, spec: S) -> Data:
        """The data it reads (its `dataset` and held-out `eval`), or `Data()`: none."""

    @abstractmethod
    def run(self, run: JobRun[S, C]) -> None:
        """Run the job in its process (worker/child.py), reporting through `run.sink`."""

    def resolved(self, spec: S, values: dict[str, Any]) -> C:
        """The spec's fields and what the kind's resolution adds, as its config model."""
        return self.config.model_validate({**spec.model_dump(mode="json"), **values})  # type: ignore[return-value]


def checkpoints(max_steps: int, save_steps: int) -> Limit:
    """A training job's checkpoints (each a copy of its weights, and of its optimizer's state, on the
    artifact volume every project shares): max_steps / save_steps of them."""
    return Limit(
        "/save_steps",
        math.ceil(max_steps / save_steps),
        "max_checkpoints_per_job",
        "checkpoints per job",
        f"save less often (save_steps={save_steps} of max_steps={max_steps})",
        counted=True,
    )
