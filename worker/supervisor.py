"""Supervising one job: claim the row, start the job process, keep the lease alive, pass on
cancels, and record how it ended."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from mathrl.specs import parse_spec
from service.settings import Settings
from store.db import session_scope
from store.jobs import add_event, claim, finish, renew_lease
from worker.child import EXIT_OK, EXIT_STOPPED, EXIT_UNAVAILABLE, job_dir
from worker.launch import clear_outcome, describe, die_with_parent, job_command, job_exit_code, job_groups, read_error

log = logging.getLogger("mathrl.worker")


def worker_identity(task_id: str | None = None) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}" + (f":{task_id}" if task_id else "")


def _prepare_child() -> None:
    """Runs in the job process before exec. Unblock every signal (the worker's pool thread may
    have some blocked, and a child inherits the mask: vLLM's engine hung on it), and (Linux)
    SIGKILL the job if the supervising worker dies, so a killed worker never leaves an orphan
    writing to the job while another worker takes it over."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    die_with_parent()


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the job's process group and the groups below it (each rank of a multi-process
    job leads its own)."""
    for group in job_groups(proc.pid):
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_process(proc: subprocess.Popen[bytes], grace: float) -> int:
    """SIGTERM the job's process group, then SIGKILL after `grace` seconds."""
    _kill_group(proc, signal.SIGTERM)
    try:
        return proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _kill_group(proc, signal.SIGKILL)
        return proc.wait()


def supervise(settings: Settings, job_id: str, owner: str) -> str:
    """Run one job to the end. Returns the final status, or 'skipped' if it was not ours to run."""
    url = settings.database.url
    w = settings.worker
    with session_scope(url) as s:
        job = claim(s, job_id, owner, w.lease_seconds)
        if job is None:
            log.info("job %s not claimable (already taken, cancelled or finished); skipping", job_id)
            return "skipped"
        attempt = job.attempts
        try:
            cmd = job_command(parse_spec(job.spec), job_id, owner)
        except ValueError:  # a spec this version cannot read: the job process reports why
            cmd = [sys.executable, "-m", "worker.child", job_id, owner]
    out = job_dir(settings.artifact_dir, job_id)
    out.mkdir(parents=True, exist_ok=True)
    clear_outcome(out)
    log_path = out / f"attempt-{attempt}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(
            cmd,
            stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,  # its own process group: a cancel reaches its children too
            preexec_fn=_prepare_child,
        )
    log.info("job %s attempt %d: process %d, %s, log %s", job_id, attempt, proc.pid, describe(cmd), log_path)
    if cmd[1:3] != ["-m", "worker.child"]:
        try:
            with session_scope(url) as s:
                add_event(s, job_id, "launched", f"launched {describe(cmd)}",
                          data={"processes": int(cmd[cmd.index("--num_processes") + 1]), "command": cmd[1:]})
        except Exception as exc:  # database briefly down: the job runs anyway
            log.warning("recording the launch of %s failed (%s)", job_id, type(exc).__name__)
    cancelled = lost = False
    while True:
        try:
            code = proc.wait(timeout=w.heartbeat_seconds)
            break
        except subprocess.TimeoutExpired:
            pass
        try:
            with session_scope(url) as s:
                beat = renew_lease(s, job_id, owner, w.lease_seconds)
        except Exception as exc:  # database briefly down: keep the job running, retry next beat
            log.warning("heartbeat for %s failed (%s); retrying", job_id, type(exc).__name__)
            continue
        if not beat.owned:
            log.warning("lost the lease on %s; stopping its process", job_id)
            lost = True
            code = stop_process(proc, w.cancel_grace_seconds)
            break
        if beat.cancel_requested:
            cancelled = True
            code = stop_process(proc, w.cancel_grace_seconds)
            break
    _kill_group(proc, signal.SIGKILL)  # whatever the job started (engine processes) goes with it
    code = job_exit_code(code, out)
    return _record_end(settings, job_id, owner, code, cancelled, lost, log_path)


def _record_end(
    settings: Settings, job_id: str, owner: str, code: int, cancelled: bool, lost: bool, log_path: Path
) -> str:
    if lost:
        return "lost"
    error = read_error(job_dir(settings.artifact_dir, job_id))
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
            error += f" (log: {log_path})"
        message = error
    for attempt in range(30):  # the database may be briefly down: the outcome must not be lost
        try:
            with session_scope(settings.database.url) as s:
                if not finish(s, job_id, owner, status, error, message):
                    add_event(s, job_id, "stale_finish", f"{owner} finished after losing its lease", "warning")
            _send_released(settings)
            return status
        except Exception as exc:
            log.warning("recording the end of %s failed (%s); retry %d", job_id, type(exc).__name__, attempt + 1)
            time.sleep(1.0)
    return status


def _send_released(settings: Settings) -> None:
    """Send the pipeline jobs this job's end released, now rather than at the next reconcile."""
    from worker.celery_app import get_celery
    from worker.reconciler import reconcile_once

    try:
        reconcile_once(settings, get_celery(settings.broker.url, settings.broker.visibility_timeout))
    except Exception as exc:  # the reconciler thread sends them later
        log.warning("sending released jobs failed (%s); the reconciler will", exc)
