"""Grading work on untrusted input, within hard limits: `run_bounded(fn, items, ...)` runs `fn(*item)`
for each item, one after another, in a short-lived child process forked from a warm zygote
(evaluator/_zygote.py), and kills it at the limits:

- per item (`item_seconds`): the item gets TIMED_OUT and a fresh process goes on from the next;
- per call (`deadline_seconds`, wall; `cpu_seconds`, RLIMIT_CPU, carried over to a replacement): the
  items left get 'deadline' or 'cpu';
- memory (`memory_mb`, RLIMIT_AS): a MemoryError is that item's error.

Each call has its own processes. `BoundedMatch` is GRPO's answer check (trainer/rewards.py). Why a
kill is the only bound: docs/using.md, "Graders"."""

from __future__ import annotations

import logging
import math
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)
PID = struct.Struct("!q")  # the zygote's answer: the pid of the child it forked
TIMED_OUT = "timed out"  # an item killed at item_seconds
DEADLINE, CPU = "deadline", "cpu"  # the call's limits (Batch.stopped)


@dataclass
class Outcome:
    value: Any = None
    error: str | None = None  # None: `value` is fn's result; TIMED_OUT, DEADLINE, CPU or what went wrong


@dataclass
class Batch:
    outcomes: list[Outcome]  # one per item, in order
    stopped: str | None = None  # DEADLINE or CPU when the call was stopped at its limit
    timed_out: int = 0  # items killed at item_seconds
    processes: int = 0  # child processes it took (1 + one per kill or crash)


class _Zygote:
    """This process's zygote: started on first use, again if it died or this process was forked."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.control: socket.socket | None = None
        self.owner = 0

    def _ensure(self) -> socket.socket:
        mine = self.owner == os.getpid()  # not a copy inherited through a fork
        if mine and self.control is not None and self.proc is not None and self.proc.poll() is None:
            return self.control
        if mine and self.control is not None:
            self.control.close()  # the zygote died: this ends it for good
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "evaluator._zygote", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.control, self.owner = ours, os.getpid()
        return ours

    def fork(self) -> tuple[int, socket.socket]:
        """A fresh child: its pid and the socket to talk to it on."""
        with self.lock:
            for attempt in (1, 2):
                control = self._ensure()
                ours, theirs = socket.socketpair()
                try:
                    socket.send_fds(control, [b"f"], [theirs.fileno()])
                    pid = _read_pid(control)
                    return pid, ours
                except OSError:
                    ours.close()
                    if attempt == 2:
                        raise
                    if self.proc is not None:
                        self.proc.kill()  # gone or stuck: the next _ensure starts another
                        self.proc.wait()
                finally:
                    theirs.close()
        raise AssertionError("unreachable")


def _read_pid(control: socket.socket) -> int:
    data = b""
    while len(data) < PID.size:
        chunk = control.recv(PID.size - len(data))
        if not chunk:
            raise ConnectionError("the grading zygote went away")
        data += chunk
    return int(PID.unpack(data)[0])


_zygote = _Zygote()


def warm() -> None:
    """Start the zygote now (it imports and warms math-verify meanwhile), not on the first call."""
    with _zygote.lock:
        _zygote._ensure()


def _kill(pid: int) -> None:
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_bounded(
    fn: Callable[..., Any],
    items: Sequence[tuple[Any, ...]],
    *,
    item_seconds: float,
    deadline_seconds: float | None = None,
    cpu_seconds: float | None = None,
    memory_mb: int | None = None,
) -> Batch:
    """`fn(*item)` for each item in child processes within the limits (see the module's text).
    `fn` must be a module-level function, its arguments and result plain data."""
    n = len(items)
    out: list[Outcome | None] = [None] * n
    end = time.monotonic() + deadline_seconds if deadline_seconds is not None else math.inf
    batch = Batch([])
    spent = 0.0  # CPU seconds of the processes so far (a killed one: counted as its wall time since its last result)
    i = 0
    while i < n and batch.stopped is None:
        left = None if cpu_seconds is None else cpu_seconds - spent
        if left is not None and left <= 0:
            batch.stopped = CPU
            break
        if time.monotonic() >= end:
            batch.stopped = DEADLINE
            break
        pid, sock = _zygote.fork()
        forked = time.monotonic()
        conn = Connection(sock.detach())
        batch.processes += 1
        used, last, alive = 0.0, time.monotonic(), True
        try:
            try:
                conn.send((fn, list(items[i:]), i, left, memory_mb))
            except OSError:  # it died before it read its work
                alive = False
                out[i] = Outcome(error="the grading process died")
                i += 1
                continue
            while i < n:
                wait = min(last + item_seconds, end) - time.monotonic()
                if wait > 0 and conn.poll(wait):
                    try:
                        j, value, error, used = conn.recv()
                    except (EOFError, OSError):  # the process died inside item i
                        alive = False
                        used += time.monotonic() - last
                        # RLIMIT_CPU (SIGXCPU, or SIGKILL a second later) once its CPU time reached the
                        # limit, which its wall time since the fork bounds from above: on a busy machine
                        # this process can read a result late, so `used` alone can fall short of it
                        if left is not None and (used >= left or time.monotonic() - forked >= max(1, math.ceil(left))):
                            used = max(used, left)
                            batch.stopped = CPU
                        else:
                            out[i] = Outcome(error="the grading process died")
                            i += 1
                        break
                    out[j] = Outcome(value, error)
                    i, last = j + 1, time.monotonic()
                    continue
                used += time.monotonic() - last  # no result in time: killed below
                if time.monotonic() >= end:
                    batch.stopped = DEADLINE
                else:
                    out[i] = Outcome(error=TIMED_OUT)
                    batch.timed_out += 1
                    i += 1
                break
        finally:
            if alive and i < n:
                _kill(pid)  # its work is not done: it is stuck, or the call is over
            conn.close()
            spent += used
    batch.outcomes = [o if o is not None else Outcome(error=batch.stopped or TIMED_OUT) for o in out]
    return batch


class BoundedMatch:
    """An evaluator.graders Matcher that compares (answer, gold) pairs in a child process,
    `item_seconds` at most each and `call_seconds` for all: a pair past either is not equal, with
    a note, and counted in `timed_out` (GRPO: trainer/rewards.py)."""

    def __init__(self, item_seconds: float = 5.0, call_seconds: float | None = 120.0) -> None:
        self.item_seconds, self.call_seconds = item_seconds, call_seconds
        self.timed_out = 0

    def __call__(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[bool, str | None]]:
        from evaluator.grading import check_answers

        if not pairs:
            return []
        batch = run_bounded(
            check_answers,
            list(pairs),
            item_seconds=self.item_seconds,
            deadline_seconds=self.call_seconds,
            cpu_seconds=self.call_seconds,  # a process orphaned by a killed trainer dies too
        )
        if batch.timed_out or batch.stopped:
            missed = sum(o.error is not None for o in batch.outcomes)
            log.warning("%d of %d answers not checked in time (scored as wrong)", missed, len(pairs))
        out: list[tuple[bool, str | None]] = []
        for o in batch.outcomes:
            if o.error is None:
                correct, note = o.value
                out.append((bool(correct), note))
                continue
            self.timed_out += 1
            if o.error == TIMED_OUT:
                out.append((False, f"not scored: checking it took over {self.item_seconds:g} s"))
            elif o.error == DEADLINE:
                out.append((False, f"not scored: the call's checks took over {self.call_seconds:g} s"))
            else:
                out.append((False, f"not scored: {o.error}"))
        return out
