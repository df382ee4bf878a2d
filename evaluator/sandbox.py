"""The python grader's sandbox: the user's `grade(sample, item)` runs in a separate interpreter
(evaluator/sandbox_harness.py), one process per batch of cases, never in the caller's process.

What holds on every machine:
- a separate process in its own session, killed with its group at `wall_seconds`;
- resource limits set before the user's code runs: CPU seconds (RLIMIT_CPU), address space
  (RLIMIT_AS), the size of any file it writes (RLIMIT_FSIZE), open files (RLIMIT_NOFILE),
  threads and processes (RLIMIT_NPROC), no core dumps;
- started as root (a container's default), it drops to the user `nobody` (uid 65534) first,
  where nobody can read the Python installation (not one under /root: `Isolation.user` says);
- an audit hook (PEP 578) installed before the user's code: no sockets, subprocesses, fork,
  exec, threads, signals to other processes or ctypes; files opened for writing only in its own
  temporary directory; files read only there and in the Python installation (to import the
  standard library and the installed packages);
- `python -I -B`: no environment variables of the caller, no user site, no bytecode written.

Where the machine has them, a kernel boundary besides (`Isolation.kernel`):
- bubblewrap (`bwrap`, Debian's package bubblewrap): new namespaces for everything (network
  included), the filesystem mounted read-only but for its directory, a private /tmp;
- else `unshare -n` (or `unshare -rn` without root): a network namespace with no interfaces.
Without either, no network isolation holds below the audit hook, and the filesystem view is
the audit hook's alone: an escape from the interpreter (a bug in CPython or a C extension)
would reach what the user `nobody` may (world-readable files, the network).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HARNESS = Path(__file__).with_name("sandbox_harness.py")
NOBODY = 65534


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 10
    memory_mb: int = 1024
    file_mb: int = 16
    processes: int = 64  # threads count (numpy's BLAS threads are set to 1)
    wall_seconds: float = 30.0


@dataclass(frozen=True)
class Isolation:
    kernel: str  # 'bwrap', 'unshare-net' or 'none'
    prefix: tuple[str, ...]
    user: str  # who the grader runs as: 'nobody', or the caller's user and why


def _readable_by_others(path: str) -> bool:
    """Whether a user with no rights of its own (nobody) can read `path`: every directory on the
    way searchable by others, the path itself readable."""
    import stat

    p = Path(path).resolve()
    try:
        for d in [*reversed(p.parents), p]:
            mode = d.stat().st_mode
            if not mode & stat.S_IXOTH or (d == p and not mode & stat.S_IROTH):
                return False
    except OSError:
        return False
    return True


def _python_dirs() -> list[str]:
    import sysconfig

    return [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]]


@dataclass
class CaseResult:
    score: float | None = None
    error: str | None = None  # 'runtime' (the user's code raised) or 'server' (the sandbox stopped it)
    detail: str | None = None


@functools.lru_cache(maxsize=1)
def isolation() -> Isolation:
    """The strongest kernel boundary this machine grants, found once by trying it."""
    root = os.geteuid() == 0
    candidates: list[tuple[str, tuple[str, ...]]] = []
    if shutil.which("bwrap"):
        candidates.append(
            (
                "bwrap",
                (
                    "bwrap",
                    "--unshare-all",
                    "--die-with-parent",
                    "--new-session",
                    "--ro-bind",
                    "/",
                    "/",
                    "--dev",
                    "/dev",
                    "--proc",
                    "/proc",
                    "--tmpfs",
                    "/tmp",
                ),
            )
        )
    if shutil.which("unshare"):
        candidates.append(("unshare-net", ("unshare", "-n") if root else ("unshare", "-rn")))
    if not root:
        user = "the caller's user (not root)"
    elif all(_readable_by_others(d) for d in _python_dirs()):
        user = "nobody"
    else:  # e.g. a Python under /root: nobody could not import the standard library
        user = "root: the Python installation is not readable by nobody"
    for name, prefix in candidates:
        try:
            ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return Isolation(name, prefix, user)
    return Isolation("none", (), user)


def run_python(
    source: str, cases: list[tuple[dict[str, Any], dict[str, Any]]], limits: SandboxLimits = SandboxLimits()
) -> list[CaseResult]:
    """`grade(sample, item)` of `source` on each (sample, item), in one sandboxed process."""
    if not cases:
        return []
    iso = isolation()
    with tempfile.TemporaryDirectory(prefix="pygrader-") as home:
        uid = NOBODY if iso.user == "nobody" else None
        if uid is not None:
            os.chown(home, uid, uid)
        os.chmod(home, 0o700)
        prefix = list(iso.prefix)
        if iso.kernel == "bwrap":
            prefix += ["--bind", home, home, "--chdir", home]
        request = {
            "source": source,
            "cases": [{"sample": s, "item": i} for s, i in cases],
            "limits": {
                "cpu_seconds": limits.cpu_seconds,
                "memory_mb": limits.memory_mb,
                "file_mb": limits.file_mb,
                "processes": limits.processes,
            },
            "uid": uid,
        }
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        cmd = [*prefix, sys.executable, "-I", "-B", str(HARNESS)]
        proc = subprocess.Popen(
            cmd,
            cwd=home,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(json.dumps(request).encode(), timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return [CaseResult(error="server", detail=f"timeout: over {limits.wall_seconds:g} s")] * len(cases)
        finally:
            _kill_group(proc)  # anything it left behind in its session
    if proc.returncode != 0:
        return [CaseResult(error="server", detail=_stopped(proc.returncode, err, limits))] * len(cases)
    try:
        rows = json.loads(out)
    except ValueError:
        return [CaseResult(error="server", detail="the sandbox gave no result")] * len(cases)
    return [CaseResult(r.get("score"), r.get("error"), r.get("detail")) for r in rows]


def _stopped(code: int, err: bytes, limits: SandboxLimits) -> str:
    if code in (-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU, 128 + signal.SIGKILL):
        return f"cpu_limit: over {limits.cpu_seconds} CPU seconds"
    if code in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        return f"file_limit: a file over {limits.file_mb} MB"
    tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
    return f"exit code {code}: {tail[0][:500]}"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
