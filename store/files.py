"""A project's stored files (OpenAI's files API): their bytes under the artifact directory,
`files/<project>/<id><suffix>`, and a row (store.models.File) each. One writer for every file a
project gets, an upload (api/routers/openai_files.py) or a job's results file (worker/record.py),
so both count against the project's storage the same way."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.orm import Session

from store.errors import OverQuota as OverQuota  # raised here; its callers import it from here
from store.jobs import files_read, readers_of
from store.models import File, Project, as_utc, utcnow


@dataclass(frozen=True)
class Quota:
    """What one project may store: files and bytes (the operator's `files` settings)."""

    max_files: int
    max_bytes: int

    @classmethod
    def of(cls, files: Any) -> Quota:
        """The quota the operator's `files` settings (config.settings.FilesSettings) set."""
        return cls(files.max_project_files, files.max_project_bytes)


def file_path(artifact_dir: str | Path, project_id: str, file_id: str, suffix: str) -> Path:
    return Path(artifact_dir) / "files" / project_id / f"{file_id}{suffix}"


def store_file(
    session: Session,
    artifact_dir: str | Path,
    quota: Quota,
    *,
    file_id: str,
    project_id: str,
    suffix: str,
    content: bytes,
    **row: Any,
) -> File:
    """Write `content` and its row (`row`: the File's other columns), committed. The bytes are written
    first, beside their final name; then, holding the project's row (one store at a time per
    project, so the sums cannot race another), the quota is checked and the file takes its name.
    A row with this id stored already (a results file written by a second end of its job) is
    returned as it is. On any failure (OverQuota included) nothing of this call is left: no bytes,
    no row, the session rolled back."""
    path = file_path(artifact_dir, project_id, file_id, suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".part") as tmp:
        tmp.write(content)
    renamed = False
    try:
        session.execute(select(Project.id).where(Project.id == project_id).with_for_update())
        if (earlier := session.get(File, file_id)) is not None:
            Path(tmp.name).unlink()
            session.commit()  # (ends the transaction: the project's row is free again)
            return earlier
        count, used = session.execute(
            select(func.count(), func.coalesce(func.sum(File.bytes), 0)).where(File.project_id == project_id)
        ).one()
        if count >= quota.max_files:
            raise OverQuota("files", count, used, quota.max_bytes)
        if used + len(content) > quota.max_bytes:
            raise OverQuota("bytes", count, used + len(content), quota.max_bytes)
        os.replace(tmp.name, path)
        renamed = True
        stored = File(id=file_id, project_id=project_id, bytes=len(content), path=str(path), **row)
        session.add(stored)
        session.commit()
    except BaseException:
        session.rollback()
        Path(tmp.name).unlink(missing_ok=True)
        if renamed:  # then the commit failed: the name is this call's
            path.unlink(missing_ok=True)
        raise
    return stored


def expired(row: File, now: datetime | None = None) -> bool:
    """Past its `expires_at` (OpenAI's expires_after): gone to the API from then (not listed, a 404,
    not a job's dataset), though a job admitted before reads it until it ends."""
    if row.expires_at is None:
        return False
    return as_utc(row.expires_at) <= (now or utcnow())


def unexpired(now: datetime | None = None) -> ColumnElement[bool]:
    """`expired`'s rule as a query's condition: the files not past their expires_at."""
    return or_(File.expires_at.is_(None), File.expires_at > (now or utcnow()))


def delete_expired(session: Session, now: datetime | None = None, limit: int = 100) -> list[str]:
    """Delete up to `limit` expired files, their rows and bytes, the oldest first, but those a job of
    their project that has not ended still reads (store.jobs.readers_of): those go in a later round,
    after it ends, and do not hold back the others. Returns the ids deleted. (The workers' reconciler
    calls it each round.)"""
    now = now or utcnow()
    projects = session.scalars(select(File.project_id).where(~unexpired(now)).distinct()).all()
    still_read = files_read(session, projects)
    rows = session.scalars(
        select(File).where(~unexpired(now), File.id.not_in(still_read)).order_by(File.expires_at).limit(limit)
    ).all()
    deleted = []
    for row in rows:
        if readers_of(session, row.project_id, row.id):
            continue
        path = Path(row.path)
        session.delete(row)
        session.commit()
        path.unlink(missing_ok=True)
        deleted.append(row.id)
    session.commit()
    return deleted
