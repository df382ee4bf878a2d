"""The watch loop of a running attempt, the same for a local process and a Ray job (a
`JobHandle`): act on each renewal of the lease (worker.lease keeps it alive): pass on a cancel
or a pause, drain the job when the worker shuts down, stop it if the lease is lost or its vLLM
server dies, then record how it ended (worker.record)."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from config.settings import Settings
from worker.attempt import AttemptDir
from worker.child import EXIT_DRAINED, EXIT_ERROR, EXIT_LOST, EXIT_OK, EXIT_STOPPED
from worker.job_handle import JobHandle
from worker.launch import job_exit_code
from worker.lease import LeaseKeeper
from worker.record import event, hand_back_drained, record_end, report_server_exit, report_stale

log = logging.getLogger("mathrl.worker")

# Set when the worker process got SIGTERM (worker.tasks connects Celery's shutdown signal):
# every job this worker runs is drained, i.e. checkpointed and handed back to the queue.
shutting_down = threading.Event()
POLL_SECONDS = 0.5  # how soon the supervisor sees its job exit or its worker shutting down


def watch(
    settings: Settings,
    job_id: str,
    owner: str,
    job: JobHandle,
    out: Path,
    attempt: int,
    lease: LeaseKeeper,
    server: Any = None,
    shared_server: bool = False,
) -> str:
    """Watch the attempt to its end and record it; the job's final status ('lost': another attempt
    has it, 'drained': back in the queue). `lease` renews the job's lease meanwhile."""
    url = settings.database.url
    w = settings.worker
    launched = job.launched()
    if launched is not None:
        event(url, job_id, "launched", *launched)
    cancelled = lost = server_reported = drain_timed_out = False
    drain_since: float | None = None
    while True:
        try:
            code = job.wait(timeout=POLL_SECONDS)
            break
        except subprocess.TimeoutExpired:
            pass
        if shutting_down.is_set() and drain_since is None:
            drain_since = time.monotonic()
            request_drain(url, job_id, owner, out, w.drain_seconds)
        if drain_since is not None and time.monotonic() - drain_since > w.drain_seconds:
            log.warning("job %s did not stop within drain_seconds=%s; stopping it", job_id, w.drain_seconds)
            drain_timed_out = True
            code = job.stop(min(w.cancel_grace_seconds, 5.0))
            break
        beat = lease.next_beat(0)
        if beat is None:  # no renewal since the last look (or it failed: the keeper retries)
            continue
        if server is not None and server.exited() is not None:
            report_server_exit(url, job_id, server, out, shared_server)
            server_reported = True
            job.stop(w.cancel_grace_seconds)
            code = EXIT_ERROR
            break
        if not beat.owned:
            log.warning("lost the lease on %s; stopping its process", job_id)
            lost = True
            code = job.stop(w.cancel_grace_seconds)
            break
        if beat.cancel_requested:
            cancelled = True
            code = job.stop(w.cancel_grace_seconds)
            break
        if beat.pause_requested and drain_since is None:  # a pause: the same drain, handed back as paused
            drain_since = time.monotonic()
            request_drain(url, job_id, owner, out, w.drain_seconds, paused=True)
    job.end()
    if server is not None and not server_reported and code != EXIT_OK and server.exited() is not None:
        report_server_exit(url, job_id, server, out, shared_server)  # the job failed because its server went away
    code = job_exit_code(code, out) if not server_reported else code
    if drain_since is None and code == EXIT_DRAINED and not cancelled:
        drain_since = time.monotonic()  # the job read its pause from the job row before this loop did
    if lost or code == EXIT_LOST:
        report_stale(url, job_id, owner, attempt, out)
        return "lost"
    if drain_since is not None and not cancelled and (code in (EXIT_DRAINED, EXIT_STOPPED) or drain_timed_out):
        return hand_back_drained(settings, job_id, owner, attempt, code, drain_timed_out)
    return record_end(settings, job_id, owner, code, cancelled, AttemptDir(out).log)


def request_drain(url: str, job_id: str, owner: str, out: Path, seconds: float, paused: bool = False) -> None:
    """Ask the job process (every rank: they all watch the attempt's directory) to save a
    checkpoint at its next step and stop."""
    AttemptDir(out).drain_request.touch()
    log.info("draining job %s: %s", job_id, "paused" if paused else "worker shutting down")
    why = "it was paused" if paused else f"worker {owner.split(':')[0]} is shutting down (SIGTERM)"
    where = "waits, paused, until it is resumed" if paused else "goes back to the queue"
    event(
        url,
        job_id,
        "drain_requested",
        f"{why}: the job saves a checkpoint at its next step and {where} (drain_seconds={seconds:g})",
        {"drain_seconds": seconds, "paused": paused},
        "info" if paused else "warning",
    )
