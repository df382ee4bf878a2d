"""The server's own errors, on the project's base (mathrl.errors.MathRLException): what a job's
process, a worker, a kind or the API raises and catches itself. An SDK user meets none of them as
such; what the SDK can meet is mathrl/errors.py. The modules that raise them re-export them.

- On FieldError: Refused (a kind refuses a job at submit). On UnknownName: UnknownBenchmark,
  UnknownRecipe, UnknownReward.
- ValueErrors: RefusedURL, RefError, ParquetError, SessionCallError.
- RuntimeErrors: EngineError, CheckpointWriteError, RayUnavailable, and NotAvailable (this worker
  cannot run the job) with SandboxUnavailable, MemoryRefused and EngineUnfit.
- StopRequested (the job must stop now) with Cancelled, Drained and LeaseLost, each ending the job
  process with its own exit code (worker.child)."""

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
    """A warm vLLM engine refused or failed a Tinker sampler's request (evaluator/backends/warm_sampling.py): the
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
