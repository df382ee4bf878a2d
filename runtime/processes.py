"""Process plumbing every layer uses (standard library only): a child that dies with its parent,
a free TCP port, and this process's place in a data-parallel job (the launcher's RANK and
WORLD_SIZE)."""

from __future__ import annotations

import os
import signal
import socket


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """(Linux) Have the kernel send this process `sig` when its parent dies, however the parent
    dies (PR_SET_PDEATHSIG): a job process when its worker dies, a rank when its launcher dies,
    an embedded API or worker when the demo that started it is killed. A Popen `preexec_fn`,
    or called first thing in a forked child."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def die_with_parent_gently() -> None:
    """die_with_parent with SIGTERM, so the child can clean up (its own children, its files)."""
    die_with_parent(signal.SIGTERM)


def free_port(host: str = "127.0.0.1", preferred: int = 0) -> int:
    """A port free on `host` now: `preferred` if it is, else one the kernel picks."""
    for port in dict.fromkeys((preferred, 0)):
        with socket.socket() as s:
            try:
                s.bind((host, port))
                return int(s.getsockname()[1])
            except OSError:
                continue
    raise RuntimeError(f"no free port on {host}")


def rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    return rank() == 0
