"""/v1/keys: create, list and revoke API keys (each needs a key with the 'keys' scope)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Response
from sqlalchemy.exc import IntegrityError

from api.deps import AnyCallerDep, CallerDep, SessionDep, SettingsDep, forget_key, owned
from api.problems import ADMIN_REQUIRED, KEY_NOT_FOUND, KEY_OUTLIVES, REVOKE_NOT_HELD, SCOPE_NOT_HELD, Problem
from mathrl.schemas import KEY_SCOPES, KeyCreated, KeyCreateRequest, KeyResponse, Page
from store.keys import create_key, get_or_create_project, hold_live, list_keys, live_key_count, revoke
from store.models import ApiKey, as_utc, utcnow

router = APIRouter(prefix="/v1/keys", tags=["keys"])


@router.post("", status_code=201, response_model=KeyCreated, responses={403: {"description": ADMIN_REQUIRED}})
def create(body: KeyCreateRequest, session: SessionDep, caller: AnyCallerDep, settings: SettingsDep) -> dict[str, Any]:
    """A new key for your project; with the admin token, for any project (created if new)."""
    if (
        body.project is not None
        and not caller.admin
        and (caller.project is None or body.project != caller.project.name)
    ):
        raise Problem(403, "Forbidden", ADMIN_REQUIRED, [{"pointer": "/project", "detail": ADMIN_REQUIRED}])
    if caller.admin:
        if body.project is None:
            detail = "With the admin token, name the project the key is for."
            raise Problem(422, "Invalid request", detail, [{"pointer": "/project", "detail": detail}])
        try:
            project = get_or_create_project(session, body.project)
        except IntegrityError:  # created concurrently
            session.rollback()
            project = get_or_create_project(session, body.project)
    else:
        assert caller.project is not None
        project = caller.project
    held = list(KEY_SCOPES) if caller.key is None else list(caller.key.scopes or [])
    scopes: list[str] = held if body.scopes is None else list(body.scopes)
    if extra := [x for x in scopes if x not in held]:
        detail = SCOPE_NOT_HELD.format(extra=", ".join(repr(x) for x in extra))
        raise Problem(403, "Forbidden", detail, [{"pointer": "/scopes", "detail": detail}])
    cap = settings.limits.max_keys_per_project
    if live_key_count(session, project.id) >= cap:
        session.rollback()
        detail = (
            f"project {project.name!r} holds {cap} live API keys, the most it may: revoke some "
            "(DELETE /v1/keys/{id}) before minting another"
        )
        raise Problem(409, "Too many keys", detail)
    days = body.expires_in_days if body.expires_in_days is not None else settings.auth.default_key_days
    expires_at = _within_parent(caller.key, days or None, asked=body.expires_in_days is not None)
    parent_id = caller.key.id if caller.key is not None else None
    if parent_id is not None and not hold_live(session, parent_id):  # revoked since this request authenticated
        session.rollback()
        raise Problem(401, "Unauthorized", "This API key has been revoked.", headers={"WWW-Authenticate": "Bearer"})
    key, secret = create_key(
        session,
        project,
        body.name,
        days or None,
        settings.auth.key_prefix,
        scopes,
        expires_at=expires_at,
        parent_id=parent_id,
    )
    session.commit()
    return {**_key_dict(key, project.name), "key": secret}


def _within_parent(parent: ApiKey | None, days: int | None, asked: bool) -> datetime | None:
    """A new key never outlives the key that creates it: asked for a longer life, a 422 saying the
    most it may ask; not asked (the server's default), it expires with its parent. None: as `days`."""
    end = parent.expires_at if parent is not None else None
    if end is None:
        return None
    end = as_utc(end)
    now = utcnow()
    if days is not None and now + timedelta(days=days) <= end:
        return None
    if asked:
        most = max(0, int((end - now).total_seconds() // 86400))
        detail = KEY_OUTLIVES.format(at=end.isoformat(timespec="seconds"), most=most)
        raise Problem.at("/expires_in_days", detail)
    return end


@router.get("", response_model=Page[KeyResponse])
def list_(session: SessionDep, caller: CallerDep) -> dict[str, Any]:
    """Your project's keys, newest first: prefixes, scopes and dates (never the secrets)."""
    assert caller.project is not None
    return {
        "data": [_key_dict(k, caller.project.name) for k in list_keys(session, caller.project_id)],
        "next_cursor": None,
    }


@router.delete("/{key_id}", status_code=204, responses={404: {"description": KEY_NOT_FOUND}})
def delete(key_id: str, session: SessionDep, caller: CallerDep) -> Response:
    """Revoke a key of your project, and every key minted below it (by it, by those, ...); they are
    refused from then on. A key may revoke only keys whose scopes it holds all of (itself
    included), never one with more rights than its own."""
    target = owned(session, ApiKey, caller.project_id, key_id, KEY_NOT_FOUND)
    held = list(caller.key.scopes or []) if caller.key is not None else list(KEY_SCOPES)
    if extra := [x for x in (target.scopes if target.scopes is not None else KEY_SCOPES) if x not in held]:
        raise Problem(403, "Forbidden", REVOKE_NOT_HELD.format(extra=", ".join(repr(x) for x in extra)))
    hashes = revoke(session, caller.project_id, key_id)
    if hashes is None:
        raise Problem(404, "Not found", KEY_NOT_FOUND)
    session.commit()
    for key_hash in hashes:
        forget_key(key_hash)
    return Response(status_code=204)


def _key_dict(key: Any, project_name: str) -> dict[str, Any]:
    return {
        "id": key.id,
        "project_id": key.project_id,
        "project": project_name,
        "name": key.name,
        "prefix": key.prefix,
        "created_at": key.created_at,
        "expires_at": key.expires_at,
        "revoked_at": key.revoked_at,
        "scopes": list(key.scopes or []),
        "parent_id": key.parent_id,
    }
