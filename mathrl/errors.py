"""The exceptions an SDK user can meet, and the one base every exception of the project is on,
MathRLException (as httpx's `_exceptions.py` keeps its own).

- What the SDK's own code raises, each also a ValueError: FieldError (a spec's field), UnknownName
  (a registry's unknown name), PatternError, TemplateError, FormulaError and FormulaVariableError (a
  grader's pattern, template or formula), FileFormatError (an uploaded file's lines),
  IllegalTransition (a status move).
- MathRLError: the service's error answers with their problem details, a class per HTTP status
  family (`error_for`): BadRequestError, AuthenticationError, PermissionDeniedError, NotFoundError,
  ConflictError, UnprocessableEntityError, RateLimitError, InternalServerError.

The server's own errors build on this base in store/errors.py and runtime/errors.py. This module
imports nothing of the project, so every module can import it. docs/using.md."""

from __future__ import annotations

from typing import Any

# the message of store.errors.Unstorable (mathrl.jsonl_files checks uploads for it too); the API
# answers it for a NUL character wherever one is found
UNSTORABLE = "A value holds a character that cannot be stored (NUL, \\u0000): remove it."


class MathRLException(Exception):
    """The base of every exception the project raises."""


# --- a spec, a user's input ------------------------------------------------------------------


class FieldError(MathRLException, ValueError):
    """A cross-field error that knows which field to blame (the API's problem details point at it)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class UnknownName(MathRLException, ValueError):
    """A name no registry entry has (mathrl.registry.Registry raises it, or the registry's own
    subclass, naming the close names and every known one)."""


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


# --- a job's status ---------------------------------------------------------------------------


class IllegalTransition(MathRLException, ValueError):
    """A job status move the status graph lacks (mathrl.status.check_move)."""


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


# --- the service's error answers -------------------------------------------------------------


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
