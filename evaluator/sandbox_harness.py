"""Runs inside the python grader's sandbox (evaluator/sandbox.py), as its own interpreter
(`python -I -B`): filters its system calls (seccomp), limits itself, drops to an unprivileged
user, installs an audit hook, then runs the user's `grade(sample, item)` on each case. Reads
{"source", "cases", "limits", "uid", "seccomp"} as JSON on stdin; writes one JSON list of results
on the stdout it was given (the user's prints go to stderr). Standard library only: nothing of
mathrl is importable here."""

import base64
import contextlib
import ctypes
import json
import math
import os
import resource
import signal
import struct
import sys
import traceback
from typing import Any

MB = 1024 * 1024
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_DUMPABLE = 38, 22, 2, 4
BPF_MAXINSNS = 4096  # the kernel's limit on a filter's length


def _limit(which: int, value: int) -> None:
    soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


# modules that start processes or call C without an audit event of their own: never importable
NO_IMPORT = ("_posixsubprocess", "subprocess", "_cffi_backend", "cffi", "_xxsubinterpreters", "_posixshmem")


def _real(path: str | bytes) -> str:
    return os.path.realpath(os.fsdecode(path))


MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 0x2, 0x4, 0x8, 0x20, 0x1000
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
NOEXEC_FAILED = "noexec: not held"  # what the caller's probe looks for (evaluator/sandbox.py)


def _noexec(path: str) -> None:
    """Remount the grader's one writable directory (bubblewrap's tmpfs) so that nothing in it can be
    mapped executable: a library or a compiled module it writes there fails to load in the kernel,
    whatever reached past the audit hook. Root (bwrap keeps CAP_SYS_ADMIN for this, and the drop to
    nobody ends it) remounts in bwrap's mount namespace; without root, a user and mount namespace of
    its own below bwrap's (the filter forbids both from then on), its capabilities there dropped
    after. Where neither can be done the grader runs as before, and the probe says so."""
    libc = ctypes.CDLL(None, use_errno=True)
    nested = os.getuid() != 0
    if nested and libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        print(f"{NOEXEC_FAILED} (unshare: {os.strerror(ctypes.get_errno())})", file=sys.stderr)
        return
    flags = MS_REMOUNT | MS_BIND | MS_NOEXEC | MS_NOSUID | MS_NODEV
    if libc.mount(None, path.encode(), None, flags, None) != 0:
        print(f"{NOEXEC_FAILED} (mount: {os.strerror(ctypes.get_errno())})", file=sys.stderr)
    if nested:  # every capability of the namespace it made: none kept (struct __user_cap_header/data, v3)
        header = struct.pack("@Ii", 0x20080522, 0)
        if libc.capset(header, bytes(24)) != 0:
            raise SystemExit(f"refusing to run a python grader: capset: {os.strerror(ctypes.get_errno())}")


def _install_hook(home: str, read_roots: list[str]) -> None:
    home = os.path.realpath(home) + os.sep
    roots = tuple(os.path.realpath(r) + os.sep for r in read_roots if r)
    blocked_prefixes = ("socket.", "subprocess.", "ctypes.", "os.exec", "os.spawn", "os.posix_spawn", "pty.")
    blocked = {
        "_thread.start_new_thread",
        "os.system",
        "os.fork",
        "os.forkpty",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
        "os.startfile",
        "gc.get_objects",  # reaching the hook's own objects to change them
        "gc.get_referrers",
        "gc.get_referents",
        "sys._current_frames",
    }
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    for name in NO_IMPORT:  # imported before the hook: the next import would raise no event
        sys.modules.pop(name, None)
    for module, attr in ((os, "pidfd_open"), (signal, "pidfd_send_signal")):  # signals with no audit event
        if hasattr(module, attr):
            delattr(module, attr)

    def hook(event: str, args: tuple[object, ...]) -> None:
        # loading a library is allowed (numpy imports ctypes, which opens the interpreter itself);
        # looking up its functions (ctypes.dlsym), calling them and raw memory access are not
        if event == "ctypes.dlopen":  # but not a library it wrote itself (its directory is noexec too)
            if args and isinstance(args[0], str | bytes) and (_real(args[0]) + os.sep).startswith(home):
                raise PermissionError("a python grader may not load a library from its own directory")
            return
        if event in blocked or event.startswith(blocked_prefixes):
            raise PermissionError(f"{event} is not allowed in a python grader")
        if event == "import" and args and isinstance(args[0], str):
            if any(part in NO_IMPORT for part in args[0].split(".")):  # g._posixsubprocess too
                raise PermissionError(f"importing {args[0]} is not allowed in a python grader")
        if event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            if isinstance(path, int):
                return
            if isinstance(path, bytes):
                path = os.fsdecode(path)
            real = os.path.realpath(str(path))
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags
            )
            inside = (real + os.sep).startswith(home)
            if writing and not inside:
                raise PermissionError(f"a python grader may write only in its own directory, not {real}")
            if not writing and not inside and not (real + os.sep).startswith(roots):
                raise PermissionError(f"a python grader may not read {real}")
        elif event in ("os.listdir", "os.scandir") and args and isinstance(args[0], str | bytes):
            real = os.path.realpath(os.fsdecode(args[0])) + os.sep
            if not real.startswith(home) and not real.startswith(roots):
                raise PermissionError(f"a python grader may not list {real}")
        elif event in (
            "os.remove",
            "os.rename",
            "os.rmdir",
            "os.mkdir",
            "os.chmod",
            "os.chown",
            "os.symlink",
            "os.link",
        ):
            for path in args[:2]:
                if isinstance(path, str | bytes) and not (os.path.realpath(os.fsdecode(path)) + os.sep).startswith(
                    home
                ):
                    raise PermissionError(f"{event} outside the grader's directory is not allowed")

    sys.addaudithook(hook)

    # a compiled module runs C with no audit events: only those of the installation may load
    import _imp

    create_dynamic = _imp.create_dynamic

    def installed_only(spec: Any, *rest: Any) -> Any:
        origin = os.path.realpath(str(getattr(spec, "origin", "") or ""))
        if not (origin + os.sep).startswith(roots) or (origin + os.sep).startswith(home):
            raise PermissionError(f"a python grader may load compiled modules only from the installation, not {origin}")
        # a module's init function is named by the last part of its name (g._posixsubprocess is _posixsubprocess)
        names = {str(getattr(spec, "name", "")).rpartition(".")[2], os.path.basename(origin).split(".")[0]}
        if names & set(NO_IMPORT):
            raise PermissionError(f"loading {origin} is not allowed in a python grader")
        return create_dynamic(spec, *rest)

    _imp.create_dynamic = installed_only

    # threads raise no audit event before Python 3.13: the functions that start them are replaced
    import _thread
    import threading

    def no_threads(*args: object, **kwargs: object) -> None:
        raise PermissionError("threads are not allowed in a python grader")

    for module, name in (
        (_thread, "start_new_thread"),
        (_thread, "start_joinable_thread"),
        (threading, "_start_new_thread"),
        (threading, "_start_joinable_thread"),
    ):
        if hasattr(module, name):
            setattr(module, name, no_threads)


def _filter_syscalls(program: bytes) -> None:
    """Load the caller's seccomp program (evaluator/sandbox_seccomp.py) on this process, for good:
    no_new_privs first (what lets a process without CAP_SYS_ADMIN filter itself), then the filter."""
    if not program or len(program) % 8 or len(program) // 8 > BPF_MAXINSNS:
        raise SystemExit(f"refusing to run a python grader: {len(program)} bytes are not a system-call filter")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    code = ctypes.create_string_buffer(program, len(program))
    # struct sock_fprog {unsigned short len; struct sock_filter *filter;}, in the C compiler's layout
    fprog = ctypes.create_string_buffer(struct.pack("@HP", len(program) // 8, ctypes.addressof(code)))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.prctl(
        PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0
    ):
        # the words evaluator/sandbox_seccomp.py's REFUSED looks for (nothing of mathrl is importable here)
        raise SystemExit(f"could not load the system-call filter: {os.strerror(ctypes.get_errno())}")


def _own_process_filter(me: int, calls: dict[str, list[int]]) -> bytes:
    """A classic BPF program for this call's process `me` (evaluator/sandbox_seccomp.py
    OWN_PROCESS_ONLY, NO_OTHER_PROCESS): the 'own' calls with arg 0 of 0, `me` or -`me` (its
    group) allowed, the rest of them and every 'denied' call EPERM, anything else allowed."""
    ld, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    arg0 = 16 + (4 if sys.byteorder == "big" else 0)  # struct seccomp_data: the low 32 bits of args[0]
    own, denied = list(calls.get("own") or ()), list(calls.get("denied") or ())
    ok = [0, me, -me & 0xFFFFFFFF]
    # the layout: load nr; a test per denied call (to DENY); a test per own call (to CHECK); ALLOW;
    # CHECK: load arg 0, a test per allowed value (to ALLOW); DENY; ALLOW
    n_tests = len(denied) + len(own)
    check = 1 + n_tests + 1  # the index of CHECK's load
    deny_at = check + 1 + len(ok)
    allow_at = deny_at + 1
    prog = [(ld, 0, 0, 0)]
    for i, nr in enumerate(denied + own):
        at = 1 + i
        target = deny_at if i < len(denied) else check
        prog.append((jeq, target - at - 1, 0, nr))
    prog.append((ret, 0, 0, allow))
    prog.append((ld, 0, 0, arg0))
    for j, value in enumerate(ok):
        at = check + 1 + j
        prog.append((jeq, allow_at - at - 1, 0, value))
    prog += [(ret, 0, 0, deny), (ret, 0, 0, allow)]
    if any(not 0 <= jt <= 255 for _, jt, _, _ in prog):
        raise SystemExit("refusing to run a tool call: its per-call filter's jumps do not fit")
    return b"".join(struct.pack("@HBBI", code, jt, jf, k) for code, jt, jf, k in prog)


def _detail(e: BaseException) -> str:
    """The end of what `e` says, at most 4,000 bytes as JSON (a character outside ASCII is up to 12):
    the caller takes a bounded result a case (evaluator/sandbox.py, RESULT_BYTES_PER_CASE)."""
    detail = "".join(traceback.format_exception_only(type(e), e)).strip()[-2000:]
    while len(json.dumps(detail)) > 4000:
        detail = detail[len(detail) // 2 :]
    return detail


def _enter(request: dict[str, Any]) -> Any:
    """Everything before the user's code, in this order: the noexec directory, the filter, the
    limits, the sandbox's uid. Returns the stdout it was given (the user's prints go to stderr)."""
    limits = request["limits"]
    if request.get("noexec"):  # bwrap's tmpfs, before the filter (which refuses mount and unshare)
        _noexec(os.getcwd())
    if request.get("syscall_filter", True):  # off only in the test that shows what the filter refuses
        _filter_syscalls(base64.b64decode(request.get("seccomp") or ""))  # before anything of the user's
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    _limit(resource.RLIMIT_CPU, int(limits["cpu_seconds"]))
    _limit(resource.RLIMIT_AS, int(limits["memory_mb"]) * MB)
    _limit(resource.RLIMIT_FSIZE, int(limits["file_mb"]) * MB)
    _limit(resource.RLIMIT_NOFILE, 64)
    _limit(resource.RLIMIT_CORE, 0)
    if os.getuid() == 0 and request.get("uid") is not None:  # root (in bwrap: no other capability): the sandbox's uid
        os.setgroups([])
        os.setgid(request["uid"])
        os.setuid(request["uid"])
    if os.getuid() == 0 or os.geteuid() == 0:
        raise SystemExit("refusing to run a python grader as root")
    _limit(resource.RLIMIT_NPROC, int(limits["processes"]))
    return out


def _read_roots() -> list[str]:
    return [p for p in sys.path if p and os.path.isdir(p)] + [sys.prefix, sys.base_prefix, sys.exec_prefix]


def _first_line() -> tuple[bytes, bytes]:
    """The request (one line: json.dumps writes no newline) read from fd 0 unbuffered, and what came
    after it (a tool's first calls), which a buffered reader would have kept from os.read."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        data += chunk
    line, _, rest = data.partition(b"\n")
    return line, rest


def main() -> None:
    line, rest = _first_line()
    request = json.loads(line)
    out = _enter(request)
    if "tool" in request:
        return _serve(request["tool"], out, rest)
    limits = request["limits"]
    if request.get("audit_hook", True):
        _install_hook(os.getcwd(), _read_roots())
    namespace: dict[str, object] = {"__name__": "grader"}
    try:
        exec(compile(request["source"], "grader.py", "exec"), namespace)  # the user's code, inside the sandbox
        grade = namespace.get("grade")
        if not callable(grade):
            raise TypeError("the source defines no function grade(sample, item)")
    except BaseException as e:
        out.write(json.dumps([{"error": "runtime", "detail": _detail(e)}] * len(request["cases"])))
        return
    results: list[dict[str, object]] = []
    for case in request["cases"]:
        try:
            value = grade(case["sample"], case["item"])
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"grade() returned {type(value).__name__} {value!r:.80}, not a number")
            score = float(value)  # a float subclass's __float__ is what float() gives: check that
            if not math.isfinite(score):  # a NaN or inf reward reached the advantages; graders/run's mean was null
                raise ValueError(f"grade() returned {score}, not a finite number")
            results.append({"score": score})
        except MemoryError:
            results.append({"error": "runtime", "detail": f"MemoryError: over the {limits['memory_mb']} MB limit"})
        except BaseException as e:
            results.append({"error": "runtime", "detail": _detail(e)})
    out.write(json.dumps(results))


# --- the python tool: a warm sandbox that forks a fresh interpreter state per call (evaluator/python_tool.py)


def _serve(tool: dict[str, Any], out: Any, pending: bytes) -> None:
    """Answer tool calls, one JSON line each on stdin ({"id", "code", "history"}), with one JSON line
    each on `out` ({"id", "output", "error"}), in the order they end. Each call runs in a child forked
    from this process, which never runs the user's code: every call starts from the same clean state,
    its `history` (the rollout's earlier blocks, their output dropped) replayed before its `code`.
    At most `parallel` children at once; each is killed with its process group at `timeout_s` (wall)
    or once it has printed over `max_output_bytes`."""
    import ast  # noqa: F401  (what each call imports, imported once here: a fork inherits it)
    import selectors
    import threading  # noqa: F401
    import time
    from collections import deque

    timeout, cap, parallel = float(tool["timeout_s"]), int(tool["max_output_bytes"]), int(tool["parallel"])
    roots = _read_roots()
    waiting: deque[dict[str, Any]] = deque()
    running: dict[int, dict[str, Any]] = {}  # read fd -> {id, pid, deadline, buf}
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, None)
    stdin_open = True
    *lines, pending = pending.split(b"\n")
    waiting.extend(json.loads(line) for line in lines if line.strip())

    def answer(call_id: Any, output: str, error: str | None) -> None:
        out.write(json.dumps({"id": call_id, "output": output, "error": error}) + "\n")
        out.flush()

    def finish(fd: int, error: str | None) -> None:
        job = running.pop(fd)
        selector.unregister(fd)
        os.close(fd)
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(job["pid"], signal.SIGKILL)
        _, status = os.waitpid(job["pid"], 0)
        text = bytes(job["buf"][:cap]).decode(errors="replace")
        if error is None and os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            error = "cpu_limit" if sig in (signal.SIGXCPU, signal.SIGKILL) else f"killed by signal {sig}"
        answer(job["id"], text, error)

    while stdin_open or waiting or running:
        while waiting and len(running) < parallel:
            call = waiting.popleft()
            r, w = os.pipe()
            try:
                pid = _fork(patient=not running)
            except BlockingIOError:  # the sandbox's processes (RLIMIT_NPROC) are held by its running calls
                os.close(r)
                os.close(w)
                if running:  # one of them ends at the latest at its timeout, and gives its share back
                    waiting.appendleft(call)
                    break
                answer(call.get("id"), "", "process_limit")
                continue
            if pid == 0:  # the call's own process: its code's output goes to the pipe, nothing else it can reach
                _run_call(call, w, timeout, roots, tool.get("own_process_calls") or {})
            with contextlib.suppress(OSError):  # its own group from the start (it sets it too): killed whole
                os.setpgid(pid, pid)
            os.close(w)
            running[r] = {"id": call.get("id"), "pid": pid, "deadline": time.monotonic() + timeout, "buf": bytearray()}
            selector.register(r, selectors.EVENT_READ, r)
        now = time.monotonic()
        first = min((j["deadline"] for j in running.values()), default=now + 3600)
        for key, _ in selector.select(max(0.0, first - now) if running else None):
            if key.data is None:  # the caller
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    stdin_open = False
                    selector.unregister(0)
                    continue
                pending += chunk
                *lines, pending = pending.split(b"\n")
                waiting.extend(json.loads(line) for line in lines if line.strip())
                continue
            job = running[key.data]
            chunk = os.read(key.data, 1 << 16)
            if not chunk:
                finish(key.data, None)
            elif len(job["buf"]) + len(chunk) > cap:
                job["buf"] += chunk[: cap - len(job["buf"])]
                finish(key.data, "output_limit")
            else:
                job["buf"] += chunk
        now = time.monotonic()
        for fd in [fd for fd, j in running.items() if j["deadline"] <= now]:
            finish(fd, "timeout")


def _fork(patient: bool) -> int:
    """os.fork. `patient` (none of the sandbox's calls runs): first waits up to a second for the
    processes of calls just killed to be reaped, which hold their share of RLIMIT_NPROC till then;
    then ends every other process of its uid in its namespace, which can only be what a call left
    outside its group (a child that made a session of its own, which killing the group missed), and
    tries once more."""
    import time

    for attempt in range(30 if patient else 0):
        try:
            return os.fork()
        except BlockingIOError:
            if attempt == 19:
                with contextlib.suppress(OSError):  # not this process, nor the namespace's init (root)
                    os.kill(-1, signal.SIGKILL)
            time.sleep(0.05)
    return os.fork()


def _run_call(
    call: dict[str, Any], w: int, timeout: float, roots: list[str], own_process_calls: dict[str, list[int]]
) -> None:
    """In the forked child: its own process group, a filter that keeps it to its own processes (the
    calls beside it and the server share its uid), no longer dumpable, CPU seconds for its timeout,
    the audit hook, its history replayed with its output dropped, then its code, whose prints (and
    the last expression's value, as a notebook shows it, or the error's last line) go to `w`. Never
    returns."""
    import ast

    try:
        os.setpgid(0, 0)
        _filter_syscalls(_own_process_filter(os.getpid(), own_process_calls))
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:  # no process of its uid may read or trace it
            raise SystemExit("could not make a tool call undumpable")
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):  # the history's output is dropped
            os.dup2(null, fd)
        if w != 3:  # nothing of the server's (the caller's pipe, other calls' pipes) stays open in it
            os.dup2(w, 3)
        os.closerange(4, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        os.close(0)
        # the CPU limit a second past the wall timeout: a call that computes on one thread meets the
        # timeout (at 2 s both fired together, and an idle machine's loop read 'cpu_limit' as often as
        # not); one that computes on several threads meets this
        _limit(resource.RLIMIT_CPU, max(1, math.ceil(timeout)) + 1)
        if call.get("audit_hook", True):  # off only in the tests that show the kernel holds by itself
            _install_hook("/nonexistent-tool-dir", roots)  # no directory of its own: it writes nowhere
        namespace: dict[str, Any] = {"__name__": "__main__"}
        for block in call.get("history") or ():
            try:
                exec(compile(block, "<cell>", "exec"), namespace)  # the user's code
            except BaseException:
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        for fd in (1, 2):
            os.dup2(3, fd)
        os.close(3)
        try:
            tree = ast.parse(call["code"], "<cell>")
            last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            if last is not None:
                tree.body.pop()
            exec(compile(tree, "<cell>", "exec"), namespace)  # the user's code
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
                if value is not None:
                    print(repr(value))
        except BaseException as e:
            print("".join(traceback.format_exception_only(type(e), e)).strip()[-2000:])
        sys.stdout.flush()
    finally:
        os._exit(0)


main()
