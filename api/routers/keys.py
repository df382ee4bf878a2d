"""/v1/keys: create, list and revoke API keys (each needs a key with the 'keys' scope)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from sqlalchemy.exc import IntegrityError

from api.deps import AnyCallerDep, CallerDep, SessionDep, SettingsDep, forget_key
from api.problems import ADMIN_REQUIRED, KEY_NOT_FOUND, SCOPE_NOT_HELD, Problem
from mathrl.schemas import KEY_SCOPES, KeyCreated, KeyCreateRequest, KeyResponse, Page
from store.keys import create_key, get_or_create_project, list_keys, revoke

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
    scopes = held if body.scopes is None else list(body.scopes)
    if extra := [x for x in scopes if x not in held]:
        detail = SCOPE_NOT_HELD.format(extra=", ".join(repr(x) for x in extra))
        raise Problem(403, "Forbidden", detail, [{"pointer": "/scopes", "detail": detail}])
    days = body.expires_in_days if body.expires_in_days is not None else settings.auth.default_key_days
    key, secret = create_key(session, project, body.name, days or None, settings.auth.key_prefix, scopes)
    session.commit()
    return {**_key_dict(key, project.name), "key": secret}


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
    """Revoke a key of your project; it is refused from then on."""
    key_hash = revoke(session, caller.project_id, key_id)
    if key_hash is None:
        raise Problem(404, "Not found", KEY_NOT_FOUND)
    session.commit()
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
    }
