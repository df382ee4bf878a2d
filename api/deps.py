"""Dependencies: settings, a database session per request, and the caller's project."""

from __future__ import annotations

import hmac
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Depends, Request
from sqlalchemy.orm import Session

from api import ratelimit
from api.problems import AUTH_INVALID, AUTH_MISSING, BAD_CURSOR, SCOPE_MISSING, Problem
from config.settings import Settings, get_settings
from mathrl.specs import ID_PATTERN
from store.db import get_sessionmaker
from store.keys import authenticate, hash_key
from store.models import ApiKey, Project


# Dependencies are `async def` where they do not block, so a request makes one hop to the
# thread pool (the endpoint itself) instead of one per dependency.
async def settings_dep() -> Settings:
    return get_settings()


SettingsDep = Annotated[Settings, Depends(settings_dep)]


async def get_db(settings: SettingsDep) -> AsyncIterator[Session]:
    # A Session opens no connection until its first query, which runs in the endpoint's thread.
    session = get_sessionmaker(settings.database.url)()
    try:
        yield session
    finally:
        await anyio.to_thread.run_sync(session.close)


SessionDep = Annotated[Session, Depends(get_db)]


@dataclass
class Caller:
    project: Project | None  # None only for the operator's admin token
    key: ApiKey | None
    admin: bool = False

    @property
    def project_id(self) -> str:
        assert self.project is not None
        return self.project.id


def _bearer(header: str) -> str:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Problem(401, "Unauthorized", AUTH_MISSING, headers={"WWW-Authenticate": "Bearer"})
    return token.strip()


# key hash -> (caller, monotonic expiry). A revoked key is refused at once by the process
# that revoked it and within `auth.cache_seconds` by every other API process.
_auth_cache: dict[str, tuple[Caller, float]] = {}


def forget_key(secret_hash: str) -> None:
    _auth_cache.pop(secret_hash, None)


# where api/app.py leaves the caller of a request it authenticated before reading its body
CALLER_STATE = "mathrl_caller"
# and what the caller's rate-limit bucket held after the request was counted (ratelimit.Budget)
RATE_STATE = "mathrl_rate"


async def get_caller(request: Request, settings: SettingsDep) -> Caller:
    caller = request.scope.get("state", {}).get(CALLER_STATE)
    if caller is None:  # requests with a body were checked before the body was read (api/app.py)
        client = request.client.host if request.client is not None else ""
        state = request.scope.setdefault("state", {})
        caller = await caller_for(request.headers.get("authorization", ""), settings, client, state)
    # the route's own path, not the URL's: behind a root path (a proxy's prefix) the URL's starts with it
    need = required_scope(request.method, getattr(request.scope.get("route"), "path", None) or request.url.path)
    if caller.key is not None and need not in (caller.key.scopes or []):
        detail = SCOPE_MISSING.format(need=need, has=", ".join(caller.key.scopes or []) or "none")
        raise Problem(403, "Forbidden", detail)
    return caller  # type: ignore[no-any-return]


def required_scope(method: str, path: str) -> str:
    """The key scope a route needs: 'keys' for /v1/keys, 'read' for GETs, 'submit' for the rest."""
    if path.rstrip("/").startswith("/v1/keys"):
        return "keys"
    return "read" if method in ("GET", "HEAD") else "submit"


async def caller_for(
    authorization: str, settings: Settings, client: str = "", state: dict[str, Any] | None = None
) -> Caller:
    """The caller an Authorization header names, rate limit applied; else a 401 (or 429) Problem.
    A request without a valid key counts against its client address (`client`): past
    limits.rate_per_address_per_second it is 429 instead of 401. A valid key is never held back
    by its address (many clients may share one, behind a proxy). What its bucket holds then is left
    in the request's `state` (RATE_STATE), for the response's x-ratelimit headers (api/app.py)."""
    try:
        token = _bearer(authorization)
    except Problem:
        _limit_address(client, settings)
        raise
    admin = settings.auth.admin_token
    if admin and hmac.compare_digest(token.encode(), admin.encode()):
        return Caller(project=None, key=None, admin=True)
    digest = hash_key(token)
    hit = _auth_cache.get(digest)
    now = time.monotonic()
    if hit is not None and hit[1] > now:
        _keep(state, _rate_limit(hit[0], settings))
        return hit[0]

    def lookup() -> tuple[ApiKey, Project] | None:
        with get_sessionmaker(settings.database.url)() as s:
            return authenticate(s, token)

    found = await anyio.to_thread.run_sync(lookup)
    if found is None:
        forget_key(digest)
        _limit_address(client, settings)
        raise Problem(401, "Unauthorized", AUTH_INVALID, headers={"WWW-Authenticate": "Bearer"})
    key, project = found
    caller = Caller(project=project, key=key)
    ttl = settings.auth.cache_seconds
    if key.expires_at is not None:
        from store.models import as_utc, utcnow

        left = (as_utc(key.expires_at) - utcnow()).total_seconds()
        ttl = min(ttl, max(left, 0.0))
    if ttl > 0:
        if len(_auth_cache) > 10_000:
            _auth_cache.clear()
        _auth_cache[digest] = (caller, now + ttl)
    _keep(state, _rate_limit(caller, settings))
    return caller


def _keep(state: dict[str, Any] | None, left: ratelimit.Budget | None) -> None:
    if state is not None and left is not None:
        state[RATE_STATE] = left


def _limit_address(client: str, settings: Settings) -> None:
    limits = settings.limits
    ratelimit.enforce_address(client, limits.rate_per_address_per_second, limits.burst_per_address)


def _rate_limit(caller: Caller, settings: Settings) -> ratelimit.Budget | None:
    """The key's bucket, then its project's: keys a project mints share the project's rate. Returns
    the tighter of the two (fewer requests left), which the response's x-ratelimit headers show."""
    limits = settings.limits
    left: list[ratelimit.Budget] = []
    if caller.key is not None:
        left.append(ratelimit.enforce(caller.key.id, limits.rate_per_second, limits.burst))
    if caller.project is not None:
        rate, burst = limits.rate_per_project_per_second, limits.burst_per_project
        left.append(ratelimit.enforce(f"project:{caller.project.id}", rate, burst, ratelimit.PROJECT_LIMITED))
    return min(left, key=lambda b: (b.remaining, -b.reset_seconds), default=None)


def get_project_caller(caller: Annotated[Caller, Depends(get_caller)]) -> Caller:
    if caller.project is None:
        raise Problem(403, "Forbidden", "The admin token manages keys only; use a project key for this route.")
    return caller


AnyCallerDep = Annotated[Caller, Depends(get_caller)]
CallerDep = Annotated[Caller, Depends(get_project_caller)]


Row = TypeVar("Row")


def owned(session: Session, model: type[Row], project_id: str, row_id: str, not_found: str) -> Row:
    """The project's row with this id, else a 404 (the same for another project's row and a
    malformed id, so ids of other projects cannot be probed)."""
    row: Any = session.get(model, row_id) if ID_PATTERN.match(row_id) else None
    if row is None or row.project_id != project_id:
        raise Problem(404, "Not found", not_found)
    return row  # type: ignore[no-any-return]


def page_cursor(value: str | None) -> str | None:
    """A `cursor` query parameter: None, or an id from a previous page's next_cursor."""
    if value is not None and not ID_PATTERN.match(value):
        raise Problem(400, "Bad cursor", BAD_CURSOR, [{"pointer": "query:/cursor", "detail": BAD_CURSOR}])
    return value


class _NonFinite(str):
    """Where NaN, Infinity or -Infinity stood in a request's JSON (json.loads reads them as numbers)."""


def _non_finite_pointer(value: Any, pointer: str = "") -> str | None:
    """The JSON pointer of the first _NonFinite in `value`, or None."""
    queue = deque([(value, pointer)])
    while queue:
        item, at = queue.popleft()
        if isinstance(item, _NonFinite):
            return at or "/"
        if isinstance(item, dict):
            queue.extend((v, f"{at}/{str(k).replace('~', '~0').replace('/', '~1')}") for k, v in item.items())
        elif isinstance(item, list):
            queue.extend((v, f"{at}/{i}") for i, v in enumerate(item))
    return None


async def finite_body(request: Request) -> None:
    """The OpenAI routes' JSON bodies, at every field (free-form objects included): NaN and the
    infinities, which JSON has no number for and Python's parser reads, are a 400 at that field, as
    the mathrl routes' strict models refuse them. Before, `"pass_threshold": NaN` in an eval's criteria
    was stored as null, and every later run of that eval was refused."""
    from api.problems import Problem, openai_paths

    if not request.url.path.startswith(openai_paths()) or "json" not in request.headers.get("content-type", ""):
        return
    body = await request.body()
    if b"NaN" not in body and b"Infinity" not in body:
        return
    try:
        parsed = json.loads(body, parse_constant=_NonFinite)
    except (ValueError, RecursionError):
        return  # not JSON: the route's own parsing answers it
    if (pointer := _non_finite_pointer(parsed)) is not None:
        raise Problem.at(pointer, "NaN and Infinity are not numbers JSON holds: send a finite number", status=400)


def storable_query(request: Request) -> None:
    """Every route's query parameters: a NUL character, which no database stores or matches
    alike (PostgreSQL refuses it, SQLite compares it), is a 422 at that parameter."""
    from api.problems import Problem
    from store.db import UNSTORABLE

    bad = [k for k, v in request.query_params.multi_items() if "\x00" in k or "\x00" in v]
    if bad:
        raise Problem.at(f"query:/{bad[0].replace(chr(0), '')}", UNSTORABLE)
