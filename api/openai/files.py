"""A project's uploaded file by id (OpenAI's routers share this lookup)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.orm import Session

from api.problems import Problem
from config.settings import Settings
from store.files import Quota, expired, store_file
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


def store_jsonl(
    session: Session, settings: Settings, project_id: str, file_id: str, lines: list[Any], **row: Any
) -> FileRow:
    """`lines` written as a JSONL file of the project (`row`: its filename, purpose and data), within
    its file quota (store.files.OverQuota past it): what a route stores for a job to read or a caller
    to download."""
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return store_file(
        session,
        settings.artifact_dir,
        Quota.of(settings.files),
        file_id=file_id,
        project_id=project_id,
        suffix=".jsonl",
        content=content,
        **row,
    )
