"""OpenAI's files API, for code written against the `openai` SDK (`client.files.create(...)`): POST
/v1/files (multipart: file, purpose), list, retrieve, delete and content. A file belongs to the
caller's project; its bytes live under the artifact directory (`files/<project>/<id>.jsonl`) and a
row records it (store.models.File). A 'fine-tune' file is checked at upload (mathrl/jsonl_files.py):
a bad line is refused naming the line and the field, and nothing is stored. Limits are the `files`
settings. OpenAI's `expires_after` sets the file's `expires_at` (EXPIRES_SECONDS), after which the
workers' reconciler deletes it (store.files). docs/openai-rft.md, "What each route is here"."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Header, Query, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from api.deps import CallerDep, SessionDep, SettingsDep
from api.idempotency import earlier, request_hash
from api.openai.files import NOT_FOUND, own_file
from api.openai.resource import listed
from api.problems import Problem
from config.settings import Settings
from mathrl.jsonl_files import BATCH_PURPOSE, FileFormatError, check_jsonl
from mathrl.modelref import RESULTS_PURPOSE
from store.files import OverQuota, Quota, store_file, unexpired
from store.ids import uuid7
from store.jobs import FILE_ID, readers_of
from store.models import File as FileRow
from store.models import utcnow

router = APIRouter(prefix="/v1/files", tags=["openai: files"])

# evals: OpenAI eval runs' items (api/routers/openai_evals.py); batch: a batch's requests (openai_batches.py)
PURPOSES = ("fine-tune", "evals", BATCH_PURPOSE)
EXPIRES_SECONDS = (3600, 2_592_000)  # OpenAI's bounds on expires_after.seconds: an hour to 30 days


def file_object(row: FileRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.bytes,
        "created_at": int(row.created_at.timestamp()),
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": int(row.expires_at.timestamp()) if row.expires_at is not None else None,
    }


def _invalid(pointer: str, detail: str, status: int = 422, title: str = "Invalid file") -> Problem:
    return Problem.at(pointer, detail, title, status)


@router.post(
    "",
    responses={
        409: {"description": "This Idempotency-Key was used with a different upload."},
        413: {"description": "Over the size of one file, or the project's stored bytes."},
        422: {"description": "The purpose is unknown, or a line of the file is not in the fine-tuning format."},
        429: {"description": "The project stores as many files as it may."},
    },
)
async def create_file(
    caller: CallerDep,
    settings: SettingsDep,
    file: Annotated[UploadFile, File(description="A JSONL file in OpenAI's fine-tuning format.")],
    purpose: Annotated[
        str,
        Form(description="What it is for: 'fine-tune' (chats), 'evals' (items of eval runs) or 'batch' (requests)."),
    ],
    expires_anchor: Annotated[
        str | None, Form(alias="expires_after[anchor]", description="OpenAI's expires_after: 'created_at'.")
    ] = None,
    expires_seconds: Annotated[
        int | None,
        Form(alias="expires_after[seconds]", description="Seconds after the anchor the file expires: 3600 to 2592000."),
    ] = None,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    x_stainless_retry_count: Annotated[str | None, Header(max_length=8, include_in_schema=False)] = None,
) -> dict[str, Any]:
    """Upload a file: checked line by line, then stored in the caller's project. A retry with the
    same Idempotency-Key, or the openai SDK's own retry of this upload (which sends no key), and the
    same file returns the first upload (api/idempotency.py)."""
    if purpose not in PURPOSES:
        raise _invalid("/purpose", f"{purpose!r} is not a purpose here: use {', '.join(PURPOSES)}")
    expires_after = _expires_after(expires_anchor, expires_seconds)
    limits = settings.files
    data = await file.read(limits.max_file_bytes + 1)
    if len(data) > limits.max_file_bytes:
        raise _invalid("/file", f"over {limits.max_file_bytes} bytes, the limit per file", 413, "File too large")
    try:
        kinds = (purpose == "evals", purpose == BATCH_PURPOSE)
        stats = await run_in_threadpool(check_jsonl, data, limits.max_lines, *kinds)
    except FileFormatError as e:
        errors = [{"pointer": f"/file/line/{n}" + (f"/{f}" if f else ""), "detail": what} for n, f, what in e.errors]
        raise Problem(422, "Invalid file", f"/file: {e}", errors) from None
    name = os.path.basename(file.filename or "upload.jsonl")[:255] or "upload.jsonl"
    digest = request_hash(purpose.encode() + b"\0" + name.encode() + b"\0" + data)
    if expires_after is not None:
        digest = request_hash(digest.encode() + b"\0" + str(expires_after).encode())
    key = (idempotency_key, digest, x_stainless_retry_count)
    args = (settings, caller.project_id, name, purpose, data, stats.record(), key, expires_after)
    return await run_in_threadpool(_store, *args)


def _expires_after(anchor: str | None, seconds: int | None) -> int | None:
    """OpenAI's expires_after, checked: its seconds, or None where it was not sent."""
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise _invalid("/expires_after/anchor", f"{anchor!r}: the anchor is 'created_at', the only one")
    low, high = EXPIRES_SECONDS
    if seconds is None or not low <= seconds <= high:
        detail = f"{seconds!r}: seconds after created_at the file expires, from {low} (an hour) to {high} (30 days)"
        raise _invalid("/expires_after/seconds", detail)
    return seconds


def _store(
    settings: Settings,
    project_id: str,
    name: str,
    purpose: str,
    data: bytes,
    stats: dict[str, Any],
    key: tuple[str | None, str, str | None] = (None, "", None),
    expires_after: int | None = None,
) -> Any:
    """`key`: the Idempotency-Key, the request's hash and the SDK's retry count (api/idempotency.py);
    `expires_after`: the seconds from now the file expires (None: it stays until deleted)."""
    from store.db import get_sessionmaker

    with get_sessionmaker(settings.database.url)() as session:  # a retry of an upload stored before
        if (existing := earlier(session, FileRow, project_id, *key)) is not None:
            return file_object(existing)
    quota = Quota.of(settings.files)
    with get_sessionmaker(settings.database.url)() as session:
        try:
            row = store_file(
                session,
                settings.artifact_dir,
                quota,
                file_id="file-" + uuid7().replace("-", ""),
                project_id=project_id,
                suffix=".jsonl",
                content=data,
                filename=name,
                purpose=purpose,
                data=stats,
                expires_at=utcnow() + timedelta(seconds=expires_after) if expires_after is not None else None,
                idempotency_key=key[0],
                request_hash=key[1],  # with a key or without: the SDK's keyless retries are matched on it too
            )
        except OverQuota as e:
            if e.what == "files":
                detail = f"your project stores {e.count} files, the limit: delete some first"
                raise Problem(429, "Too many files", detail) from None
            detail = f"your project's files would take {e.used} bytes, over its {quota.max_bytes}: delete some first"
            raise _invalid("/file", detail, 413, "Over the project's storage") from None
        except IntegrityError:
            if key[0] and (existing := earlier(session, FileRow, project_id, *key)) is not None:
                return file_object(existing)  # a concurrent retry with the same key stored it
            raise
        return file_object(row)


@router.get("", responses={400: {"description": "`after` is not a file id."}})
def list_files(
    caller: CallerDep,
    session: SessionDep,
    purpose: Annotated[str | None, Query(max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    after: Annotated[str | None, Query(max_length=48)] = None,
) -> dict[str, Any]:
    """The project's files, newest first (order=asc: oldest first), `after` a file id."""
    query = select(FileRow).where(FileRow.project_id == caller.project_id, unexpired())
    if purpose is not None:
        query = query.where(FileRow.purpose == purpose)
    if after is not None:
        if not FILE_ID.fullmatch(after):
            raise _invalid("query:/after", "a file id from a previous page", 400, "Bad cursor")
        query = query.where(FileRow.id < after if order == "desc" else FileRow.id > after)
    query = query.order_by(FileRow.id.desc() if order == "desc" else FileRow.id.asc()).limit(limit + 1)
    rows = list(session.scalars(query))
    return listed([file_object(r) for r in rows[:limit]], len(rows) > limit)


@router.get("/{file_id}", responses={404: {"description": NOT_FOUND}})
def retrieve_file(file_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    return file_object(own_file(session, caller.project_id, file_id))


@router.delete("/{file_id}", responses={404: {"description": NOT_FOUND}, 409: {"description": "A job needs it."}})
def delete_file(file_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    """Delete the file: its row and its bytes. Refused (409) while a job of the project that reads it has
    not ended (waiting, queued, running or paused): its worker reads the file when the job starts,
    and again when it is retried or resumed."""
    row = own_file(session, caller.project_id, file_id)
    # the id anywhere in the spec (dataset.file, eval.file, an OpenAI job's validation file): ids are unique
    needs = readers_of(session, caller.project_id, file_id)
    if needs:
        detail = (
            f"{file_id!r} is read by {len(needs)} job(s) of your project that have not ended ({', '.join(needs[:5])}"
            f"{', ...' if len(needs) > 5 else ''}): cancel them or wait for them to end, then delete it"
        )
        raise Problem(409, "File in use", detail)
    path = Path(row.path)
    session.delete(row)
    session.commit()
    path.unlink(missing_ok=True)
    return {"id": file_id, "object": "file", "deleted": True}


@router.get("/{file_id}/content", responses={404: {"description": NOT_FOUND}}, response_class=FileResponse)
def file_content(file_id: str, caller: CallerDep, session: SessionDep) -> FileResponse:
    """The file's bytes, as uploaded."""
    row = own_file(session, caller.project_id, file_id)
    if not Path(row.path).exists():
        raise Problem(404, "Not found", "the file's bytes are gone from the artifact directory")
    media = "text/plain" if row.purpose == RESULTS_PURPOSE else "application/jsonl"  # step metrics, base64
    return FileResponse(row.path, media_type=media, filename=row.filename)
