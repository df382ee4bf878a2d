"""Waiting for a condition; a job's process and whether it still lives."""

from __future__ import annotations

import os
import time
from typing import Any


def wait_for(predicate: Any, timeout: float = 60.0, interval: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def child_pid(client: Any, job_id: str) -> int:
    def started() -> int | None:
        for ev in client.jobs.events(job_id):
            if ev.type == "started":
                return int(ev.data["pid"])
        return None

    return int(wait_for(started, 90, what="the job process to start"))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
