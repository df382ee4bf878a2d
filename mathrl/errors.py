"""Errors raised across layers, importable by every module that raises them:

    ValueError
    └── FieldError          a spec's field is wrong (the API's problem details point at it)
        └── Refused         its kind refuses it at submit (kinds/<kind>.py admit), with a title
    RuntimeError
    └── NotAvailable        this worker cannot run the job: a package it lacks, too few GPUs,
                            its memory plan (worker.child.MemoryRefused) (exit EXIT_UNAVAILABLE)
    Exception
    └── StopRequested       this job must stop now: a loop saw its sink's should_stop()
        ├── Cancelled       the job was cancelled (exit EXIT_STOPPED)
        ├── Drained         its worker is shutting down, or it was paused: a checkpoint was
        │                   saved and the job is handed back (exit EXIT_DRAINED)
        └── LeaseLost       this attempt no longer owns the job: its writes are refused (EXIT_LOST)

The API's own refusals are api.problems.Problem (`Problem.at(pointer, detail)` for a field).
"""

from __future__ import annotations

from typing import Any

from mathrl.regex import PatternError, check


class FieldError(ValueError):
    """A cross-field error that knows which field to blame (the API's problem details point at it)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def check_regex(field: str, pattern: str | None, group: bool) -> None:
    """A regular expression a spec gives (with `group`: one whose group 1 is the answer), as
    RE2 runs it (mathrl/regex.py: patterns that need backtracking are refused)."""
    if pattern is None:
        return
    try:
        groups = check(pattern)
    except PatternError as exc:
        raise FieldError(field, str(exc)) from None
    if group and groups < 1:
        raise FieldError(field, "needs a group, e.g. '#### (\\-?[0-9.,]+)': the answer is group 1")


class Refused(FieldError):
    """A job its kind refuses at submit (kinds/<kind>.py `admit`): the API answers 422 titled
    `title`, pointing at `field`."""

    def __init__(self, field: str, message: str, title: str = "Invalid job"):
        super().__init__(field, message)
        self.title = title


class NotAvailable(RuntimeError):
    """This worker cannot run the job (a package it lacks, too few GPUs, a backend it keeps
    none of); `event` is the job's event that records it, with `data`."""

    event = "not_available"
    data: dict[str, Any] | None = None


class StopRequested(Exception):
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
