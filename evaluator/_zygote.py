"""The process evaluator/bounded.py forks its grading processes from: `python -m evaluator._zygote FD`,
started once per process that grades (an API process, a trainer), with math-verify, sympy and the
graders imported and warmed up, so that a child starts in milliseconds.

It is single-threaded and holds nothing of its parent. On its control socket (FD) each request
carries one end of a socket pair; `serve` forks a child that reads its work from that socket and
writes the results to it, and answers with the child's pid, which the parent kills at its limits. It
exits when its parent closes the control socket, and its children die with it (PR_SET_PDEATHSIG).
Why a zygote: docs/using.md, "Graders"."""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from evaluator import graders, grading
from evaluator.bounded import PID
from runtime.processes import die_with_parent


def _child(data: socket.socket) -> None:
    """In the forked child: the work from `data`, (index, value, error, CPU seconds) per item back."""
    import resource

    conn = Connection(data.detach())
    fn, items, first, cpu, mb = conn.recv()
    if cpu is not None:
        soft = max(1, math.ceil(cpu))
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))  # SIGXCPU, then SIGKILL a second later
    if mb is not None:
        resource.setrlimit(resource.RLIMIT_AS, (mb << 20, mb << 20))
    for k, args in enumerate(items):
        try:
            value: Any = fn(*args)
            error = None
        except Exception as exc:  # MemoryError included: that item's error, the next goes on
            value, error = None, f"{type(exc).__name__}: {exc}"[:300]
        conn.send((first + k, value, error, time.process_time()))
    conn.close()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def serve(control: socket.socket) -> None:
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(control, 1, 1)
        except (ConnectionError, OSError):
            return
        if not msg or not fds:
            return  # the parent has gone
        _reap()
        pid = os.fork()
        if pid == 0:
            try:
                control.close()
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                die_with_parent()
                _child(socket.socket(fileno=fds[0]))
            finally:
                os._exit(0)
        os.close(fds[0])
        control.sendall(PID.pack(pid))


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's Ctrl-C is the parent's; EOF ends this
    grading.without_alarms()  # its children are killed at their limits: no signal.alarm inside
    grading.check_answers("\\frac{1}{2}", "0.5")  # warm: sympy's caches, the LaTeX parser
    graders.grade_item('{"type": "math"}', "so \\boxed{2^{10}}", "1024", "")
    graders.grade_item('{"type": "regex", "pattern": "#### (\\\\d+)"}', "#### 7", None, "")  # RE2 loaded
    serve(control)


if __name__ == "__main__":
    main()
