"""API keys: random secrets, stored only as SHA-256 hashes, each bound to one project."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from store.models import ApiKey, Project, as_utc, utcnow


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def get_or_create_project(session: Session, name: str) -> Project:
    project = session.scalar(select(Project).where(Project.name == name))
    if project is None:
        project = Project(name=name)
        session.add(project)
        session.flush()
    return project


ALL_SCOPES = ("read", "submit", "keys")


def create_key(
    session: Session,
    project: Project,
    name: str | None = None,
    expires_in_days: int | None = None,
    prefix: str = "mrl_",
    scopes: list[str] | tuple[str, ...] = ALL_SCOPES,
    expires_at: datetime | None = None,
    parent_id: str | None = None,
) -> tuple[ApiKey, str]:
    """Returns the row and the secret (shown once, never stored). No `expires_in_days` (nor
    `expires_at`, which takes its place when given): never expires. `parent_id`: the key that
    mints it (None: the admin token), whose revocation revokes this one too."""
    secret = prefix + secrets.token_urlsafe(32)
    row = ApiKey(
        project_id=project.id,
        name=name,
        prefix=secret[: len(prefix) + 6],
        hash=hash_key(secret),
        expires_at=expires_at or (utcnow() + timedelta(days=expires_in_days) if expires_in_days else None),
        scopes=[s for s in ALL_SCOPES if s in scopes],
        parent_id=parent_id,
    )
    session.add(row)
    session.flush()
    return row, secret


def authenticate(session: Session, secret: str) -> tuple[ApiKey, Project] | None:
    row = session.execute(
        select(ApiKey, Project).join(Project, Project.id == ApiKey.project_id).where(ApiKey.hash == hash_key(secret))
    ).first()
    if row is None:
        return None
    key, project = row
    now = utcnow()
    if key.revoked_at is not None:
        return None
    if key.expires_at is not None and as_utc(key.expires_at) <= now:
        return None
    return key, project


def revoke(session: Session, project_id: str, key_id: str) -> list[str] | None:
    """Revoke a key of the project and every key minted below it (its children, theirs, ...);
    returns the hashes of the keys this revoked, or None if `key_id` was no live key of the project.
    Each generation's update waits for a mint that holds one of its keys (hold_live), so a key minted
    meanwhile is committed before the next generation is read, and is revoked with it."""
    now = utcnow()
    first = session.scalar(
        update(ApiKey)
        .where(ApiKey.id == key_id, ApiKey.project_id == project_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=now)
        .returning(ApiKey.hash)
        .execution_options(synchronize_session=False)
    )
    if first is None:
        return None
    hashes, frontier = [first], [key_id]
    while frontier:  # the subtree, a generation at a time (revoked descendants still lead to theirs)
        children = session.execute(
            select(ApiKey.id, ApiKey.hash, ApiKey.revoked_at).where(ApiKey.parent_id.in_(frontier))
        ).all()
        live = [c.id for c in children if c.revoked_at is None]
        if live:
            session.execute(
                update(ApiKey)
                .where(ApiKey.id.in_(live), ApiKey.revoked_at.is_(None))
                .values(revoked_at=now)
                .execution_options(synchronize_session=False)
            )
        hashes += [c.hash for c in children]
        frontier = [c.id for c in children]
    return hashes


def hold_live(session: Session, key_id: str) -> bool:
    """Lock the minting key's row until this transaction ends and say whether the key is still live.
    A revocation updates that row first, so a mint below a key and the key's revocation run one after
    the other: a mint that comes second reads the key revoked; one that comes first has committed its
    child before the revocation reads the subtree. The lock is a write that changes nothing, which
    takes the row on PostgreSQL (a read of it was not enough: a child committed after the revocation
    had read the subtree outlived it) and the database's write lock on SQLite."""
    revoked = session.execute(
        update(ApiKey)
        .where(ApiKey.id == key_id)
        .values(revoked_at=ApiKey.revoked_at)
        .returning(ApiKey.revoked_at)
        .execution_options(synchronize_session=False)
    ).first()
    return revoked is not None and revoked[0] is None


def live_key_count(session: Session, project_id: str) -> int:
    """The project's keys neither revoked nor expired, read with the project's row locked (PostgreSQL),
    so that concurrent mints of one project count one after another."""
    session.execute(select(Project.id).where(Project.id == project_id).with_for_update())
    live = (ApiKey.project_id == project_id, ApiKey.revoked_at.is_(None))
    unexpired = ApiKey.expires_at.is_(None) | (ApiKey.expires_at > utcnow())
    return int(session.scalar(select(func.count()).select_from(ApiKey).where(*live, unexpired)) or 0)


def list_keys(session: Session, project_id: str) -> list[ApiKey]:
    """The project's keys, newest first (revoked and expired ones included, marked by their dates)."""
    return list(session.scalars(select(ApiKey).where(ApiKey.project_id == project_id).order_by(ApiKey.id.desc())))
