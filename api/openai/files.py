"""A project's uploaded file by id (OpenAI's routers share this lookup)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.problems import Problem
from store.files import expired
from store.jobs import FILE_ID
from store.models import File as FileRow

NOT_FOUND = "no file with this id in your project"


def own_file(session: Session, project_id: str, file_id: str) -> FileRow:
    """The project's file, else a 404 (the same for another project's file, a malformed id and an
    expired file)."""
    row = session.get(FileRow, file_id) if FILE_ID.fullmatch(file_id) else None
    if row is None or row.project_id != project_id or expired(row):
        raise Problem(404, "Not found", NOT_FOUND)
    return row
