"""Every exception the project raises, in one hierarchy under one base, MathRLException (as
httpx's `_exceptions.py` keeps its own). Each also keeps the built-in base that callers catch it
by (`except ValueError` still catches a FieldError). The modules that raise them re-export
them, so `from evaluator.benchmarks import UnknownBenchmark` and the like still work; where a
class came from is written beside it. This module imports nothing of the project, so every
module can import it.

    MathRLException
    ├── FieldError (ValueError)       a spec's field is wrong (the API's problem details point at it)
    │   └── Refused                   its kind refuses it at submit (kinds/<kind>.py admit), with a title
    ├── UnknownName (ValueError)      a name no registry entry has (mathrl.registry.Registry)
    │   ├── UnknownBenchmark          evaluator.benchmarks' registry
    │   ├── UnknownRecipe             evaluator.recipes' registry
    │   └── UnknownReward             trainer.rewards' names
    ├── PatternError (ValueError)     a user's regular expression RE2 cannot run (mathrl.regex)
    ├── TemplateError (ValueError)    a grader template's variable that does not exist (mathrl.templates)
    ├── FormulaError (ValueError)     a multi grader's formula that cannot be parsed (mathrl.formula)
    │   └── FormulaVariableError      ... or names no grader
    ├── FileFormatError (ValueError)  an uploaded JSONL file's lines, in error (mathrl.jsonl_files)
    ├── IllegalTransition (ValueError)  a job status move the status graph lacks (mathrl.status)
    ├── Unstorable (ValueError)       a NUL character no JSON column may hold (store.db)
    ├── NotPausable (ValueError)      a job whose status no pause or resume applies to (store.jobs)
    ├── RefusedURL (ValueError)       a dataset URL the server will not fetch (service.sources)
    ├── RefError (ValueError)         a job or checkpoint reference that names nothing (worker.refs)
    ├── ParquetError (ValueError)     not a parquet file, or its footer cannot be read (api.parquet_footer)
    ├── SessionCallError (ValueError) a Tinker call a session cannot serve (trainer.session_server)
    ├── NotAvailable (RuntimeError)   this worker cannot run the job (exit EXIT_UNAVAILABLE)
    │   ├── SandboxUnavailable        no python grader sandbox on this machine (evaluator.sandbox)
    │   ├── MemoryRefused             its memory plan needs more than the GPUs have (worker.child)
    │   └── EngineUnfit               the job names vLLM for a model its CPU build cannot run (worker.supervisor)
    ├── CheckpointWriteError (RuntimeError)  a checkpoint that could not be written (trainer.checkpoints)
    ├── RayUnavailable (RuntimeError) the Ray cluster does not answer or refused (worker.ray_submit)
    ├── MathRLError                   an error answer from the service, with its problem details (the
    │   │                             SDK client raises it: mathrl.client), by its status (error_for):
    │   ├── BadRequestError 400, AuthenticationError 401, PermissionDeniedError 403, NotFoundError 404,
    │   └── ConflictError 409, UnprocessableEntityError 422, RateLimitError 429, InternalServerError 5xx
    ├── StopRequested                 this job must stop now: a loop saw its sink's should_stop()
    │   ├── Cancelled                 the job was cancelled (exit EXIT_STOPPED)
    │   ├── Drained                   its worker is shutting down, or it was paused: a checkpoint
    │   │                             was saved and the job is handed back (exit EXIT_DRAINED)
    │   └── LeaseLost                 this attempt no longer owns the job: its writes are refused (EXIT_LOST)
    │
    │   defined where they are used, on this base:
    ├── api.problems.Problem          an HTTP refusal (status, title, problem details, headers):
    │   │                             the API's own, raised and answered only in api/
    │   └── api.admission.QuotaProblem  a 429 with the pipeline step that crossed the quota
    └── evaluator.grading._TooBig     private: a sympy answer too large to evaluate, caught
                                      where it is raised
"""

from __future__ import annotations

from typing import Any

# the message of Unstorable; the API answers it for a NUL character wherever one is found
UNSTORABLE = "A value holds a character that cannot be stored (NUL, \\u0000): remove it."


class MathRLException(Exception):
    """The base of every exception the project raises."""


# --- a spec, a user's input ------------------------------------------------------------------


class FieldError(MathRLException, ValueError):
    """A cross-field error that knows which field to blame (the API's problem details point at it)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class Refused(FieldError):
    """A job its kind refuses at submit (kinds/<kind>.py `admit`): the API answers 422 titled
    `title`, pointing at `field`."""

    def __init__(self, field: str, message: str, title: str = "Invalid job"):
        super().__init__(field, message)
        self.title = title


class UnknownName(MathRLException, ValueError):
    """A name no registry entry has (mathrl.registry.Registry raises it, or the registry's own
    subclass, naming the close names and every known one)."""


class UnknownBenchmark(UnknownName):
    """A benchmark name the registry lacks (evaluator.benchmarks)."""


class UnknownRecipe(UnknownName):
    """A recipe name the registry lacks (evaluator.recipes)."""


class UnknownReward(UnknownName):
    """A reward name the trainer does not know (trainer.rewards)."""


class PatternError(MathRLException, ValueError):
    """A pattern that cannot run: the message says why (mathrl.regex)."""


class TemplateError(MathRLException, ValueError):
    """A variable the template names does not exist (invalid_variable_error; mathrl.templates)."""


class FormulaError(MathRLException, ValueError):
    """The formula cannot be parsed or names what it may not (formula_parse_error; mathrl.formula)."""


class FormulaVariableError(FormulaError):
    """The formula names a variable that is not one of the graders (invalid_variable_error)."""


class FileFormatError(MathRLException, ValueError):
    """An uploaded fine-tuning file's errors (mathrl.jsonl_files): `errors` holds (line, field,
    what is wrong) for each, the message names the first."""

    def __init__(self, errors: list[tuple[int, str, str]]) -> None:
        self.errors = errors  # (line, field, what is wrong)
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        where = f"line {first[0]}: {first[1]}" if first[1] else f"line {first[0]}"  # a line's own error: no field
        super().__init__(f"{where}: {first[2]}{more}")


class RefusedURL(MathRLException, ValueError):
    """A dataset URL the server will not fetch (service.sources.url_refusal says why)."""


class RefError(MathRLException, ValueError):
    """A model reference ('job:<id>[@step-N|@final]') that names no job or checkpoint of the
    project (worker.refs)."""


class ParquetError(MathRLException, ValueError):
    """Not a parquet file, or a footer that cannot be read (api.parquet_footer)."""


# --- the store -------------------------------------------------------------------------------


class IllegalTransition(MathRLException, ValueError):
    """A job status move the status graph lacks (mathrl.status.check_move)."""


class Unstorable(MathRLException, ValueError):
    """A value no JSON column may hold: a NUL character (`pointer`: where, in the document). PostgreSQL
    keeps the escape in a json column, and then every query that reads that row as text fails
    ('unsupported Unicode escape sequence'). The API answers it as a 422 at that pointer."""

    def __init__(self, pointer: str):
        self.pointer = pointer or "/"
        super().__init__(f"{self.pointer}: {UNSTORABLE}")


def nul_pointer(value: Any, pointer: str = "") -> str | None:
    """The JSON pointer of the first string (or key) holding a NUL character, or None."""
    if isinstance(value, str):
        return pointer if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}"
            if "\x00" in str(key):
                return here
            found = nul_pointer(item, here)
            if found is not None:
                return found
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = nul_pointer(item, f"{pointer}/{i}")
            if found is not None:
                return found
    return None


class NotPausable(MathRLException, ValueError):
    """The job is not in a status a pause or a resume applies to (the message says which)."""


class OverQuota(MathRLException, ValueError):
    """Storing a file would take its project past its storage (store/files.py): `what` is 'files'
    (their number, `count` stored) or 'bytes' (`used` with the new one, over `max_bytes`)."""

    def __init__(self, what: str, count: int, used: int, max_bytes: int) -> None:
        self.what, self.count, self.used, self.max_bytes = what, count, used, max_bytes
        super().__init__(
            f"the project stores {count} files, the limit"
            if what == "files"
            else f"the project's files would take {used} bytes, over its {max_bytes}"
        )


class SessionCallError(MathRLException, ValueError):
    """A Tinker call a session job cannot serve as sent (a sampling client asked to train, a save
    name it cannot take, a sampler it does not hold): the call's future fails with the message,
    category 'user' (trainer/session_server.py)."""


# --- a worker, a job's run -------------------------------------------------------------------


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


class MathRLError(MathRLException):
    """An error answer from the service, carrying its RFC 9457 problem details (mathrl.client)."""

    def __init__(self, status: int, problem: dict[str, Any]):
        self.status = status
        self.problem = problem
        self.title = problem.get("title", "error")
        self.detail = problem.get("detail", "")
        self.errors: list[dict[str, Any]] = problem.get("errors", [])
        lines = [f"{status} {self.title}: {self.detail}"]
        lines += [f"  {e.get('pointer', '')}: {e.get('detail', '')}" for e in self.errors]
        super().__init__("\n".join(lines))


# --- the SDK's error answers, a class per HTTP status family (as openai-python's) --------------


class BadRequestError(MathRLError):
    """400: a request the service cannot read."""


class AuthenticationError(MathRLError):
    """401: no API key, or one the service does not know."""


class PermissionDeniedError(MathRLError):
    """403: the key may not do this (its scopes, or another project's object)."""


class NotFoundError(MathRLError):
    """404: no such object in the key's project."""


class ConflictError(MathRLError):
    """409: the object's state does not allow it now, or an Idempotency-Key reused with another body."""


class UnprocessableEntityError(MathRLError):
    """422: a field is wrong; `errors` points at each (problem details' pointers)."""


class RateLimitError(MathRLError):
    """429: too many requests with this key (retried after Retry-After), or over a project quota."""


class InternalServerError(MathRLError):
    """5xx: the service could not answer (503s, the database or a worker away, are retried)."""


_BY_STATUS: dict[int, type[MathRLError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def error_for(status: int, problem: dict[str, Any]) -> MathRLError:
    """The SDK's exception for an error answer: the class of its status (InternalServerError for any
    5xx), or MathRLError itself for another 4xx."""
    cls = _BY_STATUS.get(status) or (InternalServerError if status >= 500 else MathRLError)
    return cls(status, problem)
