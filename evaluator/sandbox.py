"""The python grader's sandbox: the user's `grade(sample, item)` runs in a separate interpreter
(evaluator/sandbox_harness.py), one process per batch of cases, never in the caller's process.

`run_python` runs it behind the kernel's boundary (`mode="kernel"`, the default: bubblewrap's
namespaces over a root filesystem of its own, as a uid of its own: evaluator/sandbox_uids.py), or
behind the audit hook alone (`mode="audit-hook"`, settings: graders.python_sandbox, for single-user
installs). In both modes a system-call filter (evaluator/sandbox_seccomp.py), resource limits
(`SandboxLimits`) and an audit hook hold inside the process. It fails closed: where the boundary
cannot be made it raises SandboxUnavailable (the API answers 503). What is mounted, what each
layer refuses and what the hook does not hold: RELIABILITY.md, "`evaluator/sandbox.py`: how the
boundary is built".
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluator import sandbox_seccomp
from evaluator.sandbox_results import CaseResult as CaseResult  # what run_python returns
from evaluator.sandbox_results import read_results
from evaluator.sandbox_uids import BOX_USER, box_uid
from evaluator.sandbox_uids import NOBODY as NOBODY  # the user a sandbox without root is seen as
from runtime.errors import SandboxUnavailable as SandboxUnavailable  # raised here; its callers import it from here

HARNESS = Path(__file__).with_name("sandbox_harness.py")
MODES = ("kernel", "audit-hook")
INSIDE_HARNESS = "/sandbox/harness.py"  # where bwrap mounts the harness
NOEXEC_FAILED = "noexec: not held"  # what the harness prints where it could not (evaluator/sandbox_harness.py)
WORKDIR = "/tmp"  # the grader's directory inside bwrap (its own tmpfs)
# What a sandboxed grader's output may cost its caller (the API, a job, the grading pool): its scores
# (the harness writes at most about 4 KB of JSON detail a case) up to this much, else the call fails; of
# what it prints (stderr), the last STDERR_TAIL bytes, the rest read and dropped. communicate() kept
# everything: a grader printing in a loop for its wall time left gigabytes in the caller's memory.
RESULT_BYTES = 64 * 1024
RESULT_BYTES_PER_CASE = 16 * 1024
STDERR_TAIL = 64 * 1024
NAMESPACE_HINT = (
    "allow it to create namespaces: run mathrl as root, or allow unprivileged user namespaces "
    "(sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0); in a container, a runtime "
    "profile that permits unshare (on Kubernetes: the chart's grading pool, with runtimeClassName gvisor where "
    "the cluster has it); a single-user install may instead set MATHRL_GRADERS__PYTHON_SANDBOX=audit-hook "
    "(no kernel boundary)"
)
INSTALL_HINT = (
    "install bubblewrap on this machine (Debian: apt-get install bubblewrap; the mathrl images carry it) and "
    + NAMESPACE_HINT
)


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 10
    memory_mb: int = 1024
    file_mb: int = 16
    processes: int = 64  # threads count (numpy's BLAS threads are set to 1)
    wall_seconds: float = 30.0
    mode: str = "kernel"  # MODES: 'kernel' (bubblewrap, else refused) or 'audit-hook' (the hook alone)
    audit_hook: bool = True  # off only in the tests that prove the kernel boundary holds by itself
    syscall_filter: bool = True  # off only in the test that shows what the filter itself refuses
    pool_url: str | None = None  # a grading pool runs it (service/grading_pool.py), in the pool's own mode
    pool_token: str | None = None


@dataclass(frozen=True)
class Isolation:
    kernel: str  # 'bwrap', 'unshare-net' (audit-hook mode) or 'none'
    prefix: tuple[str, ...]  # the command line before the interpreter's
    user: str  # who the grader runs as
    refused: str | None = None  # why python graders cannot run in this mode here, and what to do
    executable_dir: str | None = None  # bwrap: why its directory could not be made noexec (None: it is)

    def describe(self) -> str:
        """One line for the demo, the health page and the logs."""
        if self.refused:
            return f"python graders refused: {self.refused}"
        if self.kernel == "bwrap":
            noexec = f"; its directory executable ({self.executable_dir})" if self.executable_dir else ""
            return (
                "python graders behind a kernel boundary (bubblewrap: new pid, net, ipc, mount namespaces), "
                f"as {self.user}{noexec}"
            )
        net = "a network namespace of its own" if self.kernel == "unshare-net" else "no network namespace"
        return f"python graders behind the audit hook only (single-user mode, {net}), as {self.user}"


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
    """What the interpreter reads: its installation (the base and a virtual environment's), each
    as given and resolved (a venv's python is a link into the base)."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sysconfig.get_paths()["stdlib"]}
    dirs |= {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    dirs |= {str(Path(d).resolve()) for d in list(dirs)}
    dirs.add(str(Path(sys.executable).resolve().parent.parent))
    out = sorted(d for d in dirs if d and os.path.isdir(d) and not d.startswith("/usr/"))
    # a directory inside another is mounted with it
    return [d for d in out if not any(d != o and d.startswith(o.rstrip("/") + "/") for o in out)]


def _bwrap_prefix(tmp_mb: int, writable: bool = True) -> list[str]:
    """bwrap's command line; `writable` False (the python tool's): its /tmp read-only too, nowhere to write."""
    root = os.geteuid() == 0
    argv = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
    argv += ["--unshare-uts", "--unshare-cgroup-try"]
    if root:
        # the harness drops to the sandbox's own uid itself (CAP_SYS_ADMIN: only to make its directory noexec first)
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        argv += ["--cap-add", "CAP_SYS_ADMIN"] if writable else []
    else:  # a user namespace of its own, the caller's uid seen as nobody, no capabilities
        argv += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    # its writable tmpfs before the installation: a Python under /tmp (a clone in a temporary directory)
    # is then bound on top of it, where a tmpfs mounted after would hide it (bwrap mounts in order)
    argv += ["--perms", "1777", "--size", str(tmp_mb * 1024 * 1024), "--tmpfs", WORKDIR]
    made: set[str] = {WORKDIR}
    for d in _python_dirs():
        # the directories on the way, searchable by nobody (bwrap would make them 0700): what makes a
        # Python under /root readable to the grader, without opening /root
        for parent in reversed(Path(d).parents):
            if str(parent) != "/" and str(parent) not in made:
                made.add(str(parent))
                argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", d, d]
    argv += ["--perms", "0755", "--dir", "/sandbox"]
    # no /proc at all: nothing of any process to read (and a container's masked /proc cannot be mounted again)
    argv += ["--ro-bind", str(HARNESS), INSIDE_HARNESS, "--dev", "/dev", "--chdir", WORKDIR]
    # the root and /dev are tmpfs without a size that bwrap makes; without root they are the caller's,
    # and so the grader's (its uid inside): read-only, the sized WORKDIR is its one place to write
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    return argv if writable else [*argv, "--remount-ro", WORKDIR]


def _user(root: bool) -> tuple[str, str | None]:
    """Who a grader without bwrap would run as, and why it cannot where it cannot."""
    if not root:
        return "the caller's user (not root)", None
    if all(_readable_by_others(d) for d in _python_dirs()):
        return BOX_USER, None
    return BOX_USER, (
        "the Python installation is not readable by other users (a Python under /root?), and a grader never runs as "
        "root: use the default mode, kernel (bubblewrap's read-only bind makes the installation readable), or "
        "a Python installation that others may read"
    )


REPROBE_SECONDS = 30.0
_found: dict[str, tuple[Isolation, float]] = {}
_finding = threading.Lock()


def isolation(mode: str = "kernel") -> Isolation:
    """The sandbox `mode` gives on this machine, found by starting it: once where it works, while a
    refusal is found again after REPROBE_SECONDS, since a probe can fail for a passing reason (a
    timeout on a loaded machine) and a grading pool's /readyz would otherwise say 503 until restarted."""
    if mode not in MODES:
        raise ValueError(f"python sandbox mode {mode!r}: use one of {', '.join(MODES)}")
    known = _found.get(mode)
    if known and (not known[0].refused or time.monotonic() - known[1] < REPROBE_SECONDS):
        return known[0]
    with _finding:  # one probe at a time: callers past the window wait for it instead of each probing
        known = _found.get(mode)
        if known and (not known[0].refused or time.monotonic() - known[1] < REPROBE_SECONDS):
            return known[0]
        iso = _find_isolation(mode)
        _found[mode] = (iso, time.monotonic())
        return iso


def forget_isolation() -> None:
    """Find the sandbox again on the next call (tests that change what the probe meets)."""
    _found.clear()


def _find_isolation(mode: str) -> Isolation:
    root = os.geteuid() == 0
    no_filter = sandbox_seccomp.why_unavailable()
    if no_filter:
        return Isolation("none", (), "nobody", no_filter)
    if mode == "kernel":
        if not shutil.which("bwrap"):
            return Isolation("none", (), "nobody", "bubblewrap (bwrap) is not installed: " + INSTALL_HINT)
        prefix = tuple(_bwrap_prefix(64))
        notes: list[str] = []
        probe = _probe(list(prefix), INSIDE_HARNESS, notes)
        if probe and sandbox_seccomp.REFUSED in probe:
            return Isolation("none", (), "nobody", f"{probe}: {sandbox_seccomp.LOAD_HINT}")
        if probe:
            return Isolation("none", (), "nobody", f"bubblewrap is installed, but {_why_bwrap_failed(probe)}")
        return Isolation("bwrap", prefix, BOX_USER if root else "nobody", executable_dir=notes[0] if notes else None)
    user, refused = _user(root)
    if refused:
        return Isolation("none", (), user, refused)
    iso = Isolation("none", (), user)
    if shutil.which("unshare"):
        # without root a user namespace of its own, never root inside: the caller's uid (-c, util-linux
        # 2.38), else unmapped (nobody inside, the caller's access outside); not -r, root inside, where
        # the harness refuses to run
        for prefix in [("unshare", "-n")] if root else [("unshare", "-cn"), ("unshare", "-Un")]:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0:
                iso = Isolation("unshare-net", prefix, user)
                break
    probe = _probe(list(iso.prefix), str(HARNESS))
    if probe:  # the filter, most likely: the rest of this mode is the interpreter alone
        hint = sandbox_seccomp.LOAD_HINT if sandbox_seccomp.REFUSED in probe else "see evaluator/sandbox.py"
        return Isolation("none", (), user, f"a python grader could not start here ({probe}): {hint}")
    return iso


def _why_bwrap_failed(probe: str) -> str:
    """The refusal when bwrap is there and its probe failed: what it said, and the fix for that cause
    (namespaces refused by the machine, or an interpreter the sandbox cannot reach), never "install it"."""
    if any(word in probe for word in ("namespace", "Operation not permitted", "setting up uid map", "No permissions")):
        return f"it could not make the sandbox's namespaces here ({probe}): {NAMESPACE_HINT}"
    return f"the interpreter did not start inside the sandbox ({probe}): see evaluator/sandbox.py, _bwrap_prefix"


def _probe(prefix: list[str], harness: str, notes: list[str] | None = None) -> str | None:
    """Run a trivial grader through `prefix` (as a uid of its own where root): None if it scored, else
    what went wrong. `notes` (bwrap's probe): gets why the grader's directory could not be made
    noexec, where it could not."""
    with box_uid() as uid:
        return _probe_as(uid, prefix, harness, notes)


def _probe_as(uid: int | None, prefix: list[str], harness: str, notes: list[str] | None) -> str | None:
    request: dict[str, Any] = {"source": "def grade(s, i):\n    return 1", "cases": [{"sample": {}, "item": {}}]}
    request |= {"uid": uid, "limits": {"cpu_seconds": 10, "memory_mb": 1024, "file_mb": 1, "processes": 64}}
    request |= {"seccomp": _seccomp(), "noexec": notes is not None}
    try:
        out = subprocess.run(
            [*prefix, sys.executable, "-I", "-B", harness],
            input=json.dumps(request).encode(),
            capture_output=True,
            timeout=30,
            env=_env(WORKDIR),
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if out.returncode == 0 and out.stdout.strip() == b'[{"score": 1.0}]':
        said = out.stderr.decode(errors="replace").splitlines()
        if notes is not None:
            notes += [line.removeprefix(NOEXEC_FAILED).strip(" ()") for line in said if line.startswith(NOEXEC_FAILED)]
        return None
    tail = out.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {out.returncode}"]
    return tail[0][:300]


def _seccomp() -> str:
    """The system-call filter the harness loads before the user's code (evaluator/sandbox_seccomp.py)."""
    return base64.b64encode(sandbox_seccomp.program()).decode()


def _env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def check_available(mode: str = "kernel") -> None:
    """Raise SandboxUnavailable where python graders cannot run in `mode` on this machine."""
    iso = isolation(mode)
    if iso.refused:
        raise SandboxUnavailable(f"python graders cannot run on this server: {iso.refused}")


def run_python(
    source: str, cases: list[tuple[dict[str, Any], dict[str, Any]]], limits: SandboxLimits = SandboxLimits()
) -> list[CaseResult]:
    """`grade(sample, item)` of `source` on each (sample, item), in one sandboxed process.
    Raises SandboxUnavailable where the sandbox of `limits.mode` cannot be made."""
    if not cases:
        return []
    if limits.pool_url:
        return _run_in_pool(source, cases, limits)
    check_available(limits.mode)
    iso = isolation(limits.mode)
    # root: the harness drops to a uid of this run's own (never root: isolation() refused otherwise)
    with box_uid() as uid:
        return _run_as(uid, iso, source, cases, limits)


def _run_as(
    uid: int | None,
    iso: Isolation,
    source: str,
    cases: list[tuple[dict[str, Any], dict[str, Any]]],
    limits: SandboxLimits,
) -> list[CaseResult]:
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
        "audit_hook": limits.audit_hook,
        "syscall_filter": limits.syscall_filter,
        "seccomp": _seccomp(),
        "noexec": iso.kernel == "bwrap",
    }
    with tempfile.TemporaryDirectory(prefix="pygrader-") as home:
        if iso.kernel == "bwrap":  # its directory is its own tmpfs, nothing on this machine's disk
            cmd = [*_bwrap_prefix(limits.file_mb * 4), sys.executable, "-I", "-B", INSIDE_HARNESS]
            cwd, env = home, _env(WORKDIR)
        else:
            if uid is not None:
                os.chown(home, uid, uid)
            cmd = [*iso.prefix, sys.executable, "-I", "-B", str(HARNESS)]
            cwd, env = home, _env(home)
        os.chmod(home, 0o700)
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        result_cap = RESULT_BYTES + RESULT_BYTES_PER_CASE * len(cases)
        try:
            out, err = _communicate(proc, json.dumps(request).encode(), limits.wall_seconds, result_cap)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait()
            return [CaseResult(error="server", detail=f"timeout: over {limits.wall_seconds:g} s")] * len(cases)
        finally:
            _kill_group(proc)  # anything it left behind in its session
            for pipe in (proc.stdout, proc.stderr):  # stdin: its feeder closes it
                if pipe is not None:
                    pipe.close()
        if out is None:
            detail = f"output_limit: the grader wrote over {result_cap} bytes where its scores go"
            return [CaseResult(error="server", detail=detail)] * len(cases)
    if proc.returncode != 0:
        return [CaseResult(error="server", detail=_stopped(proc.returncode, err, limits))] * len(cases)
    return read_results(out, len(cases), "the sandbox gave no result")


POOL_LIMITS = ("cpu_seconds", "memory_mb", "file_mb", "processes", "wall_seconds")


def _run_in_pool(
    source: str, cases: list[tuple[dict[str, Any], dict[str, Any]]], limits: SandboxLimits
) -> list[CaseResult]:
    """The same call, run by a grading pool (POST {pool_url}/v1/run), which sandboxes it in its own
    mode: on Kubernetes, pods with no credentials, no egress and a read-only root (helm: grading)."""
    import httpx

    body = {
        "source": source,
        "cases": [{"sample": s, "item": i} for s, i in cases],
        "limits": {k: getattr(limits, k) for k in POOL_LIMITS},
    }
    headers = {"Authorization": f"Bearer {limits.pool_token}"} if limits.pool_token else {}
    try:
        r = httpx.post(
            f"{str(limits.pool_url).rstrip('/')}/v1/run", json=body, headers=headers, timeout=limits.wall_seconds + 10
        )
    except httpx.HTTPError as e:
        return [CaseResult(error="server", detail=f"the grading pool did not answer: {type(e).__name__}")] * len(cases)
    if r.status_code == 503:
        raise SandboxUnavailable(str(r.json().get("detail", r.text)))
    if r.status_code != 200:
        return [CaseResult(error="server", detail=f"the grading pool answered {r.status_code}")] * len(cases)
    return read_results(r.content, len(cases), "the grading pool gave no result", key="results")


def _communicate(
    proc: subprocess.Popen[bytes], request: bytes, timeout: float, result_cap: int
) -> tuple[bytes | None, bytes]:
    """proc.communicate(request, timeout) in bounded memory: stdout is None once over `result_cap`
    bytes (the process is then killed); of stderr only its last STDERR_TAIL bytes are kept."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + timeout

    def feed(pipe: Any) -> None:
        try:
            pipe.write(request)
        except OSError:  # it ended (or was killed) before reading it all: its exit status says why
            pass
        finally:
            with contextlib.suppress(OSError):
                pipe.close()

    threading.Thread(target=feed, args=(proc.stdin,), daemon=True).start()
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, out)
        selector.register(proc.stderr, selectors.EVENT_READ, err)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if key.data is out and len(out) > result_cap:
                    _kill_group(proc)
                    proc.wait()
                    return None, bytes(err)
                if key.data is err and len(err) > STDERR_TAIL:
                    del err[:-STDERR_TAIL]
    proc.wait(max(deadline - time.monotonic(), 0.0))
    return bytes(out), bytes(err)


def _stopped(code: int, err: bytes, limits: SandboxLimits) -> str:
    if code in (-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU, 128 + signal.SIGKILL):
        return f"cpu_limit: over {limits.cpu_seconds} CPU seconds"
    if code in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        return f"file_limit: a file over {limits.file_mb} MB"
    if code in (-signal.SIGSYS, 128 + signal.SIGSYS):
        return "syscall_refused: killed for a system call of another architecture (evaluator/sandbox_seccomp.py)"
    tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
    return f"exit code {code}: {tail[0][:500]}"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
