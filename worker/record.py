"""How an attempt's end is recorded: its outcome (succeeded, failed, cancelled), a drained job
handed back to the queue, an attempt that lost its lease, the job's vLLM server gone; events the
supervisor adds; and the pipeline jobs an end releases, sent at once."""

from __future__ import annotations

import base64
import csv
import io
import logging
import signal
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from config.settings import Settings
from mathrl.modelref import FINE_TUNING_TAG, RESULTS_COLUMNS, RESULTS_PURPOSE, results_file_id
from store.db import retry_transient, session_scope
from store.files import OverQuota, Quota, store_file
from store.jobs import add_event, finish, hand_back
from store.models import File, Job, Metric
from worker.attempt import AttemptDir
from worker.child import EXIT_OK, EXIT_STOPPED, EXIT_UNAVAILABLE

log = logging.getLogger("mathrl.worker")


def event(
    url: str, job_id: str, kind: str, message: str, data: dict[str, Any] | None = None, level: str = "info"
) -> None:
    try:
        with session_scope(url) as s:
            add_event(s, job_id, kind, message, level, data=data)
    except Exception as exc:  # database briefly down: the job runs anyway
        log.warning("recording %s of %s failed (%s)", kind, job_id, type(exc).__name__)


def record_end(settings: Settings, job_id: str, owner: str, code: int, cancelled: bool, log_path: Path) -> str:
    error = AttemptDir(log_path.parent).read_error()
    if cancelled or code == EXIT_STOPPED:
        status, error, message = "cancelled", None, f"cancelled; job process exited with {code}"
    elif code == EXIT_OK:
        status, message = "succeeded", "job finished"
    else:
        status = "failed"
        if code < 0:
            name = signal.Signals(-code).name
            error = f"job process killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
        elif code == EXIT_UNAVAILABLE:
            error = error or "job kind not available on this worker"
        else:
            error = error or f"job process exited with code {code}"
            error += f" (log: {log_name(settings, log_path)})"
        message = error
    for attempt in range(30):  # the database may be briefly down: the outcome must not be lost
        try:
            with session_scope(settings.database.url) as s:
                if not finish(s, job_id, owner, status, error, message):
                    add_event(s, job_id, "stale_finish", f"{owner} finished after losing its lease", "warning")
            send_released(settings)
            if status == "succeeded":
                write_results_file(settings, job_id)
            return status
        except Exception as exc:
            log.warning("recording the end of %s failed (%s); retry %d", job_id, type(exc).__name__, attempt + 1)
            time.sleep(1.0)
    return status


def write_results_file(settings: Settings, job_id: str) -> None:
    """A succeeded fine-tuning job's step metrics as OpenAI's results file (its `result_files`): a CSV
    with a row per step and a column per metric the job logged (OpenAI's names first: RESULTS_COLUMNS),
    base64-encoded as OpenAI's is (its cookbook's `base64.b64decode(client.files.content(id).read())`),
    stored as a file of its project (purpose fine-tune-results) that files.content reads. Written once;
    a failure is logged, not raised: the job has succeeded either way."""
    try:
        with session_scope(settings.database.url) as s:
            job = s.get(Job, job_id)
            file_id = results_file_id(job_id)
            if job is None or job.status != "succeeded" or FINE_TUNING_TAG not in (job.tags or []):
                return  # (a stale worker's end: its own exit said succeeded, the row says otherwise)
            if s.get(File, file_id) is not None:
                return
            rows = s.execute(select(Metric.step, Metric.name, Metric.value).where(Metric.job_id == job_id)).all()
            steps: dict[int, dict[str, float]] = {}
            for step, name, value in rows:
                steps.setdefault(step, {})[name] = value
            logged = {name for _, name, _ in rows}
            names = [n for n in RESULTS_COLUMNS if n in logged] + sorted(logged - RESULTS_COLUMNS.keys())
            columns = ["step", *(RESULTS_COLUMNS.get(n, n) for n in names)]
            out = io.StringIO()
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(columns)
            for step in sorted(steps):
                writer.writerow([step, *(steps[step].get(n, "") for n in names)])
            store_file(
                s,
                settings.artifact_dir,
                Quota.of(settings.files),
                file_id=file_id,
                project_id=job.project_id,
                suffix=".csv",
                content=base64.b64encode(out.getvalue().encode()),  # as OpenAI serves it: scripts b64decode it
                filename="step_metrics.csv",
                purpose=RESULTS_PURPOSE,
                data={"lines": len(steps), "columns": columns},
            )
    except OverQuota as exc:  # as an upload would be refused: the project's storage is full
        log.warning("the results file of %s was not stored: %s", job_id, exc)
        event(
            settings.database.url,
            job_id,
            "results_file",
            f"no results file: {exc}; delete files first",
            level="warning",
        )
    except Exception as exc:  # the job's outcome is recorded; its results file is a view of its metrics
        log.warning("writing the results file of %s failed (%s: %s)", job_id, type(exc).__name__, exc)


def log_name(settings: Settings, log_path: Path) -> str:
    """The job log as the operator finds it, without this server's paths (users see job errors)."""
    try:
        return f"{log_path.relative_to(Path(settings.artifact_dir).resolve())} in the artifact directory"
    except ValueError:
        return log_path.name


def hand_back_drained(settings: Settings, job_id: str, owner: str, attempt: int, code: int, timed_out: bool) -> str:
    """The job stopped for a drain (or was killed when it did not within drain_seconds): put it
    back in the queue, to resume from its newest checkpoint on another worker. Retried through a
    database outage; if it still cannot be written, the lease lapses and the reconciler re-queues."""
    from sqlalchemy import func, select

    from store.models import Checkpoint

    how = (
        f"it did not stop within drain_seconds={settings.worker.drain_seconds:g} and was killed"
        if timed_out
        else f"attempt {attempt} stopped (exit {code})"
    )

    def write() -> str | None:
        with session_scope(settings.database.url) as s:
            step = s.scalar(
                select(func.max(Checkpoint.step)).where(Checkpoint.job_id == job_id, Checkpoint.kind == "checkpoint")
            )
            where = "starts again (no checkpoint)" if step is None else f"resumes from its checkpoint at step {step}"
            return hand_back(
                s,
                job_id,
                owner,
                f"drained: {how}; re-queued, {where} (not counted against max_attempts)",
                {"attempt": attempt, "checkpoint_step": step, "timed_out": timed_out},
            )

    try:
        status = retry_transient(write, f"job {job_id}: handing it back")
    except Exception as exc:
        log.warning("handing back %s failed (%s); its lease will lapse and the reconciler re-queue it", job_id, exc)
        return "drained"
    if status is None:
        log.warning("job %s: lost the lease before handing it back", job_id)
        return "lost"
    log.info("job %s handed back (%s)", job_id, status)
    send_released(settings)
    return "drained" if status in ("queued", "paused") else status


def report_stale(url: str, job_id: str, owner: str, attempt: int, out: Path) -> None:
    """This attempt lost the job to another (its lease lapsed while it could not reach the
    database): say so, with how many of its process's writes the fence refused."""
    rejected_log = AttemptDir(out).rejected_writes
    rejected = len(rejected_log.read_text().splitlines()) if rejected_log.exists() else 0
    log.warning(
        "job %s attempt %d: lost the lease; the job process stopped, %d of its writes refused",
        job_id,
        attempt,
        rejected,
    )
    event(
        url,
        job_id,
        "stale_attempt",
        f"attempt {attempt} ({owner}) lost its lease to another attempt; its "
        f"process stopped, {rejected} of its writes refused",
        {"attempt": attempt, "rejected_writes": rejected},
        "warning",
    )


def report_server_exit(url: str, job_id: str, server: Any, out: Path, shared: bool = False) -> None:
    """The server's exit code and its reason (worker.vllm_server.engine_reason: the exception it died
    of), as the job's error and in its events, with the tail of its log. A `shared` one (the worker's
    warm engine, worker/warm_engine.py) served other jobs, other projects' among them, and its log
    holds their models' paths and requests: the job gets its exit code and only what no request's
    text is in (its failed start, or its engine core's fatal error)."""
    from worker.vllm_server import engine_reason

    code = server.exited()
    try:
        reason = engine_reason(server.log_path.read_text(errors="replace"), shared=shared)
    except OSError:
        reason = None
    because = f": {reason}" if reason else ""
    if shared:
        said = (
            f"the worker's shared vLLM engine exited with code {code}{because} (the rest of its log is the "
            "operator's: other jobs used it)"
        )
        AttemptDir(out).write_error(said)
        event(url, job_id, "vllm_server", said, {"code": code, "reason": reason}, "error")
        return
    AttemptDir(out).write_error(
        f"the job's vLLM server exited with code {code}{because}; its log ends: ...{server.log_tail(600)}"
    )
    event(
        url,
        job_id,
        "vllm_server",
        f"the vLLM server exited with code {code}{because}",
        {"code": code, "reason": reason, "log_tail": server.log_tail()},
        "error",
    )


def send_released(settings: Settings) -> None:
    """Send the pipeline jobs this job's end released, now rather than at the next reconcile."""
    from worker.celery_app import get_celery
    from worker.reconciler import reconcile_once

    try:
        reconcile_once(settings, get_celery(settings.broker.url, settings.broker.visibility_timeout))
    except Exception as exc:  # the reconciler thread sends them later
        log.warning("sending released jobs failed (%s); the reconciler will", exc)
