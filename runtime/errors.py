"""The server's own errors, on the project's base (mathrl.errors.MathRLException): what a job's
process, a worker, a kind or the API raises and catches itself. An SDK user meets none of them as
such, only the API's answer or the job's recorded end; what the SDK can meet is mathrl/errors.py.
The modules that raise them re-export them (`from evaluator.benchmarks import UnknownBenchmark`).

    MathRLException (mathrl.errors)
    ├── FieldError (mathrl.errors)
    │   └── Refused                   its kind refuses it at submit (kinds/<kind>.py admit), with a title
    ├── UnknownName (mathrl.errors)
    │   ├── UnknownBenchmark          evaluator.benchmarks' registry
    │   ├── UnknownRecipe             evaluator.recipes' registry
    │   └── UnknownReward             trainer.rewards' names
    ├── RefusedURL (ValueError)       a dataset URL the server will not fetch (config.sources)
    ├── RefError (ValueError)         a job or checkpoint reference that names nothing (worker.refs)
    ├── ParquetError (ValueError)     not a parquet file, or its footer cannot be read (api.parquet_footer)
    ├── SessionCallError (ValueError) a Tinker call a session cannot serve (trainer.session_server)
    ├── EngineError (RuntimeError)    a warm vLLM engine refused a Tinker sampler (trainer.session_engine)
    ├── NotAvailable (RuntimeError)   this worker cannot run the job (exit EXIT_UNAVAILABLE)
    │   ├── SandboxUnavailable        no python grader sandbox on this machine (evaluator.sandbox)
    │   ├── MemoryRefused             its memory plan needs more than the GPUs have (worker.child)
    │   └── EngineUnfit               the job names vLLM for a model its CPU build cannot run (worker.supervisor)
    ├── CheckpointWriteError (RuntimeError)  a checkpoint that could not be written (trainer.checkpoints)
    ├── RayUnavailable (RuntimeError) the Ray cluster does not answer or refused (worker.ray_submit)
    └── StopRequested                 this job must stop now: a loop saw its sink's should_stop()
        ├── Cancelled                 the job was cancelled (exit EXIT_STOPPED)
        ├── Drained                   its worker is shutting down, or it was paused: a checkpoint
        │                             was saved and the job is handed back (exit EXIT_DRAINED)
        └── LeaseLost                 this attempt no longer owns the job: its writes are refused (EXIT_LOST)
"""

from __future__ import annotations

from typing import Any

from mathrl.errors import FieldError, MathRLException, UnknownName


class Refused(FieldError):
    """A job its kind refuses at submit (kinds/<kind>.py `admit`): the API answers 422 titled
    `title`, pointing at `field`."""

    def __init__(self, field: str, message: str, title: str = "Invalid job"):
        super().__init__(field, message)
        self.title = title


class UnknownBenchmark(UnknownName):
    """A benchmark name the registry lacks (evaluator.benchmarks)."""


class UnknownRecipe(UnknownName):
    """A recipe name the registry lacks (evaluator.recipes)."""


class UnknownReward(UnknownName):
    """A reward name the trainer does not know (trainer.rewards)."""


class RefusedURL(MathRLException, ValueError):
    """A dataset URL the server will not fetch (config.sources.url_refusal says why)."""


class RefError(MathRLException, ValueError):
    """A model reference ('job:<id>[@step-N|@final]') that names no job or checkpoint of the
    project (worker.refs)."""


class ParquetError(MathRLException, ValueError):
    """Not a parquet file, or a footer that cannot be read (api.parquet_footer)."""


class SessionCallError(MathRLException, ValueError):
    """A Tinker call a session job cannot serve as sent (a sampling client asked to train, a save
    name it cannot take, a sampler it does not hold): the call's future fails with the message,
    category 'user' (trainer/session_server.py)."""


class EngineError(MathRLException, RuntimeError):
    """A warm vLLM engine refused or failed a Tinker sampler's request (trainer.session_engine): the
    session then samples with transformers."""


class NotAvailable(MathRLException, RuntimeError):
    """This worker cannot run the job (a package it lacks, too few GPUs, a backend it keeps
    none of); `event` is the job's event that records it, with `data`."""

    event = "not_available"
    data: dict[str, Any] | None = None


class SandboxUnavailable(NotAvailable):
    """No sandbox of the asked mode can be made on this machine: python graders are refused."""

    event = "python_sandbox_unavailable"


class MemoryRefused(NotAvailable):
    """The job's memory plan (trainer/memory_plan.py) needs more than this worker's GPUs have."""

    event = "memory_plan"

    def __init__(self, detail: str, plan: dict[str, Any]):
        super().__init__(detail)
        self.data = plan


class EngineUnfit(NotAvailable):
    """The job names vLLM for a model this worker's vLLM cannot run (evaluator.backends.vllm.cpu_refusal)."""


class CheckpointWriteError(MathRLException, RuntimeError):
    """A checkpoint that could not be written (trainer.checkpoints): the message names the step
    and the cause; the earlier checkpoints stay as they were."""


class RayUnavailable(MathRLException, RuntimeError):
    """The Ray cluster at the configured address does not answer, or refused the submission."""


class StopRequested(MathRLException):
    """This job must stop now (the training and generation loops raise it when their sink's
    should_stop() says so; the worker tells which of the subclasses it was)."""


class Cancelled(StopRequested):
    """The job was cancelled."""


class Drained(StopRequested):
    """Stopped for a drain (a worker shutting down, or a pause): the job goes back to the queue,
    or waits paused, to resume from its checkpoint."""


class LeaseLost(StopRequested):
    """This attempt no longer owns its job (its lease lapsed and the job was re-queued or
    taken by another worker): its writes are refused and the process must stop."""
