"""Dependencies: settings, a database session per request, and the caller's project."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from api.problems import AUTH_INVALID, AUTH_MISSING, Problem
from service.settings import Settings, get_settings
from store.db import get_sessionmaker
from store.keys import authenticate
from store.models import ApiKey, Project

SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_db(settings: SettingsDep) -> Iterator[Session]:
    session = get_sessionmaker(settings.database.url)()
    try:
        yield session
    finally:
        session.close()


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


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Problem(401, "Unauthorized", AUTH_MISSING, headers={"WWW-Authenticate": "Bearer"})
    return token.strip()


def get_caller(request: Request, session: SessionDep, settings: SettingsDep) -> Caller:
    token = _bearer(request)
    admin = settings.auth.admin_token
    if admin and hmac.compare_digest(token.encode(), admin.encode()):
        return Caller(project=None, key=None, admin=True)
    found = authenticate(session, token)
    if found is None:
        raise Problem(401, "Unauthorized", AUTH_INVALID, headers={"WWW-Authenticate": "Bearer"})
    key, project = found
    return Caller(project=project, key=key)


def get_project_caller(caller: Annotated[Caller, Depends(get_caller)]) -> Caller:
    if caller.project is None:
        raise Problem(403, "Forbidden", "The admin token manages keys only; use a project key for this route.")
    return caller


AnyCallerDep = Annotated[Caller, Depends(get_caller)]
CallerDep = Annotated[Caller, Depends(get_project_caller)]
