"""What both Tinker routers (api/routers/tinker.py, api/routers/tinker_runs.py) and their helpers
in api/tinker/ read: the caller the SDK's key names, the session jobs and saves of the caller's
project, and a call's JSON body."""

from __future__ import annotations

import json
from typing import Annotated, Any, NamedTuple

from fastapi import Depends, Request
from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from api.deps import Caller, SettingsDep, caller_for, required_scope
from api.problems import Problem
from config.settings import Settings
from store.db import get_sessionmaker
from store.models import Checkpoint, Endpoint, Job

RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "The request is invalid (the detail names the field)."},
    404: {"description": "No such session, model, sampler, request or save in your project, or its session ended."},
    413: {"description": "The request body is larger than this server accepts."},
}
KEY_PREFIX = "tml-"  # what the SDK insists a key starts with


async def tinker_caller(request: Request, settings: SettingsDep) -> Caller:
    """The caller the SDK's `X-API-Key: tml-<mathrl key>` (or a Bearer header) names."""
    key = request.headers.get("x-api-key", "")
    authorization = f"Bearer {key.removeprefix(KEY_PREFIX)}" if key else request.headers.get("authorization", "")
    client = request.client.host if request.client is not None else ""
    caller = await caller_for(authorization, settings, client, request.scope.setdefault("state", {}))
    need = required_scope(request.method, request.url.path)
    if caller.key is not None and need not in (caller.key.scopes or []):
        raise Problem(403, "Forbidden", f"this key lacks the '{need}' scope")
    if caller.project is None:
        raise Problem(403, "Forbidden", "sessions belong to a project: use a project's key, not the admin token")
    return caller


TinkerCaller = Annotated[Caller, Depends(tinker_caller)]


class Located(NamedTuple):
    """A session job and, while its process serves, that process's address and token: read in one
    query (the job joined to its `endpoints` row), so a forwarded call costs one round trip."""

    job: Job
    where: tuple[str, str] | None


def located(s: Session, q: Select[Any]) -> list[Located]:
    q = q.outerjoin(Endpoint, Endpoint.job_id == Job.id).add_columns(Endpoint.url, Endpoint.token)
    return [Located(job, (url, token) if url is not None else None) for job, url, token in s.execute(q)]


def sessions_of(project_id: str) -> Select[Any]:
    return select(Job).where(Job.project_id == project_id, Job.kind == "session")


SAVE_KINDS = {"weights": "state", "sampler_weights": "sampler"}  # a path's segment -> its checkpoint's `what`


def find_save(settings: Settings, project_id: str, path: str) -> tuple[Located, Checkpoint]:
    """The session job and checkpoint row a `tinker://<model id>/<weights|sampler_weights>/<name>` path names."""
    parts = path.removeprefix("tinker://").split("/")
    if not path.startswith("tinker://") or len(parts) != 3 or parts[1] not in SAVE_KINDS:
        raise Problem.at("/path", f"{path!r} is not a save's path: tinker://<model id>/weights/<name>", status=400)
    model_id, kind, name = parts
    what = SAVE_KINDS[kind]
    with get_sessionmaker(settings.database.url)() as s:
        for at in located(s, sessions_of(project_id).where(Job.name == model_id).order_by(Job.created_at.desc())):
            rows = s.scalars(select(Checkpoint).where(Checkpoint.job_id == at.job.id).order_by(Checkpoint.step.desc()))
            for row in rows:
                if (row.data or {}).get("name") == name and (row.data or {}).get("what") == what:
                    return at, row
    raise Problem(404, "Not found", f"path: no save {path!r} in this project")


def json_body(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        raise Problem(400, "Invalid request", "the body is not JSON") from None
    except RecursionError:  # (a RuntimeError: it was a 500)
        raise Problem(400, "Invalid request", "the body nests too deeply to read") from None
    if not isinstance(data, dict):
        raise Problem(400, "Invalid request", "the body is not a JSON object")
    return data
