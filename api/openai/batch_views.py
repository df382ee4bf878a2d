"""What OpenAI's batch objects look like (api/routers/openai_batches.py), read off the generate jobs
they are views over (`BATCHES`): a batch (`batch_object`: its status, its lines' counts, its files),
and, once its job has ended, its output and error files (`finish`), written from the job's samples,
each answered line a completion object (api/openai/completion_views.py)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.openai.completion_views import completion_object
from api.openai.files import store_jsonl
from api.openai.records import BatchRecord
from api.openai.resource import JobResource
from config.settings import Settings
from mathrl.modelref import results_file_id
from mathrl.specs.generate import CHAT_ENDPOINT
from mathrl.status import TERMINAL
from store.files import OverQuota
from store.models import File, Job, Sample

TAG = "openai:batches"
NOT_FOUND = "No batch with this id in your project."
OUTPUT_PURPOSE = "batch_output"  # OpenAI's purpose of a batch's output and error files
WINDOW = timedelta(hours=24)

BATCHES = JobResource(
    "batch_", TAG, NOT_FOUND, "batch",
    statuses={"waiting": "validating", "queued": "validating", "paused": "validating", "running": "in_progress",
              "succeeded": "completed", "failed": "failed", "cancelled": "cancelled"},
    stopping="cancelling",
)  # fmt: skip


def _output_ids(job_id: str) -> tuple[str, str]:
    """The output and error files' ids: 'file-' and the job's id (as a fine-tuning job's results
    file: never another file's), and one drawn from it."""
    return results_file_id(job_id), "file-" + uuid.uuid5(uuid.UUID(job_id), "errors").hex


def _counts(session: Session, job: Job) -> tuple[int, int]:
    """Lines stored so far (answered or failed), and of them failed (their sample holds the error)."""
    lines = select(func.count(func.distinct(Sample.step))).where(Sample.job_id == job.id)
    done = session.scalar(lines) or 0
    failed = session.scalar(lines.where(Sample.data[("error", "code")].as_string().is_not(None))) or 0
    return int(done), int(failed)


def finish(
    session: Session, job: Job, settings: Settings, counts: tuple[int, int]
) -> tuple[str | None, str | None, dict[str, Any] | None]:
    """The ended batch's output and error files (ids, None where it has no such line), written from its
    samples by the first look that finds one missing (two looks at once write the same file: the
    second finds it stored); or why they could not be (the project's file quota)."""
    output_id, error_id = _output_ids(str(job.id))
    done, failed = counts
    wanted = {output_id: done - failed > 0, error_id: failed > 0}
    if all(session.get(File, i) is not None for i, want in wanted.items() if want):
        return (output_id if wanted[output_id] else None), (error_id if wanted[error_id] else None), None
    info = BatchRecord.of(job)
    chat = (job.spec.get("batch") or {}).get("endpoint") == CHAT_ENDPOINT
    rows = session.execute(
        select(Sample.id, Sample.step, Sample.index, Sample.completion, Sample.data)
        .where(Sample.job_id == job.id)
        .order_by(Sample.step, Sample.index)
    ).all()
    by_line: dict[int, list[Any]] = {}
    for r in rows:
        by_line.setdefault(int(r.step or 0), []).append(r)
    out, err = [], []
    model = str(info.model or job.spec.get("model") or "")
    for step, got in sorted(by_line.items()):
        data = dict(got[0].data or {})
        custom, request_id = data.get("custom_id"), f"req_{str(job.id).replace('-', '')}_{step}"
        line_id = "batch_req_" + str(got[0].id).replace("-", "")
        if "error" in data:
            err.append({"id": line_id, "custom_id": custom, "response": None, "error": data["error"]})
            continue
        choices = [{"text": r.completion, **(r.data or {})} for r in got]
        answer = completion_object(str(job.id), model, choices, chat)
        answer["id"] = ("chatcmpl-" if chat else "cmpl-") + request_id.removeprefix("req_")
        response = {"status_code": 200, "request_id": request_id, "body": answer}
        out.append({"id": line_id, "custom_id": custom, "response": response, "error": None})
    written: dict[str, str | None] = {}
    for file_id, items, name in ((output_id, out, "batch_output.jsonl"), (error_id, err, "batch_errors.jsonl")):
        if not items:
            written[file_id] = None
            continue
        try:
            store_jsonl(
                session, settings, job.project_id, file_id, items, filename=name, purpose=OUTPUT_PURPOSE,
                data={"lines": len(items)},
            )  # fmt: skip
        except OverQuota as exc:
            message = f"the output files were not stored: {exc}; delete files, then retrieve the batch again"
            return None, None, {"object": "list", "data": [{"code": "file_quota", "message": message}]}
        written[file_id] = file_id
    return written[output_id], written[error_id], None


def batch_object(session: Session, job: Job, settings: Settings) -> dict[str, Any]:
    """The batch as OpenAI's object, its files written once its job has ended."""
    info = BatchRecord.of(job)
    request = info.request
    done, failed = _counts(session, job)
    status = BATCHES.status(job)
    output_id = error_id = None
    errors: dict[str, Any] | None = None
    if job.status in TERMINAL:
        output_id, error_id, errors = finish(session, job, settings, (done, failed))
    if job.status == "failed":
        failure = {"code": "batch_failed", "message": job.error or "its job failed", "param": None, "line": None}
        errors = {"object": "list", "data": [failure, *((errors or {}).get("data") or [])]}

    def at(when: Any, now: bool = True) -> int | None:
        return int(when.timestamp()) if when is not None and now else None

    created = job.created_at
    return {
        "id": BATCHES.id_of(job),
        "object": "batch",
        "endpoint": request.get("endpoint"),
        "model": info.model,
        "errors": errors,
        "input_file_id": request.get("input_file_id"),
        "completion_window": "24h",
        "status": status,
        "output_file_id": output_id,
        "error_file_id": error_id,
        "created_at": at(created),
        "in_progress_at": at(job.started_at),
        "expires_at": at(created + WINDOW),
        "finalizing_at": None,
        "completed_at": at(job.finished_at, job.status == "succeeded"),
        "failed_at": at(job.finished_at, job.status == "failed"),
        "expired_at": None,
        "cancelling_at": at(job.updated_at, bool(job.cancel_requested) and job.status in ("running", "cancelled")),
        "cancelled_at": at(job.finished_at, job.status == "cancelled"),
        "request_counts": {"total": info.total, "completed": done - failed, "failed": failed},
        "metadata": request.get("metadata") or {},
    }
