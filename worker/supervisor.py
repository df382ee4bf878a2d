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
from typing import Any

from mathrl.specs import parse_spec
from mathrl.specs.resolved import ResolvedConfig, ResolvedGRPO, resolved
from service.settings import Settings
from store.db import retry_transient, session_scope
from store.jobs import add_event, claim, finish, hand_back, renew_lease
from worker import warm_engine
from worker.attempt import AttemptDir, attempt_dir
from worker.child import (
    EXIT_DRAINED,
    EXIT_ERROR,
    EXIT_LOST,
    EXIT_OK,
    EXIT_STOPPED,
    EXIT_UNAVAILABLE,
    model_resolver,
)
from worker.launch import (
    child_args,
    describe,
    die_with_parent,
    job_command,
    job_exit_code,
    job_groups,
)
from worker.tracking import start_mirror
from worker.vllm_server import lora_rank, needs_server, start_server
from worker.warm_engine import ENGINE_ADAPTER_ENV, ENGINE_URL_ENV, engine_model, wants_warm_engine

log = logging.getLogger("mathrl.worker")

# Set when the worker process got SIGTERM (worker.tasks connects Celery's shutdown signal):
# every job this worker runs is drained, i.e. checkpointed and handed back to the queue.
shutting_down = threading.Event()
POLL_SECONDS = 0.5  # how soon the supervisor sees its job exit or its worker shutting down
START_SECONDS = 180.0  # submitting to Ray (earlier attempts stopped first) must be done within this


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


def stop_process(proc: Any, grace: float) -> int:
    """SIGTERM the job's process group, then SIGKILL after `grace` seconds (a Ray job: its own stop)."""
    if not isinstance(proc, subprocess.Popen):
        return int(proc.stop(grace))
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
    if shutting_down.is_set():  # not claimed: the reconciler sends it again, to another worker
        log.info("job %s not started: this worker is shutting down", job_id)
        return "skipped"
    with session_scope(url) as s:
        job = claim(s, job_id, owner, w.lease_seconds)
        if job is None:
            log.info("job %s not claimable (already taken, cancelled or finished); skipping", job_id)
            return "skipped"
        attempt = job.attempts
        spec = None
        try:
            spec = parse_spec(job.spec)
            cmd = job_command(spec, job_id, owner, attempt)
        except ValueError:  # a spec this version cannot read: the job process reports why
            cmd = [sys.executable, *child_args(job_id, owner, attempt)]
        project_id, config = job.project_id, resolved(job.resolved_config or {"kind": job.kind})
    out = attempt_dir(settings.artifact_dir, job_id, attempt)  # this attempt's own (worker.child)
    out.mkdir(parents=True, exist_ok=True)
    mirror = start_mirror(settings, job_id)  # None unless runs are mirrored to MLflow (worker.tracking)
    status: str | None = None
    try:
        status = _run_attempt(settings, spec, job_id, owner, attempt, cmd, config, project_id, out)
        return status
    finally:
        if mirror is not None:  # after the job's end is recorded: MLflow never delays it
            mirror.close(status)


def _run_attempt(
    settings: Settings,
    spec: Any,
    job_id: str,
    owner: str,
    attempt: int,
    cmd: list[str],
    config: ResolvedConfig,
    project_id: str,
    out: Path,
) -> str:
    """The claimed attempt, on this worker or on Ray, to its recorded end."""
    url = settings.database.url
    log_path = AttemptDir(out).log
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if spec is not None and settings.ray.runs(spec):
        return _run_on_ray(settings, spec, job_id, owner, attempt, out, log_path)
    server = engine = None
    if spec is not None and wants_warm_engine(spec, settings):
        try:
            acquired = _warm_engine(settings, spec, project_id, out / "vllm-engine.log", job_id)
        except Exception as exc:  # a model ref that does not resolve: the job fails with it
            AttemptDir(out).write_error(f"starting the vLLM engine failed: {type(exc).__name__}: {exc}")
            return _record_end(settings, job_id, owner, EXIT_ERROR, False, log_path)
        if acquired is not None:
            engine, adapter = acquired
            server = engine.server
            env[ENGINE_URL_ENV] = server.url
            if adapter is not None:
                env[ENGINE_ADAPTER_ENV] = adapter
        else:
            warm_engine.stop_idle()
    elif spec is not None:
        warm_engine.stop_idle()  # training and HF evals need the GPUs and cores
    if spec is not None and needs_server(spec):
        try:
            server, server_env = _start_vllm_server(settings, spec, config, project_id, out / "vllm-server.log", job_id)
        except Exception as exc:  # a model ref that does not resolve, no vLLM here: the job fails with it
            AttemptDir(out).write_error(f"starting the vLLM server failed: {type(exc).__name__}: {exc}")
            return _record_end(settings, job_id, owner, EXIT_ERROR, False, log_path)
        env.update(server_env)
        _event(
            url,
            job_id,
            "vllm_server",
            f"started a vLLM server for this job at {server.url} (process "
            f"{server.proc.pid}, log {server.log_path.name})",
            {"url": server.url, "pid": server.proc.pid},
        )
    try:
        return _run_job_process(settings, job_id, owner, cmd, env, out, log_path, attempt, server)
    finally:
        if engine is not None:
            warm_engine.release(engine, settings)
        elif server is not None:
            server.stop()


def _run_on_ray(settings: Settings, spec: Any, job_id: str, owner: str, attempt: int, out: Path, log_path: Path) -> str:
    """The job past one node (or in a pool set to run on Ray): a Ray job on the operator's cluster
    (worker.ray_submit), watched by the same loop as a local job process."""
    from worker.ray_submit import RayJob, RayUnavailable

    url = settings.database.url
    if settings.ray.address is None:
        AttemptDir(out).write_error(
            f"the job asks for resources.nodes={spec.resources.nodes} and this worker has no Ray cluster "
            "configured: set MATHRL_RAY__ADDRESS on the workers of this queue"
        )
        return _record_end(settings, job_id, owner, EXIT_ERROR, False, log_path)
    warm_engine.stop_idle()

    def event(kind: str, message: str, data: dict[str, Any] | None = None, level: str = "info") -> None:
        _event(url, job_id, kind, message, data, level)

    ray_job = RayJob(settings, spec, job_id, owner, attempt, out, log_path, event)
    failed: list[str] = []

    def start() -> None:
        try:
            ray_job.start()
        except RayUnavailable as exc:
            failed.append(str(exc))
        except Exception as exc:
            failed.append(f"submitting to the Ray cluster failed: {type(exc).__name__}: {exc}")

    # the Jobs API can take seconds (a busy head; earlier attempts to stop): the lease is kept alive
    starting = threading.Thread(target=start, name=f"mathrl-ray-submit-{job_id}", daemon=True)
    starting.start()
    deadline = time.monotonic() + START_SECONDS
    while starting.is_alive() and time.monotonic() < deadline:
        starting.join(settings.worker.heartbeat_seconds)
        try:
            with session_scope(url) as s:
                renew_lease(s, job_id, owner, settings.worker.lease_seconds)
        except Exception as exc:  # database briefly down: retried next beat
            log.warning("heartbeat for %s failed (%s)", job_id, type(exc).__name__)
    if starting.is_alive():
        failed.append(
            f"the Ray cluster at MATHRL_RAY__ADDRESS={settings.ray.address!r} did not take the job within "
            f"{START_SECONDS:g} s"
        )
    if failed:
        AttemptDir(out).write_error(failed[0])
        return _record_end(settings, job_id, owner, EXIT_ERROR, False, log_path)
    return _run_job_process(settings, job_id, owner, [], {}, out, log_path, attempt, None, ray_job)


def _event(
    url: str, job_id: str, kind: str, message: str, data: dict[str, Any] | None = None, level: str = "info"
) -> None:
    try:
        with session_scope(url) as s:
            add_event(s, job_id, kind, message, level, data=data)
    except Exception as exc:  # database briefly down: the job runs anyway
        log.warning("recording %s of %s failed (%s)", kind, job_id, type(exc).__name__)


def _warm_engine(
    settings: Settings, spec: Any, project_id: str, log_path: Path, job_id: str
) -> tuple[warm_engine.WarmEngine, str | None] | None:
    """This worker's warm vLLM engine for the job's model, started if there is none, and the LoRA
    adapter to load into it: a LoRA checkpoint's engine is its base model's, with LoRA on, and the
    job process loads the adapter (ENGINE_ADAPTER_ENV). None: the base's engine is busy without LoRA."""
    model = engine_model(spec)
    assert model is not None  # wants_warm_engine checked that it has one
    model_path, _ = model_resolver(settings, job_id, project_id)(model)  # as the job's process does
    adapter = warm_engine.adapter_of(model_path)
    served, rank = (adapter.base, lora_rank(adapter.rank)) if adapter else (model_path, 0)
    gpus = _visible_gpus()[: spec.resources.gpus] if spec.resources.gpus else []
    acquired = warm_engine.acquire(settings, served, spec.dtype, gpus, log_path, _prepare_child, lora_rank=rank)
    if acquired is None:
        _event(
            settings.database.url,
            job_id,
            "vllm_engine",
            f"{model} is a LoRA adapter and this worker's engine of its base is busy without LoRA: no warm engine",
        )
        return None
    engine, came = acquired
    how = {
        "reused": f"reused this worker's warm vLLM engine (job {engine.jobs} on it)",
        "reloaded": f"loaded this model's weights into this worker's warm vLLM engine of the same model family in "
        f"{engine.reload_seconds or 0:.1f} s instead of starting one (job {engine.jobs} on it)",
        "started": "started a vLLM engine",
    }[came]
    _event(
        settings.database.url,
        job_id,
        "vllm_engine",
        f"{how} at {engine.server.url} (process {engine.server.proc.pid})"
        + (f", serving LoRA adapters of {served} up to rank {rank}" if adapter else "")
        + f"; it stays warm for the next eval of this model for {settings.worker.warm_engine_idle_seconds:.0f} s",
        {
            "url": engine.server.url,
            "pid": engine.server.proc.pid,
            "reused": came != "started",
            "how": came,
            "reload_seconds": engine.reload_seconds if came == "reloaded" else None,
            "jobs": engine.jobs,
            "adapter": adapter.path if adapter else None,
        },
    )
    return engine, adapter.path if adapter else None


def _visible_gpus() -> list[str]:
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    if not visible:
        import torch

        visible = [str(i) for i in range(torch.cuda.device_count())]
    return visible


def _start_vllm_server(
    settings: Settings, spec: Any, config: ResolvedConfig, project_id: str, log_path: Path, job_id: str
) -> Any:
    model_path, _ = model_resolver(settings, job_id, project_id)(spec.model)  # 'job:' and 'tiny:' refs too
    visible = _visible_gpus() if spec.resources.gpus else []
    return start_server(
        spec, config.of(ResolvedGRPO), model_path, log_path, _prepare_child, visible, settings.vllm.engine()
    )


def _report_server_exit(url: str, job_id: str, server: Any, out: Path) -> None:
    """The server's exit code and the tail of its log, as the job's error and in its events."""
    code = server.exited()
    AttemptDir(out).write_error(
        f"the job's vLLM server exited with code {code}; its log ends: ...{server.log_tail(600)}"
    )
    _event(
        url, job_id, "vllm_server", f"the vLLM server exited with code {code}", {"log_tail": server.log_tail()}, "error"
    )


def _run_job_process(
    settings: Settings,
    job_id: str,
    owner: str,
    cmd: list[str],
    env: dict[str, str],
    out: Path,
    log_path: Path,
    attempt: int,
    server: Any,
    ray_job: Any = None,
) -> str:
    """Watch the job's processes to their end: a local process (started here from `cmd`) or a
    Ray job already submitted (worker.ray_submit.RayJob, which answers wait/stop alike)."""
    url = settings.database.url
    w = settings.worker
    proc: Any
    if ray_job is not None:
        proc = ray_job
        n = ray_job.workers_asked
        log.info("job %s attempt %d: Ray job %s, log %s", job_id, attempt, ray_job.id, log_path)
        _event(
            url,
            job_id,
            "launched",
            f"launched {n} processes (Ray Train workers on {ray_job.nodes} nodes)"
            if n > 1
            else "launched 1 process (on Ray)",
            {"processes": n, "nodes": ray_job.nodes, "submission_id": ray_job.id},
        )
    else:
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its own process group: a cancel reaches its children too
                preexec_fn=_prepare_child,
            )
        log.info("job %s attempt %d: process %d, %s, log %s", job_id, attempt, proc.pid, describe(cmd), log_path)
    if ray_job is None and cmd[1:3] != ["-m", "worker.child"]:
        _event(
            url,
            job_id,
            "launched",
            f"launched {describe(cmd)}",
            {"processes": int(cmd[cmd.index("--num_processes") + 1]), "command": cmd[1:]},
        )
    cancelled = lost = server_reported = drain_timed_out = False
    drain_since: float | None = None
    next_beat = time.monotonic() + w.heartbeat_seconds
    while True:
        try:
            code = proc.wait(timeout=POLL_SECONDS)
            break
        except subprocess.TimeoutExpired:
            pass
        if shutting_down.is_set() and drain_since is None:
            drain_since = time.monotonic()
            _request_drain(url, job_id, owner, out, w.drain_seconds)
        if drain_since is not None and time.monotonic() - drain_since > w.drain_seconds:
            log.warning("job %s did not stop within drain_seconds=%s; stopping it", job_id, w.drain_seconds)
            drain_timed_out = True
            code = stop_process(proc, min(w.cancel_grace_seconds, 5.0))
            break
        if time.monotonic() < next_beat:
            continue
        next_beat = time.monotonic() + w.heartbeat_seconds
        try:
            with session_scope(url) as s:
                beat = renew_lease(s, job_id, owner, w.lease_seconds)
        except Exception as exc:  # database briefly down: keep the job running, retry next beat
            log.warning("heartbeat for %s failed (%s); retrying", job_id, type(exc).__name__)
            continue
        if server is not None and server.exited() is not None:
            _report_server_exit(url, job_id, server, out)
            server_reported = True
            stop_process(proc, w.cancel_grace_seconds)
            code = EXIT_ERROR
            break
        if not beat.owned:
            log.warning("lost the lease on %s; stopping its process", job_id)
            lost = True
            code = stop_process(proc, w.cancel_grace_seconds)
            break
        if beat.cancel_requested:
            cancelled = True
            code = stop_process(proc, w.cancel_grace_seconds)
            break
        if beat.pause_requested and drain_since is None:  # a pause: the same drain, handed back as paused
            drain_since = time.monotonic()
            _request_drain(url, job_id, owner, out, w.drain_seconds, paused=True)
    if ray_job is None:
        _kill_group(proc, signal.SIGKILL)  # whatever the job started (engine processes) goes with it
    if server is not None and not server_reported and code != EXIT_OK and server.exited() is not None:
        _report_server_exit(url, job_id, server, out)  # the job failed because its server went away
    code = job_exit_code(code, out) if not server_reported else code
    if lost or code == EXIT_LOST:
        _report_stale(url, job_id, owner, attempt, out)
        return "lost"
    if drain_since is not None and not cancelled and (code in (EXIT_DRAINED, EXIT_STOPPED) or drain_timed_out):
        return _hand_back(settings, job_id, owner, attempt, code, drain_timed_out)
    return _record_end(settings, job_id, owner, code, cancelled, log_path)


def _request_drain(url: str, job_id: str, owner: str, out: Path, seconds: float, paused: bool = False) -> None:
    """Ask the job process (every rank: they all watch the attempt's directory) to save a
    checkpoint at its next step and stop."""
    AttemptDir(out).drain_request.touch()
    log.info("draining job %s: %s", job_id, "paused" if paused else "worker shutting down")
    why = "it was paused" if paused else f"worker {owner.split(':')[0]} is shutting down (SIGTERM)"
    where = "waits, paused, until it is resumed" if paused else "goes back to the queue"
    _event(
        url,
        job_id,
        "drain_requested",
        f"{why}: the job saves a checkpoint at its next step and {where} (drain_seconds={seconds:g})",
        {"drain_seconds": seconds, "paused": paused},
        "info" if paused else "warning",
    )


def _hand_back(settings: Settings, job_id: str, owner: str, attempt: int, code: int, timed_out: bool) -> str:
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
    _send_released(settings)
    return "drained" if status in ("queued", "paused") else status


def _report_stale(url: str, job_id: str, owner: str, attempt: int, out: Path) -> None:
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
    _event(
        url,
        job_id,
        "stale_attempt",
        f"attempt {attempt} ({owner}) lost its lease to another attempt; its "
        f"process stopped, {rejected} of its writes refused",
        {"attempt": attempt, "rejected_writes": rejected},
        "warning",
    )


def _log_name(settings: Settings, log_path: Path) -> str:
    """The job log as the operator finds it, without this server's paths (users see job errors)."""
    try:
        return f"{log_path.relative_to(Path(settings.artifact_dir).resolve())} in the artifact directory"
    except ValueError:
        return log_path.name


def _record_end(settings: Settings, job_id: str, owner: str, code: int, cancelled: bool, log_path: Path) -> str:
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
            error += f" (log: {_log_name(settings, log_path)})"
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
