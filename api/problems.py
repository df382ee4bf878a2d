"""RFC 9457 problem details: every error a client can cause, with the field and the fix.

Messages are named constants so the OpenAPI `responses=` and the handlers say the same thing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, DBAPIError, OperationalError, StatementError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from mathrl.errors import MathRLException
from mathrl.graders import GRADER_TYPES
from mathrl.specs import JOB_KINDS, UNION_TAGS
from store.db import UNSTORABLE, Unstorable

log = logging.getLogger("mathrl.api")

PROBLEM_JSON = "application/problem+json"
JOB_NOT_FOUND = "No job with this id in your project."
NO_RESULTS = "This job has no per-item results: an eval job writes them when it has scored every item."
RESULTS_UNAVAILABLE = (
    "This job's per-item results file is not readable from this API server (removed, or outside its"
    " artifact directory): check that API and workers share MATHRL_ARTIFACT_DIR."
)
PIPELINE_NOT_FOUND = "No pipeline with this id in your project."
KEY_NOT_FOUND = "No API key with this id in your project."
AUTH_MISSING = "Send your API key as 'Authorization: Bearer <key>' (create one with `mathrl keys create`)."
AUTH_INVALID = "The API key is unknown, revoked or expired: create a new one with `mathrl keys create`."
ADMIN_REQUIRED = "Creating a key for another project needs the operator's admin token."
SCOPE_MISSING = (
    "This key lacks the '{need}' scope (it has: {has}): use a key with it, or have a key with the "
    "'keys' scope create one (`mathrl keys create --scope {need}`)."
)
SCOPE_NOT_HELD = "A key cannot grant a scope it does not hold: drop {extra} from scopes, or use a key that has it."
REVOKE_NOT_HELD = (
    "A key cannot revoke a key with a scope it does not hold ({extra}): use a key that holds every scope of the "
    "key to revoke."
)
KEY_OUTLIVES = (
    "A key cannot outlive the key that creates it: this key expires at {at}, so expires_in_days may be at most "
    "{most}; leave it out and the new key expires with this one."
)
IDEMPOTENCY_CONFLICT = "This Idempotency-Key was used with a different request body: use a new key for a new job."
BAD_CURSOR = "The cursor is not one this API returned: pass next_cursor from the previous page."
DB_UNAVAILABLE = "The database is unreachable right now; nothing was lost. Retry in a few seconds."
TOO_LARGE = "The request body is larger than this server accepts."
OUT_OF_RANGE = "A number is out of the range this server stores: use a smaller one."
TOO_LONG = "A value is longer than this server stores: use a shorter one."


class Problem(MathRLException):
    """The API's own refusal, answered as problem details (RFC 9457): its HTTP status, title,
    detail, the fields in error (`errors`, JSON pointers) and any headers. It stays here, beside
    its handler, not in mathrl.errors: only the API raises it."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        errors: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ):
        self.status, self.title, self.detail, self.errors, self.headers = status, title, detail, errors, headers

    @classmethod
    def at(cls, pointer: str, detail: str, title: str = "Invalid request", status: int = 422) -> Problem:
        """The one way to refuse a field: '<pointer>: <detail>', and the field in `errors`."""
        return cls(status, title, f"{pointer}: {detail}", [{"pointer": pointer, "detail": detail}])


def problem_response(
    status: int,
    title: str,
    detail: str,
    instance: str = "",
    errors: list[dict[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
    openai: bool | None = None,
) -> JSONResponse:
    """`openai`: with OpenAI's error object too (by default, on OpenAI's routes)."""
    openai = instance.startswith(openai_paths()) if openai is None else openai
    if openai and status == 422:  # OpenAI answers invalid parameters with 400 (the SDK's BadRequestError)
        status = 400
    body: dict[str, Any] = {
        "type": f"https://mathrl.dev/problems/{title.lower().replace(' ', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        "instance": instance,
    }
    if errors:
        body["errors"] = errors
    if final_answer(status, title):
        headers = {**(headers or {}), "x-should-retry": "false"}
    if openai:
        # OpenAI's error object beside the problem details, for code written against the openai SDK
        # (it reads error.message, .type, .param and .code): the same detail and the first field's pointer
        pointer = errors[0]["pointer"] if errors else ""
        param = pointer.removeprefix("query:").removeprefix("header:").lstrip("/").replace("/", ".")
        kind, code = openai_error_kind(status, title, instance)
        body["error"] = {"message": detail, "type": kind, "param": param or None, "code": code}
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def final_answer(status: int, title: str) -> bool:
    """Whether a retry of the request could only get the same answer, or do the work again: a conflict,
    a quota (not a rate limit), a completion job that failed or timed out (a retry submits a new one),
    a server error. The openai SDK retries 409, 429 and every 5xx twice by default, without an
    Idempotency-Key, unless the answer says x-should-retry: false; 503 (the database away) stays retried."""
    return status in (409, 500, 502, 504) or (status == 429 and title in QUOTAS)


QUOTAS = ("Quota exceeded", "Too many files")  # 429s that a retry cannot change: not rate limits


SERVED = (
    "files, fine_tuning.jobs (and their events, checkpoints, pause, resume, cancel), fine_tuning.alpha.graders, "
    "evals (and their runs and output items), models, chat.completions, completions, responses and batches "
    "(docs/openai-rft.md)"
)
OPENAI_TAG = "openai:"  # what the tag of every router shaped as OpenAI's API starts with (api/routers/openai_*.py)
_openai_paths: tuple[str, ...] = ()


def openai_paths() -> tuple[str, ...]:
    """The paths shaped as OpenAI's API, which answer a bad request with OpenAI's 400 and error
    object: the root of each route tagged 'openai: ...' (/v1/evals, /v1/fine_tuning: a path under it
    that no route serves answers OpenAI's 404), read off the app's routes by `install`. A router is
    covered by its tag: none is listed by hand."""
    return _openai_paths


def learn_openai_paths(routes: Sequence[Any]) -> None:
    global _openai_paths
    tagged = {
        "/".join(str(getattr(r, "path", "")).split("/")[:3])  # its resource's root: /v1/fine_tuning, /v1/chat
        for r in routes
        if any(str(tag).startswith(OPENAI_TAG) for tag in getattr(r, "tags", None) or ())
    }
    _openai_paths = tuple(sorted(set(_openai_paths) | tagged))


MODEL_PATHS = ("/v1/models", "/v1/chat/", "/v1/completions")


def openai_error_kind(status: int, title: str, instance: str) -> tuple[str, str | None]:
    """OpenAI's error `type` and `code` for a status on its routes, as its API answers them:
    400/404/409/413 invalid_request_error (404 of a model: code model_not_found), 401
    invalid_request_error with code invalid_api_key, 403 permission_error, 429 a rate limit
    (type requests, code rate_limit_exceeded) or a quota (insufficient_quota), 5xx server_error."""
    if status == 401:
        return "invalid_request_error", "invalid_api_key"
    if status == 403:
        return "permission_error", None
    if status == 404 and instance.startswith(MODEL_PATHS):
        return "invalid_request_error", "model_not_found"
    if status == 429:
        if title in QUOTAS:
            return "insufficient_quota", "insufficient_quota"
        return "requests", "rate_limit_exceeded"
    if status >= 500:
        return "server_error", None
    return "invalid_request_error", None


def _pointer(loc: tuple[Any, ...]) -> str:
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        where = parts.pop(0)
    else:
        where = "body"
    if where == "body" and parts and parts[0] in JOB_KINDS:
        parts.pop(0)  # the discriminator tag pydantic adds for the union member
    elif where == "body" and len(parts) > 2 and parts[0] == "jobs" and parts[2] in JOB_KINDS:
        parts.pop(2)  # the same, inside a pipeline's jobs/<step>
    # union members' tags (a recipe by name or inline, a grader's type) are not fields of the body
    kept = [
        p
        for i, p in enumerate(parts)
        if p not in UNION_TAGS and not (i and parts[i - 1] == "grader" and p in GRADER_TYPES)
    ]
    path = "/" + "/".join(str(p) for p in kept)
    return path if where == "body" else f"{where}:{path}"


def validation_errors(errors: Any) -> list[dict[str, Any]]:
    out = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        msg = str(err.get("msg", "invalid"))
        ctx_error = (err.get("ctx") or {}).get("error")
        field = getattr(ctx_error, "field", None)
        if field:
            loc = (*loc, field)
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err.get("type") == "extra_forbidden":
            msg = "unknown field: remove it or check its spelling against the spec (see /docs)"
        elif err.get("type") == "union_tag_invalid" and (err.get("ctx") or {}).get("discriminator") == "'type'":
            msg = f"unknown grader type: use one of {', '.join(GRADER_TYPES)}"
            loc = (*loc, "type")
        elif err.get("type") == "union_tag_invalid":
            msg = f"unknown job kind: use one of {', '.join(JOB_KINDS)}"
            loc = (*loc, "kind")
        elif err.get("type") == "union_tag_not_found":
            msg = f"'kind' is required: use one of {', '.join(JOB_KINDS)}"
            loc = (*loc, "kind")
        elif err.get("type") == "missing":
            msg = "this field is required"
        out.append({"pointer": _pointer(loc), "detail": msg, "type": err.get("type")})
    return out


PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "type": "object",
    "description": "RFC 9457 problem details.",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string", "description": "What went wrong and how to fix it."},
        "instance": {"type": "string"},
        "error": {
            "type": "object",
            "description": "On the OpenAI-shaped routes (/v1/fine_tuning, /v1/files): OpenAI's error object, the same "
            "detail as `message` and the first field as `param`.",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        },
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["pointer", "detail"],
                "properties": {
                    "pointer": {
                        "type": "string",
                        "description": "JSON pointer to the field ('query:/x' for a parameter).",
                    },
                    "detail": {"type": "string"},
                    "type": {"type": ["string", "null"]},
                },
            },
        },
    },
}

# Responses any /v1 operation can give, besides those a route documents itself.
_COMMON = {
    "401": AUTH_INVALID,
    "403": "The admin token manages keys only; use a project key for this route.",
    "429": "Too many requests with this key (see Retry-After), or over a project quota.",
    "503": DB_UNAVAILABLE,
}


def document_problems(schema: dict[str, Any]) -> dict[str, Any]:
    """Make the OpenAPI document say what the handlers do: every 4xx/5xx is a problem+json
    body, and the errors every authenticated route can give are listed on it."""
    schema.setdefault("components", {}).setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
    schema["components"]["schemas"].pop("HTTPValidationError", None)
    schema["components"]["schemas"].pop("ValidationError", None)
    content = {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for path, item in schema.get("paths", {}).items():
        for op in item.values():
            responses = op.setdefault("responses", {})
            if path.startswith(("/v1/", "/api/v1/")):  # the Tinker API's too
                for code, description in _COMMON.items():
                    responses.setdefault(code, {"description": description})
                if "requestBody" in op:
                    responses.setdefault("413", {"description": TOO_LARGE})
                    responses.setdefault("422", {"description": "The request body is invalid."})
                params = op.get("parameters", [])
                if any(p.get("in") == "path" for p in params):
                    responses.setdefault("404", {"description": "Not found in your project."})
                if any(p.get("name") == "cursor" for p in params):
                    responses.setdefault("400", {"description": BAD_CURSOR})
                if params:
                    responses.setdefault("422", {"description": "A parameter is invalid."})
            if path.startswith(openai_paths()) and "422" in responses:  # answered 400 there, as OpenAI does
                responses.setdefault("400", responses.pop("422"))
            for code, response in responses.items():
                if code[0] in "45":
                    response["content"] = content
    return schema


def install(app: FastAPI) -> None:
    """Problem details on `app`, whose routers are all included: its OpenAI-tagged routes answer in
    OpenAI's shape (`openai_paths`)."""
    from fastapi.openapi.utils import get_openapi

    learn_openai_paths(app.routes)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_problems(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    description=app.description,
                    routes=app.routes,
                )
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return problem_response(exc.status, exc.title, exc.detail, request.url.path, exc.errors, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = validation_errors(exc.errors())
        first = errors[0] if errors else {"pointer": "/", "detail": "invalid"}
        detail = f"{first['pointer']}: {first['detail']}" + (
            f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        )
        return problem_response(422, "Invalid request", detail, request.url.path, errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        title = {404: "Not found", 405: "Method not allowed", 413: "Request too large"}.get(exc.status_code, "Error")
        path, detail = request.url.path, str(exc.detail)
        if exc.status_code in (404, 405) and path.startswith("/v1/") and request.scope.get("route") is None:
            # an OpenAI route not served here (responses, embeddings, batches...): the openai SDK shows
            # only 'Error code: 404' without OpenAI's error object; say what is served
            detail = f"{request.method} {path} is not served here; OpenAI's routes here: {SERVED}"
            return problem_response(exc.status_code, title, detail, path, headers=exc.headers, openai=True)
        return problem_response(exc.status_code, title, detail, path, headers=exc.headers)

    @app.exception_handler(Unstorable)
    async def _nul(request: Request, exc: Unstorable) -> JSONResponse:
        # the store's one check on every JSON column (store/db.py); the pointer is where in the
        # stored document (a job's spec is the request's body)
        # the OpenAI routes' request is stored under the config's openai.request: point at its own field
        pointer = exc.pointer.removeprefix("/openai/request") or "/"
        errors = [{"pointer": pointer, "detail": UNSTORABLE}]
        return problem_response(422, "Invalid request", f"{pointer}: {UNSTORABLE}", request.url.path, errors)

    @app.exception_handler(StatementError)
    async def _statement(request: Request, exc: StatementError) -> JSONResponse:
        if isinstance(exc.orig, Unstorable):  # raised while an ORM flush bound the value
            return await _nul(request, exc.orig)
        log.exception("unhandled database statement error on %s", request.url.path)
        return problem_response(500, "Internal error", "An unexpected error; it has been logged.", request.url.path)

    @app.exception_handler(DataError)
    async def _unstorable(request: Request, exc: DataError) -> JSONResponse:
        # e.g. a NUL character, which PostgreSQL text cannot hold: the client's value, not an outage
        bad = [k for k, v in request.query_params.multi_items() if "\x00" in v]
        pointer = f"query:/{bad[0]}" if bad else "/"
        # numbers are bounded where they come in (query parameters, spec fields); say so if one slipped by
        why = {"NumericValueOutOfRange": OUT_OF_RANGE, "StringDataRightTruncation": TOO_LONG}.get(
            type(exc.orig).__name__, UNSTORABLE
        )
        errors = [{"pointer": pointer, "detail": why}]
        return problem_response(422, "Invalid request", f"{pointer}: {why}", request.url.path, errors)

    @app.exception_handler(OperationalError)
    @app.exception_handler(DBAPIError)
    async def _db_down(request: Request, exc: Exception) -> JSONResponse:
        log.warning("database error on %s: %s", request.url.path, type(exc).__name__)
        return problem_response(
            503, "Service unavailable", DB_UNAVAILABLE, request.url.path, headers={"Retry-After": "5"}
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, ClientDisconnect):  # the client went away mid-answer: nothing to log as an error
            log.info("client went away on %s", request.url.path)
            return problem_response(499, "Client closed request", "the client went away", request.url.path)
        log.exception("unhandled error on %s", request.url.path)
        return problem_response(500, "Internal error", "An unexpected error; it has been logged.", request.url.path)
