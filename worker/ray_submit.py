"""A job on the operator's Ray cluster, seen from the worker that supervises it: submitted through
Ray's Jobs API (HTTP to the dashboard at MATHRL_RAY__ADDRESS; no Kubernetes RBAC needed), watched,
stopped. The worker itself needs no GPUs.

`RayJob` is a `JobHandle` (worker.job_handle) as a local process is, so heartbeat, cancel, drain and
the end's bookkeeping are the same code for both (worker.watch). A submission's id is `mathrl-<job
id>-<attempt>` (`submission_id`), and earlier attempts' Ray jobs are stopped first. Ray's status,
the log, where the ranks and the vLLM server run become the job's events; a cluster that does not
answer fails the job, never leaving it `running`. docs/how-jobs-run.md, "Past one node: Ray"."""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from config.settings import Settings
from kinds import home
from mathrl.specs import AnySpec
from runtime.errors import RayUnavailable as RayUnavailable  # raised here; its callers import it from here
from worker.attempt import AttemptDir
from worker.child import EXIT_DRAINED, EXIT_ERROR, EXIT_OK, EXIT_STOPPED
from worker.ray_train import WORKERS_LINE
from worker.ray_vllm import SERVER_LINE
from worker.vllm_server import needs_server

log = logging.getLogger("mathrl.worker")

SECRET_ENV = ("MATHRL_DATABASE__URL", "MATHRL_BROKER__URL", "MATHRL_AUTH__")  # never in the Ray job's record
FORWARD_ENV = ("HF_HUB_OFFLINE", "HF_HOME", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "MATHRL_VLLM_")
STATUS_POLL_SECONDS = 1.0
LOG_LINES_PER_EVENT = 40
AGENT_WAIT_SECONDS = 60.0  # how long a submission waits for the head's job agent to come up

Event = Callable[..., None]  # (kind, message, data=None, level="info")


def submission_id(job_id: str, attempt: int) -> str:
    return f"mathrl-{job_id}-{attempt}"


def forwarded_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The worker's settings for the job's processes on Ray, minus the secrets (the Ray pods have
    those in their own environment)."""
    environ = dict(os.environ if environ is None else environ)
    keep = {k: v for k, v in environ.items() if k.startswith("MATHRL_") or k.startswith(FORWARD_ENV)}
    return {k: v for k, v in keep.items() if not k.startswith(SECRET_ENV)}


def ray_workers(spec: AnySpec) -> int:
    """Ray Train workers of a training job (processes per node x nodes, less a GRPO job's vLLM
    server GPUs in server mode); 1 for other kinds."""
    return home(spec).needs(spec).world


def entrypoint(settings: Settings, spec: AnySpec, job_id: str, owner: str, attempt: int) -> tuple[str, int, int]:
    """The Ray job's command line, and how many GPUs and CPUs its driver itself takes: training jobs
    run as Ray Train workers (processes per node x nodes) under worker.ray_train, whose driver takes
    none; other kinds (an eval in a Ray pool) run the plain job process as the driver, on the GPUs
    the job asked for."""
    python = settings.ray.python
    if home(spec).needs(spec).training:
        per_worker = 1 if spec.resources.gpus else 0
        args = ["-m", "worker.ray_train", job_id, owner, str(attempt), str(ray_workers(spec)), str(per_worker)]
        if needs_server(spec):  # GRPO in vLLM server mode: the driver starts the server (worker.ray_vllm)
            args.append("--vllm-server")
        return shlex.join([python, *args]), 0, 0
    return shlex.join([python, "-m", "worker.child", job_id, owner, str(attempt)]), spec.resources.gpus, 1


class RayJob:
    """One attempt of a job as a Ray job. `start()` submits; then `wait(timeout)` and `stop(grace)`
    behave like subprocess.Popen's (wait raises subprocess.TimeoutExpired while it runs)."""

    def __init__(
        self,
        settings: Settings,
        spec: AnySpec,
        job_id: str,
        owner: str,
        attempt: int,
        out: Path,
        log_path: Path,
        event: Event,
    ) -> None:
        self.settings, self.spec = settings, spec
        self.job_id, self.owner, self.attempt = job_id, owner, attempt
        self.out, self.log_path, self.event = out, log_path, event
        self.address = settings.ray.address or ""
        self.id = submission_id(job_id, attempt)
        self.nodes = spec.resources.nodes
        self.workers_asked = ray_workers(spec)
        self.client: Any = None
        self.code: int | None = None
        self.status: str | None = None
        self.workers: dict[str, Any] = {}
        self._log_offset = 0
        self._last_poll = 0.0
        self._unreachable_since: float | None = None
        self._stopping = False

    # ---- start ------------------------------------------------------------------------------

    def _connect(self) -> Any:
        from ray.job_submission import JobSubmissionClient

        try:
            return JobSubmissionClient(self.address)
        except Exception as exc:
            log.warning("Ray cluster at %s does not answer: %s", self.address, exc)
            raise RayUnavailable(
                f"the workers' Ray cluster (MATHRL_RAY__ADDRESS) does not answer "
                f"({type(exc).__name__}: {self._unaddressed(exc, 300)}): check the setting and that the cluster's "
                "head is up"
            ) from None

    def start(self) -> None:
        """Stop earlier attempts, submit this one (the supervisor keeps the lease alive meanwhile)."""
        self.client = self._connect()
        self._stop_earlier_attempts()
        command, gpus, cpus = entrypoint(self.settings, self.spec, self.job_id, self.owner, self.attempt)
        deadline = time.monotonic() + AGENT_WAIT_SECONDS
        while True:
            try:
                self.client.submit_job(
                    entrypoint=command,
                    submission_id=self.id,
                    runtime_env={"env_vars": forwarded_env()},
                    metadata={"mathrl_job": self.job_id, "attempt": str(self.attempt)},
                    entrypoint_num_gpus=gpus,
                    entrypoint_num_cpus=cpus,
                )
                break
            except Exception as exc:
                # a head that just started has no job agent yet ("try again later")
                if "try again later" in str(exc) and time.monotonic() < deadline:
                    time.sleep(2.0)
                    continue
                raise RayUnavailable(
                    f"the workers' Ray cluster (MATHRL_RAY__ADDRESS) refused the job "
                    f"({type(exc).__name__}: {self._unaddressed(exc, 500)})"
                ) from None
        with open(self.log_path, "a") as f:
            f.write(f"mathrl: submitted Ray job {self.id} to {self.address}: {command}\n")
        # no address or command line in the event: a tenant reads it, and the cluster's address is the operator's
        self.event("ray_submitted", f"submitted to the Ray cluster as Ray job {self.id}", {"submission_id": self.id})

    def _unaddressed(self, exc: Exception, limit: int) -> str:
        """An error's text for the job's error (a tenant reads it), without the cluster's address."""
        text = str(exc)
        return (text.replace(self.address, "<MATHRL_RAY__ADDRESS>") if self.address else text)[:limit]

    def _stop_earlier_attempts(self) -> None:
        """A retry never runs beside the attempt it replaces: stop the earlier attempts' Ray jobs
        (a no-op for ones that ended or never started) and wait until they have ended. One that
        ended by itself (its next write after the new claim is fenced: LeaseLost) is recorded too."""
        for earlier in range(1, self.attempt):
            sid = submission_id(self.job_id, earlier)
            try:
                status = self.client.get_job_status(sid)
                running = not status.is_terminal()
                if running:
                    self.client.stop_job(sid)
            except RuntimeError:  # no such Ray job (that attempt never reached Ray)
                continue
            deadline = time.monotonic() + 60
            while running and not status.is_terminal() and time.monotonic() < deadline:
                time.sleep(0.5)
                status = self.client.get_job_status(sid)
            what = "stopped" if running else "found already ended"
            self.event(
                "ray_stopped_earlier",
                f"{what} Ray job {sid} of attempt {earlier} before this attempt ({status.value})",
                {"submission_id": sid, "status": status.value, "stopped": running},
            )

    # ---- watching ---------------------------------------------------------------------------

    def poll(self) -> int | None:
        """Read Ray's status and the log's new lines (at most every STATUS_POLL_SECONDS); the exit
        code once the Ray job ended, else None."""
        if self.code is not None:
            return self.code
        if time.monotonic() - self._last_poll < STATUS_POLL_SECONDS:
            return None
        self._last_poll = time.monotonic()
        try:
            info = self.client.get_job_info(self.id)
            logs = self.client.get_job_logs(self.id)
        except Exception as exc:
            return self._unreachable(exc)
        self._unreachable_since = None
        self._read_log(logs)
        status = str(info.status.value if hasattr(info.status, "value") else info.status)
        if status != self.status:
            self.status = status
            self.event(
                "ray_status",
                f"Ray job {self.id}: {status}" + (f" ({info.message})" if info.message else ""),
                {"status": status},
            )
        if info.status.is_terminal():  # (the log was read after the status: it is whole)
            self.code = self._exit_code(status, info)
        return self.code

    def _exit_code(self, status: str, info: Any) -> int:
        if status == "SUCCEEDED":
            return EXIT_OK
        if status == "STOPPED" and not self._stopping:
            self._error(f"the Ray job {self.id} was stopped outside mathrl (ray job stop, or the cluster)")
            return EXIT_ERROR
        if status == "STOPPED":
            return EXIT_STOPPED
        code = info.driver_exit_code  # worker.ray_train's (rank 0's) code
        if code is None or code == EXIT_OK:
            self._error(f"the Ray job {self.id} failed: {info.message or 'no reason given'}")
            return EXIT_ERROR
        if code not in (EXIT_STOPPED, EXIT_DRAINED) and AttemptDir(self.out).read_error() is None:
            # no rank wrote an error: the driver itself failed (an import, the Ray connection)
            self._error(f"the Ray job {self.id} failed (exit {code}): {info.message or 'see job.log'}")
        return int(code)

    def _unreachable(self, exc: Exception) -> int | None:
        now = time.monotonic()
        text = str(exc)
        if "does not exist" in text:  # the head forgot it (restarted without its job table)
            self._error(
                f"the Ray job {self.id} is gone from the workers' Ray cluster (its head restarted?): the attempt "
                "is lost"
            )
            self.code = EXIT_ERROR
            return self.code
        if self._unreachable_since is None:
            self._unreachable_since = now
            log.warning("Ray cluster at %s not answering for job %s (%s)", self.address, self.job_id, text[:200])
        limit = self.settings.ray.lost_after_seconds
        if now - self._unreachable_since >= limit:
            self._error(
                f"the workers' Ray cluster (MATHRL_RAY__ADDRESS) has not answered for {limit:g} s "
                f"(ray.lost_after_seconds; last error {type(exc).__name__}: {self._unaddressed(exc, 200)}): the "
                f"job's Ray job {self.id} is lost"
            )
            self.code = EXIT_ERROR
        return self.code

    def _error(self, message: str) -> None:
        AttemptDir(self.out).write_error(message)

    def _read_log(self, logs: str) -> None:
        if len(logs) < self._log_offset:  # a different log (should not happen): start over
            self._log_offset = 0
        new = logs[self._log_offset :]
        cut = new.rfind("\n") + 1  # whole lines only; the rest comes with the next read
        if cut == 0:
            return
        self._log_offset += cut
        chunk = new[:cut]
        with open(self.log_path, "a") as f:
            f.write(chunk)
        lines = []
        for line in chunk.splitlines():
            if line.startswith(WORKERS_LINE):
                self.workers = json.loads(line[len(WORKERS_LINE) :])
                nodes = len({w["node_id"] for w in self.workers.values()})
                self.event(
                    "ray_workers",
                    f"{len(self.workers)} Ray Train workers on {nodes} node(s)",
                    {"workers": self.workers, "nodes": nodes},
                )
            elif line.startswith(SERVER_LINE):
                server = json.loads(line[len(SERVER_LINE) :])
                # the node's address and host name stay the operator's (the worker's log has them)
                log.info("job %s: vLLM server at %s on %s", self.job_id, server.get("url"), server.get("host"))
                public = {k: v for k, v in server.items() if k not in ("url", "host")}
                self.event(
                    "vllm_server",
                    f"started a vLLM server for this job on Ray node {server.get('node_id', '?')} "
                    f"(process {server['pid']}; placed and launched {server['placed_seconds']:.0f} s after the "
                    "driver asked)",
                    public,
                )
            elif line.strip():
                lines.append(line)
        if lines:
            shown = lines[-LOG_LINES_PER_EVENT:]
            skipped = len(lines) - len(shown)
            self.event(
                "ray_log",
                ("\n".join(shown) if not skipped else f"({skipped} earlier lines in job.log)\n" + "\n".join(shown))[
                    -8000:
                ],
                {"lines": len(lines)},
            )

    def launched(self) -> tuple[str, dict[str, Any]] | None:
        n = self.workers_asked
        what = (
            f"launched {n} processes (Ray Train workers on {self.nodes} nodes)"
            if n > 1
            else "launched 1 process (on Ray)"
        )
        return what, {"processes": n, "nodes": self.nodes, "submission_id": self.id}

    def end(self) -> None:
        """Nothing is left: the Ray job's driver and its Train workers ended with it."""

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.id, timeout or 0)
            time.sleep(min(0.2, STATUS_POLL_SECONDS))

    # ---- stopping ---------------------------------------------------------------------------

    def stop(self, grace: float) -> int:
        """Give the ranks `grace` seconds to stop by themselves, then stop the Ray job (Ray sends its
        driver SIGTERM, then SIGKILL; the Train workers go with the driver) and wait until it ended."""
        self._stopping = True
        if self.code is not None:
            return self.code
        try:  # first the ranks' own stop: they see a cancel (or a lost lease) in the database between steps
            return self.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        try:
            self.client.stop_job(self.id)
        except Exception as exc:
            log.warning("stopping Ray job %s failed (%s)", self.id, exc)
        try:
            return self.wait(grace + 30)
        except subprocess.TimeoutExpired:
            self._error(f"the Ray job {self.id} did not stop within {grace + 30:g} s of the stop request")
            self.code = EXIT_ERROR
            return self.code
