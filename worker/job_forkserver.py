"""The process a worker forks its single-process jobs from: `python -m worker.job_forkserver FD`
(worker.job_handle.ForkedJob is the supervisor's side).

It imports torch, transformers and TRL once (PRELOAD; a CUDA build leaves CUDA_UNSAFE out) and forks
a child per job, which is what `python -m worker.child` would be. A request on the control socket
(FD, SOCK_SEQPACKET) carries the job's argv, environment, directory and log, and one end of a socket
pair, on which `serve` answers the child's pid, then its exit status (negative: killed by that
signal). It exits when the worker closes the control socket; its children die with it
(PR_SET_PDEATHSIG). What it saves, and what it must not touch: docs/how-jobs-run.md."""

from __future__ import annotations

import importlib
import io
import json
import os
import select
import signal
import socket
import sys
from typing import Any

from runtime.processes import die_with_parent

# imported once here; what a CUDA build leaves out is `CUDA_UNSAFE` (see above)
PRELOAD = (
    "torch",
    "transformers",
    "datasets",
    "accelerate",
    "peft",
    "trl",
    "trl.trainer.sft_trainer",
    "worker.child",
    "kinds",
    "evaluator.run",
    "trainer.sft",
)
CUDA_UNSAFE = ("vllm", "trl.trainer.grpo_trainer", "trainer.grpo")


def preload() -> list[str]:
    """Import what the jobs will; the modules that failed to import (a worker without extras) are
    left to the job, which reports them as it would have."""
    import torch

    names = list(PRELOAD) + ([] if torch.version.cuda else list(CUDA_UNSAFE))
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            failed.append(name)
    return failed


def _child(req: dict[str, Any], server_sockets: list[socket.socket]) -> None:
    """In the forked child: become the job's process and run worker.child's main; never returns."""
    code = 1
    try:
        os.setsid()
        die_with_parent()  # with this server, which dies with the worker
        for s in server_sockets:  # the control socket and the other jobs' sockets are not its own
            s.close()
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        # unbuffered, as PYTHONUNBUFFERED=1 makes a fresh job process
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        sys.argv = list(req["argv"])
        _fresh_seeds()
        from worker import child

        code = child.main(sys.argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _fresh_seeds() -> None:
    """Python's `random` is reseeded by the fork itself; NumPy's global generator is not."""
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _send(conn: socket.socket, message: dict[str, Any]) -> bool:
    try:
        conn.send(json.dumps(message).encode())
        return True
    except OSError:
        return False  # the supervisor went away


def serve(ctl: socket.socket) -> None:
    failed = preload()
    _send(ctl, {"ready": True, "pid": os.getpid(), "not_preloaded": failed})
    children: dict[int, socket.socket] = {}
    while True:
        while children:  # reap: each child's status to its supervisor
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                _send(conn, {"exit": code})
                conn.close()
        ready, _, _ = select.select([ctl], [], [], 0.1)
        if not ready:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 1 << 20, 1)
        except OSError:
            return
        if not msg:
            return  # the worker closed the control socket: it has gone
        conn = socket.socket(fileno=fds[0])
        req = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            _child(req, [ctl, conn, *children.values()])
        if not _send(conn, {"pid": pid}):  # its supervisor gave up waiting and started the job itself
            os.kill(pid, signal.SIGKILL)
        children[pid] = conn


def main() -> None:
    die_with_parent()
    ctl = socket.socket(fileno=int(sys.argv[1]))
    serve(ctl)


if __name__ == "__main__":
    main()
