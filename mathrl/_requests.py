"""The SDK's request layer (mathrl/client.py): what every call sends, how it is sent again, and how its
answer is read, as operations (mathrl/_transport.py) for both clients.

Retries, as openai-python's: `x-should-retry` is taken at its word (the API says false for a final
answer, api/problems.py final_answer); otherwise 408, 409, 429, every 5xx, a cut connection and a
timeout are sent again, after Retry-After up to a minute, else 0.5 s, 1 s, 2 s ... (8 s at most,
jittered). A create carries an Idempotency-Key (made here if the caller gives none), so a create
sent twice makes one object."""

from __future__ import annotations

import builtins
import random
import time
import uuid
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from mathrl._transport import Close, Item, NextLine, Op, Open, Pager, ReadBody, RetryLimit, Send, Sleep
from mathrl.errors import error_for
from mathrl.schemas import TERMINAL_STATUSES, JobResponse, PipelineResponse

# `after` for a stream that sends no past events, only the job's end: no seq is above it
NO_EVENTS = 2**63 - 1
# the API sends a comment on a quiet stream every 15 s (api/job_wakeups.py KEEPALIVE_SECONDS)
STREAM_QUIET_SECONDS = 20.0

M = TypeVar("M", bound=BaseModel)
Ended = TypeVar("Ended", JobResponse, PipelineResponse)


def raise_for(resp: httpx.Response) -> None:
    """The exception of an error answer's status (mathrl.errors.error_for: NotFoundError, RateLimitError, ...)."""
    if resp.status_code < 400:
        return
    try:
        problem = resp.json()
    except ValueError:
        problem = {"title": resp.reason_phrase, "detail": resp.text[:500]}
    raise error_for(resp.status_code, problem)


RETRIED_STATUSES = (408, 409, 429)
NETWORK_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


def should_retry(resp: httpx.Response) -> bool:
    hint = str(resp.headers.get("x-should-retry", "")).lower()
    if hint in ("true", "false"):
        return hint == "true"
    return resp.status_code in RETRIED_STATUSES or resp.status_code >= 500


def retry_delay(attempt: int, resp: httpx.Response | None) -> float:
    """Seconds before try `attempt + 1` (0: the first retry)."""
    if resp is not None:
        for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
            try:
                after = float(resp.headers.get(header, "")) * scale  # seconds (or ms) only, not a date
            except ValueError:
                continue
            if 0 <= after <= 60:
                return after
    return min(8.0, 0.5 * 2.0**attempt) * (1 - 0.25 * random.random())


def sent(
    step: type[Send] | type[Open], method: str, url: str, kw: dict[str, Any], retry: bool = True
) -> Op[httpx.Response]:
    """The answer to a request (`Send`) or the head of one (`Open`), sent again as the rules above say."""
    retries = (yield RetryLimit()) if retry else 0
    attempt = 0
    while True:
        try:
            resp: httpx.Response = yield step(method, url, kw)
        except NETWORK_ERRORS:
            if attempt >= retries:
                raise
            yield Sleep(retry_delay(attempt, None))
        else:
            if resp.status_code < 400 or attempt >= retries or not should_retry(resp):
                return resp
            if step is Open:
                yield Close(resp)
            yield Sleep(retry_delay(attempt, resp))
        attempt += 1


def create_key(idempotency_key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": idempotency_key or f"mathrl-sdk-{uuid.uuid4().hex}"}


def query(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def spec_body(spec: Any) -> dict[str, Any]:
    if isinstance(spec, BaseModel):
        return spec.model_dump(mode="json", exclude_unset=True)
    return dict(spec)


def as_dict(obj: Any) -> Any:
    return obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj


def json_answer(method: str, url: str, retry: bool = True, **kw: Any) -> Op[Any]:
    """A request; its answer's JSON (None for a 204: a revoke), or MathRLError for an error answer.
    `retry=False`: sent once (a create the API keeps no Idempotency-Key for)."""
    resp = yield from sent(Send, method, url, kw, retry)
    raise_for(resp)
    return resp.json() if resp.content else None


def one(model: type[M], method: str, url: str, retry: bool = True, **kw: Any) -> Op[M]:
    return model.model_validate((yield from json_answer(method, url, retry, **kw)))


def many(model: type[M], url: str, **kw: Any) -> Op[builtins.list[M]]:
    """A GET of one page: its rows."""
    page = yield from json_answer("GET", url, **kw)
    return [model.model_validate(row) for row in page["data"]]


def pages(model: type[M], url: str, cursor: str = "cursor", **params: Any) -> Pager[M]:
    """Every row of a paged list: the next page (the answer's `next_cursor`, sent back as the
    `cursor` parameter) is fetched when the rows of the last are used up."""
    after = None
    while True:
        page = yield from json_answer("GET", url, params=query(**params, **{cursor: after}))
        for row in page["data"]:
            yield Item(model.model_validate(row))
        if not (after := page["next_cursor"]):
            return


def open_lines(url: str, **kw: Any) -> Op[httpx.Response]:
    """A GET whose answer is read a line at a time (NextLine); MathRLError for an error answer."""
    resp = yield from sent(Open, "GET", url, kw)
    if resp.status_code >= 400:
        yield ReadBody(resp)
        raise_for(resp)
    return resp


def until_ended(model: type[Ended], url: str, what: str, ident: str, timeout: float, poll: float) -> Op[Ended]:
    """Poll `url` until its status is terminal (raises TimeoutError)."""
    deadline = time.monotonic() + timeout
    while True:
        obj = yield from one(model, "GET", url)
        if obj.status in TERMINAL_STATUSES:
            return obj
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} {ident} still {obj.status} after {timeout:.0f}s")
        yield Sleep(poll)


def until_stream_ends(job_id: str, deadline: float) -> Op[None]:
    """Hold the job's event stream open until the API ends it (the job ended) or the deadline
    passes. Errors (the key's stream limit, a connection cut) end it early: the caller polls."""
    read = max(0.1, min(deadline - time.monotonic(), STREAM_QUIET_SECONDS + 10))
    kw = {"params": {"after": NO_EVENTS}, "timeout": httpx.Timeout(30.0, read=read)}
    resp: httpx.Response | None = None
    try:
        resp = yield Open("GET", f"/v1/jobs/{job_id}/events/stream", kw)
        if resp.status_code < 400:
            # keep-alive comments too: the deadline is checked on each
            while (yield NextLine(resp)) is not None and time.monotonic() <= deadline:
                pass
    except httpx.HTTPError:
        pass
    if resp is not None:
        yield Close(resp)
