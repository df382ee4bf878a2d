"""A running attempt as the supervisor's watch loop sees it (`JobHandle`): a local process group
(`LocalJob`, started here) or a Ray job (worker.ray_submit.RayJob). Both wait, stop and say how
they were launched; the heartbeat, cancel, drain and end's bookkeeping are then one loop
(worker.watch)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Protocol

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


def kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the job's process group and the groups below it (each rank of a multi-process
    job leads its own)."""
    for group in job_groups(proc.pid):
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
        kill_group(self.proc, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            kill_group(self.proc, signal.SIGKILL)
            return self.proc.wait()

    def launched(self) -> tuple[str, dict[str, Any]] | None:
        if self.cmd[1:3] == ["-m", "worker.child"]:
            return None  # one process: its 'started' event says so
        processes = int(self.cmd[self.cmd.index("--num_processes") + 1])
        return f"launched {describe(self.cmd)}", {"processes": processes, "command": self.cmd[1:]}

    def end(self) -> None:
        kill_group(self.proc, signal.SIGKILL)  # whatever the job started (engine processes) goes with it
