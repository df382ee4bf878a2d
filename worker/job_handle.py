"""A running attempt as the supervisor's watch loop sees it (`JobHandle`): a local process group
(`LocalJob`, a fresh interpreter started here), a process forked from the worker's fork server
(`ForkedJob`: worker.job_forkserver, torch and TRL already imported) or a Ray job
(worker.ray_submit.RayJob). Each waits, stops and says how it was launched; the heartbeat, cancel,
drain and end's bookkeeping are then one loop (worker.watch). `start_job` picks local or forked."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Protocol

from config.settings import Settings
from runtime.cpu_threads import job_thread_env
from worker.launch import describe, die_with_parent, job_groups

log = logging.getLogger("mathrl.worker")


class JobHandle(Protocol):
    def wait(self, timeout: float | None = None) -> int:
        """The exit code, once the attempt ended; subprocess.TimeoutExpired after `timeout` seconds."""

    def stop(self, grace: float) -> int:
        """Ask the attempt to stop, force it after `grace` seconds; its exit code."""

    def launched(self) -> tuple[str, dict[str, Any]] | None:
        """The 'launched' event's message and data, if the attempt has one to record."""

    def end(self) -> None:
        """After the attempt ended: what it left running goes too."""


def prepare_child() -> None:
    """Runs in the job process before exec. Unblock every signal (the worker's pool thread may
    have some blocked, and a child inherits the mask: vLLM's engine hung on it), and (Linux)
    SIGKILL the job if the supervising worker dies, so a killed worker never leaves an orphan
    writing to the job while another worker takes it over."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    die_with_parent()


def kill_group(pid: int, sig: int) -> None:
    """Signal the job's process group and the groups below it (each rank of a multi-process
    job leads its own)."""
    for group in job_groups(pid):
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            pass


class LocalJob:
    """The attempt's process group on this worker: `cmd` started in a session of its own (a cancel
    reaches its children too), its output into `log_path`."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path):
        self.cmd = cmd
        with open(log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=prepare_child,
            )
        self.pid = self.proc.pid

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self, grace: float) -> int:
        """SIGTERM the job's process groups, then SIGKILL after `grace` seconds."""
        kill_group(self.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            kill_group(self.pid, signal.SIGKILL)
            return self.proc.wait()

    def launched(self) -> tuple[str, dict[str, Any]] | None:
        if self.cmd[1:3] == ["-m", "worker.child"] or "--num_processes" not in self.cmd:
            return None  # one process: its 'started' event says so
        processes = int(self.cmd[self.cmd.index("--num_processes") + 1])
        return f"launched {describe(self.cmd)}", {"processes": processes, "command": self.cmd[1:]}

    def end(self) -> None:
        kill_group(self.pid, signal.SIGKILL)  # whatever the job started (engine processes) goes with it


SERVER_START_SECONDS = 300.0  # importing torch, transformers, TRL and vLLM on a busy CPU


class ForkServer:
    """This worker's fork server (worker.job_forkserver). `ready` never waits for it: it answers the
    server once it has started (in the background: its imports take seconds, longer than a job's
    lease may go unrenewed), and until then jobs start as fresh interpreters. The process is
    started from a thread of its own that lives as long as the worker (PR_SET_PDEATHSIG follows
    the thread that started a process, and a pool thread may end). A server that died is started
    again; one that failed to start is tried again after RETRY_SECONDS."""

    RETRY_SECONDS = 300.0
    _lock = threading.Lock()
    _current: ForkServer | None = None
    _starting = False
    _failed_at = -RETRY_SECONDS

    def __init__(self, env: dict[str, str], log_path: Path):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        started = threading.Event()
        out: dict[str, Any] = {}

        def spawn() -> None:
            try:
                with open(log_path, "ab") as logf:
                    out["proc"] = subprocess.Popen(
                        [sys.executable, "-m", "worker.job_forkserver", str(theirs.fileno())],
                        pass_fds=[theirs.fileno()],
                        stdout=logf,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=env,
                        start_new_session=True,
                        preexec_fn=prepare_child,
                    )
            except Exception as exc:
                out["error"] = exc
            started.set()
            threading.Event().wait()  # parked: the server dies with this thread, so with the worker

        threading.Thread(target=spawn, name="mathrl-job-forkserver", daemon=True).start()
        started.wait()
        theirs.close()
        if "error" in out:
            raise out["error"]
        self.proc: subprocess.Popen[bytes] = out["proc"]
        self.ctl = ours
        self.ctl.settimeout(SERVER_START_SECONDS)
        hello = json.loads(self.ctl.recv(1 << 16) or b"{}")
        self.ctl.settimeout(None)
        if not hello.get("ready"):
            self.proc.kill()
            raise RuntimeError(f"the job fork server did not start (see {log_path})")
        log.info("job fork server %d ready (not preloaded: %s)", self.proc.pid, hello.get("not_preloaded"))

    def alive(self) -> bool:
        return self.proc.poll() is None

    @classmethod
    def ready(cls, env: dict[str, str], log_path: Path) -> ForkServer | None:
        """The running server, or None (and its start begun, unless it is under way or failed lately)."""
        import time

        with cls._lock:
            if cls._current is not None and cls._current.alive():
                return cls._current
            if not cls._starting and time.monotonic() - cls._failed_at > cls.RETRY_SECONDS:
                cls._starting = True
                threading.Thread(
                    target=cls._start, args=(env, log_path), name="mathrl-forkserver-start", daemon=True
                ).start()
            return None

    @classmethod
    def _start(cls, env: dict[str, str], log_path: Path) -> None:
        import time

        server = None
        try:
            server = ForkServer(env, log_path)
        except Exception as exc:
            log.warning(
                "the job fork server did not start (%s: %s); jobs start as fresh processes", type(exc).__name__, exc
            )
        with cls._lock:
            cls._current, cls._starting = server, False
            if server is None:
                cls._failed_at = time.monotonic()

    def fork(self, request: dict[str, Any], conn: socket.socket) -> None:
        with self._lock:
            socket.send_fds(self.ctl, [json.dumps(request).encode()], [conn.fileno()])


class ForkedJob:
    """A single-process job forked from the fork server: `python -m worker.child ...` without the
    interpreter start and the imports. Its exit status comes from the server, which reaps it."""

    def __init__(self, server: ForkServer, cmd: list[str], env: dict[str, str], log_path: Path):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = {"argv": ["worker.child", *cmd[3:]], "env": env, "cwd": os.getcwd(), "log": str(log_path)}
        try:
            server.fork(request, theirs)
        finally:
            theirs.close()
        self.conn, self.cmd = ours, cmd
        self.code: int | None = None
        self.conn.settimeout(60)
        try:
            reply = self.conn.recv(1 << 16)
        except TimeoutError:
            self.conn.close()  # the server kills a child whose pid it cannot send
            raise
        if not reply:
            raise RuntimeError("the job fork server went away before it forked the job")
        self.pid = int(json.loads(reply)["pid"])

    def wait(self, timeout: float | None = None) -> int:
        if self.code is not None:
            return self.code
        self.conn.settimeout(timeout)
        try:
            reply = self.conn.recv(1 << 16)
        except TimeoutError:
            raise subprocess.TimeoutExpired(self.cmd, timeout or 0) from None
        # no reply: the server died, and the job with it (PR_SET_PDEATHSIG)
        self.code = int(json.loads(reply)["exit"]) if reply else -signal.SIGKILL
        self.conn.close()
        return self.code

    def stop(self, grace: float) -> int:
        kill_group(self.pid, signal.SIGTERM)
        try:
            return self.wait(grace)
        except subprocess.TimeoutExpired:
            kill_group(self.pid, signal.SIGKILL)
            return self.wait()

    def launched(self) -> tuple[str, dict[str, Any]] | None:
        return None  # one process: its 'started' event says so

    def end(self) -> None:
        kill_group(self.pid, signal.SIGKILL)


def torch_is_cpu_build() -> bool:
    """Whether the installed torch is a CPU build, read from its version file without importing it."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return False
    return re.search(r"^cuda\b.*= None\s*$", text, re.M) is not None


def fork_server(settings: Settings) -> ForkServer | None:
    """This worker's fork server if worker.fork_jobs says so and it has started (else its start begun)."""
    mode = settings.worker.fork_jobs
    if mode == "false" or (mode == "auto" and not torch_is_cpu_build()):
        return None
    logs = Path(settings.artifact_dir) / "workers"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # its OpenMP pool is made once, at its imports: the jobs' thread count and wait policy from the start
    env.update(job_thread_env(env, settings.worker.job_slots, settings.worker.job_threads))
    return ForkServer.ready(env, logs / f"{socket.gethostname()}-{os.getpid()}-forkserver.log")


def start_job(settings: Settings, cmd: list[str], env: dict[str, str], log_path: Path) -> LocalJob | ForkedJob:
    """The attempt's process: forked from the fork server when worker.fork_jobs is on, the server
    has started and the job is one process (`python -m worker.child`); else a fresh interpreter
    (also when forking fails: the worker logs why)."""
    if cmd[1:3] == ["-m", "worker.child"]:
        server = fork_server(settings)
        if server is not None:
            try:
                return ForkedJob(server, cmd, env, log_path)
            except Exception as exc:
                log.warning("forking the job failed (%s: %s); starting a fresh process", type(exc).__name__, exc)
    return LocalJob(cmd, env, log_path)
