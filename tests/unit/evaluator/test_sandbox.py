"""The python grader's sandbox against a hostile tenant (issue 43): each escape class, refused
by the kernel boundary alone (the audit hook switched off, as if an escape had defeated it)
and by the audit hook alone (its own refusal, before the kernel is reached); the boundary
fails closed where it cannot be made. The harms a grader tries: another project's uploaded
file, a root-only secret, the API's environment (/proc/<pid>/environ), a socket to a loopback
server and to the database port, a signal to a process outside, writes to the installation,
and exhausting processes or disk. evaluator/sandbox.py says what holds and why."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from evaluator import sandbox, sandbox_seccomp, sandbox_uids
from evaluator.sandbox import SandboxLimits, SandboxUnavailable, isolation, run_python
from tests.helpers.api import admin_key

pytestmark = pytest.mark.quick

TOKEN = "mathrl-admin-token-7f3a9c"
LIMITS = SandboxLimits(cpu_seconds=10, memory_mb=1024, file_mb=4, wall_seconds=30)


def sandbox_uid(uid: int) -> bool:
    """Whether a sandboxed process ran as its sandbox's user: started by root, a uid of its own from
    evaluator/sandbox_uids.py's range; otherwise nobody, in a user namespace of its own."""
    if os.geteuid() != 0:
        return uid == sandbox_uids.NOBODY
    return sandbox_uids.FIRST_UID <= uid < sandbox_uids.FIRST_UID + sandbox_uids.UIDS


def grader(body: str) -> str:
    return "def grade(sample, item):\n" + "\n".join("    " + line for line in body.splitlines()) + "\n    return 1.0\n"


@pytest.fixture(scope="module")
def boundary() -> Any:
    iso = isolation("kernel")
    print(f"\nsandbox here: {iso.describe()}")
    if iso.refused and not os.environ.get("CI") and os.geteuid() != 0:
        pytest.skip(f"no kernel boundary on this machine ({iso.refused}); scripts/test installs bubblewrap as root")
    assert iso.kernel == "bwrap", iso.refused  # CI and root machines: scripts/setup-sandbox installs bubblewrap
    return iso


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """What another tenant and the service hold on this machine, and a process and a server outside."""
    root = tmp_path_factory.mktemp("tenant-b")
    other = root / "files" / "project-b" / "file-b.jsonl"  # world-readable, as uploads on a shared volume are
    other.parent.mkdir(parents=True)
    other.write_text('{"secret": "project-b-row"}\n')
    os.chmod(root, 0o755)
    for d in other.parents:
        if d.is_relative_to(root):
            os.chmod(d, 0o755)
    other.chmod(0o644)
    secret = root / "root-only.txt"
    secret.write_text("root-only-secret")
    secret.chmod(0o600)
    os.environ["MATHRL_AUTH__ADMIN_TOKEN_PROBE"] = TOKEN  # in this (the API's) process's environ
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    victim = subprocess.Popen(["sleep", "120"])
    yield {"other": str(other), "secret": str(secret), "port": server.getsockname()[1], "victim": victim.pid}
    victim.kill()
    victim.wait()
    server.close()
    os.environ.pop("MATHRL_AUTH__ADMIN_TOKEN_PROBE", None)


# the harms, tried by plain Python and by C (ctypes, a shell through _posixsubprocess.fork_exec,
# os.execv, os.posix_spawn, os.system): each reports what it reached, as the reason of an error
PROBE = r"""
import ctypes, errno, json, os, signal, socket
seen = {"uid": os.getuid(), "euid": os.geteuid()}
def read(path):
    try:
        return open(path).read()
    except OSError as e:
        return f"refused: {errno.errorcode.get(e.errno, e.errno)}"
seen["other"] = read(T["other"])
seen["secret"] = read(T["secret"])
environs = [read(f"/proc/{pid}/environ") for pid in ("1", "self", str(T["victim"]), str(T["parent"]))]
seen["environ_leak"] = any(T["token"] in e for e in environs)
seen["proc"] = os.path.exists("/proc")
def connect(port):
    s = socket.socket()
    s.settimeout(2)
    code = s.connect_ex(("127.0.0.1", port))
    s.close()
    return errno.errorcode.get(code, code)
seen["loopback"] = connect(T["port"])
seen["database"] = connect(5432)
try:
    os.kill(T["victim"], signal.SIGKILL)
    seen["kill"] = "sent"
except OSError as e:
    seen["kill"] = errno.errorcode.get(e.errno, e.errno)
def write(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        return "written"
    except OSError as e:
        return errno.errorcode.get(e.errno, e.errno)
import sysconfig
seen["write_site"] = write(os.path.join(sysconfig.get_paths()["purelib"], "evil.pth"))
seen["write_usr"] = write("/usr/evil")
seen["write_other"] = write(T["other"])
libc = ctypes.CDLL(None)
seen["ctypes_open"] = libc.open(T["secret"].encode(), 0)
import _posixsubprocess
r, w = os.pipe()
er, ew = os.pipe()
cmd = f"id -u; cat {T['other']} {T['secret']}; cat /proc/*/environ | grep -c {T['token']}"
pid = _posixsubprocess.fork_exec(
    [b"/bin/sh", b"-c", cmd.encode()], [b"/bin/sh"], True, tuple(sorted((w, ew))), None, None,
    -1, -1, -1, w, -1, w, er, ew, False, False, -1, None, None, None, -1, None, False,
)
os.close(w); os.close(ew)
os.waitpid(pid, 0)
seen["shell"] = os.read(r, 65536).decode()
child = os.fork()
if child == 0:
    try:
        os.execv("/bin/sh", ["/bin/sh", "-c", f"cat {T['other']} > /dev/null 2>&1 || exit 3; exit 0"])
    finally:
        os._exit(4)
seen["exec_reads_other"] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
try:
    spawned = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", f"cat {T['secret']} > /dev/null 2>&1 || exit 3"], {})
    seen["spawn_reads_secret"] = os.waitstatus_to_exitcode(os.waitpid(spawned, 0)[1]) == 0
except OSError as e:
    seen["spawn_reads_secret"] = errno.errorcode.get(e.errno, e.errno)
seen["system_reads_secret"] = os.system(f"cat {T['secret']} > /dev/null 2>&1") == 0
raise RuntimeError("SEEN" + json.dumps(seen))
"""


def test_the_kernel_boundary_holds_without_the_audit_hook(boundary: Any, targets: dict[str, Any]) -> None:
    """Before this boundary the same probe, as root with the hook as the only guard, read all of it
    (issue 43: uid=0, another project's upload, a 0600 file, the API's environ)."""
    t = {**targets, "token": TOKEN, "parent": os.getpid()}
    src = grader(f"T = {json.dumps(t)}\n" + PROBE)
    (r,) = run_python(src, [({}, {})], SandboxLimits(audit_hook=False))
    assert r.error == "runtime" and r.detail and "SEEN" in r.detail, r
    seen = json.loads(r.detail.split("SEEN", 1)[1])
    print(seen)
    assert seen["uid"] == seen["euid"] and sandbox_uid(seen["uid"]), seen  # never root
    assert seen["other"].startswith("refused") and seen["secret"].startswith("refused")
    assert not seen["environ_leak"] and not seen["proc"]  # its own PID namespace, and no /proc to read it by
    # a loopback of its own (bwrap brings `lo` up) where nothing listens: the server outside, which is
    # listening, and the database are on another network
    assert seen["loopback"] in ("ECONNREFUSED", "ENETUNREACH") and seen["database"] in ("ECONNREFUSED", "ENETUNREACH")
    assert seen["kill"] == "ESRCH"  # the process outside is not in its namespace
    assert os.waitpid(targets["victim"], os.WNOHANG) == (0, 0)  # and still runs
    assert seen["write_site"] in ("EROFS", "EACCES") and seen["write_usr"] in ("EROFS", "EACCES")
    assert seen["write_other"] in ("ENOENT", "EROFS", "EACCES")
    assert seen["ctypes_open"] == -1
    # no program but the interpreter runs at all (issue 66.6: execve refused by the filter); before, the
    # shell ran, as nobody, and read none of it
    assert seen["shell"] == "", seen["shell"]
    assert not seen["exec_reads_other"] and seen["spawn_reads_secret"] in (False, "EPERM")
    assert not seen["system_reads_secret"]


# each call made through libc's syscall(), by number (the native architecture's, from libseccomp),
# with arguments that get as far as the kernel's own code
KERNEL_DOORS = r"""
import ctypes, json, os, threading
libc = ctypes.CDLL(None, use_errno=True)
seen = {}
for name, (nr, args) in CALLS.items():
    ctypes.set_errno(0)
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    seen[name] = "ok" if r >= 0 else os.strerror(ctypes.get_errno())
t = threading.Thread(target=lambda: seen.update(thread="ran"))  # clone3 refused: the C library falls back to clone
t.start()
t.join()
raise RuntimeError("SEEN" + json.dumps(seen))
"""
NEW_USER, NEW_NET = (
    sandbox_seccomp.CLONE_NAMESPACE_FLAGS["CLONE_NEWUSER"],
    sandbox_seccomp.CLONE_NAMESPACE_FLAGS["CLONE_NEWNET"],
)
SIGCHLD, AF_INET, AF_NETLINK, AF_VSOCK, SOCK_DGRAM, UFFD_USER_MODE_ONLY = 17, 2, 16, 40, 2, 1
DOORS = {  # what each call would reach: (name as libseccomp knows it, arguments)
    "user namespace": ("unshare", [NEW_USER]),
    "network namespace": ("unshare", [NEW_NET]),
    "clone into a user namespace": ("clone", [NEW_USER | SIGCHLD, 0, 0, 0, 0]),
    "mount": ("mount", [0, 0, 0, 0, 0]),
    "eBPF": ("bpf", [0, 0, 0]),
    "io_uring": ("io_uring_setup", [1, 0]),
    "keyring": ("keyctl", [0, 0]),
    "perf": ("perf_event_open", [0, 0, -1, -1, 0]),
    "userfaultfd": ("userfaultfd", [UFFD_USER_MODE_ONLY]),
    "ptrace": ("ptrace", [0, 0, 0, 0]),
    "netlink socket": ("socket", [AF_NETLINK, SOCK_DGRAM, 0]),
    "vsock socket": ("socket", [AF_VSOCK, SOCK_DGRAM, 0]),
}
# without the filter these reach past the kernel's permission checks on any Linux: a user namespace
# is made where the machine allows unprivileged ones, the others fail on their (null) arguments
REACHED_WITHOUT_THE_FILTER = ("mount", "keyring", "perf", "netlink socket")


def _doors(limits: SandboxLimits) -> dict[str, str]:
    import pyseccomp

    def nr(name: str) -> int:
        return int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name))

    calls = {what: (nr(name), args) for what, (name, args) in DOORS.items()}
    calls |= {
        "clone3": (nr("clone3"), [0, 0]),
        "getpid": (nr("getpid"), []),
        "inet socket": (nr("socket"), [AF_INET, SOCK_DGRAM, 0]),
    }
    src = grader(f"CALLS = {json.dumps(calls)}\n" + KERNEL_DOORS)
    (r,) = run_python(src, [({}, {})], limits)
    assert r.error == "runtime" and r.detail and "SEEN" in r.detail, r
    seen: dict[str, str] = json.loads(r.detail.split("SEEN", 1)[1])
    print(seen)
    return seen


def test_the_kernels_rarer_doors_are_shut_without_the_audit_hook(boundary: Any) -> None:
    """Before the filter a grader past its hook (here: switched off) made a user namespace of its own,
    root in it with every capability, and a network namespace from there; eBPF, io_uring, the
    keyring, perf and mount reached their kernel code (EINVAL, EFAULT, ENOKEY: the kernel's own
    answers). Now each is EPERM, as are sockets of families its network namespace does not bound,
    clone3 is ENOSYS (threads still start, by clone), and a call of another architecture (x32's
    numbering) kills the process. The same calls with the filter off show it is the filter that refuses."""
    seen = _doors(SandboxLimits(audit_hook=False))
    assert {what: seen[what] for what in DOORS} == dict.fromkeys(DOORS, "Operation not permitted")
    assert seen["clone3"] == "Function not implemented" and seen["getpid"] == "ok" and seen["thread"] == "ran"
    assert seen["inet socket"] == "ok"  # its own network namespace bounds it (the boundary test above)
    unfiltered = _doors(SandboxLimits(audit_hook=False, syscall_filter=False))
    assert all(unfiltered[what] != "Operation not permitted" for what in REACHED_WITHOUT_THE_FILTER), unfiltered
    if int(Path("/proc/sys/user/max_user_namespaces").read_text()) > 0:
        assert unfiltered["user namespace"] == "ok", unfiltered
    # the grader's top level ran under the filter too: FIRST is read back through grade()'s error
    (top,) = run_python(
        f"import ctypes\nR = ctypes.CDLL(None, use_errno=True).unshare({NEW_USER}), ctypes.get_errno()\n"
        "def grade(s, i):\n    raise RuntimeError(repr(R))\n",
        [({}, {})],
        SandboxLimits(audit_hook=False),
    )
    assert top.detail == "RuntimeError: (-1, 1)", top  # EPERM
    if os.uname().machine == "x86_64":
        x32 = "import ctypes\nctypes.CDLL(None).syscall(0x40000000 + 272, 0x10000000)"
        (killed,) = run_python(grader(x32), [({}, {})], SandboxLimits(audit_hook=False))
        assert killed.error == "server" and (killed.detail or "").startswith("syscall_refused"), killed
        # the 32-bit entry, `int 0x80` from a page of its own: getpid (20 there) without the filter, where
        # the kernel has ia32 emulation, and the process killed with it
        i386 = (
            "import ctypes, mmap\nm = mmap.mmap(-1, 4096, prot=7)\n"
            "m.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))\n"
            "pid = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))()\n"
            "raise RuntimeError(f'pid={pid > 0}')"
        )
        (bare,) = run_python(grader(i386), [({}, {})], SandboxLimits(audit_hook=False, syscall_filter=False))
        if bare.detail != "RuntimeError: pid=True":
            pytest.skip(f"no 32-bit entry on this kernel (ia32 emulation off): {bare}")
        (killed,) = run_python(grader(i386), [({}, {})], SandboxLimits(audit_hook=False))
        assert killed.error == "server" and (killed.detail or "").startswith("syscall_refused"), killed


def test_no_system_call_filter_means_no_python_grader(boundary: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails closed: without libseccomp, or where the kernel refuses the filter, the grader is
    refused with what to install or allow; the harness itself runs nothing without a filter."""

    def missing() -> bytes:
        raise SandboxUnavailable(f"no libseccomp.so.2 here: {sandbox_seccomp.INSTALL_HINT}")

    sandbox.forget_isolation()
    try:
        monkeypatch.setattr(sandbox_seccomp, "program", missing)
        for mode in sandbox.MODES:
            iso = isolation(mode)
            assert iso.refused and "apt-get install libseccomp2" in iso.refused, (mode, iso)
        with pytest.raises(SandboxUnavailable, match="libseccomp"):
            run_python(grader("pass"), [({}, {})], LIMITS)
        sandbox.forget_isolation()
        monkeypatch.setattr(sandbox_seccomp, "program", lambda: bytes(8))  # one instruction, no return: EINVAL
        iso = isolation("kernel")
        assert iso.refused and "could not load the system-call filter: Invalid argument" in iso.refused, iso
        assert "CONFIG_SECCOMP_FILTER" in iso.refused and "bubblewrap could not" not in iso.refused, iso
        monkeypatch.undo()  # the filter loads again: a refusal is kept a while, then found again
        assert isolation("kernel").refused, "a refusal is not probed again on every call"
        monkeypatch.setattr(sandbox, "REPROBE_SECONDS", 0.0)
        assert isolation("kernel") == boundary, "a refusal is probed again once REPROBE_SECONDS have passed"
    finally:
        sandbox.forget_isolation()
    request = {"source": grader("pass"), "cases": [{"sample": {}, "item": {}}], "uid": None}
    request["limits"] = {"cpu_seconds": 5, "memory_mb": 512, "file_mb": 1, "processes": 8}
    bare = subprocess.run(
        [sys.executable, "-I", "-B", str(sandbox.HARNESS)], input=json.dumps(request).encode(), capture_output=True,
        timeout=60,
    )  # fmt: skip
    assert bare.returncode != 0 and b"not a system-call filter" in bare.stderr and not bare.stdout, bare


def test_resource_exhaustion_is_bounded_without_the_audit_hook(boundary: Any) -> None:
    fork_bomb = "import os\nfor _ in range(10000):\n    if os.fork() == 0:\n        import time; time.sleep(30)"
    (r,) = run_python(grader(fork_bomb), [({}, {})], SandboxLimits(processes=32, wall_seconds=10, audit_hook=False))
    assert r.score is None and "BlockingIOError" in (r.detail or "") + (r.error or ""), r  # RLIMIT_NPROC: EAGAIN
    fill = "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * 1024 * 1024)\n    i += 1"
    (r,) = run_python(grader(fill), [({}, {})], SandboxLimits(file_mb=2, audit_hook=False))
    assert r.score is None and "No space left on device" in (r.detail or ""), r  # its tmpfs holds file_mb * 4
    (r,) = run_python(
        grader("x = bytearray(2 * 1024 ** 3)"), [({}, {})], SandboxLimits(memory_mb=256, audit_hook=False)
    )
    assert r.score is None and "MemoryError" in (r.detail or ""), r
    (r,) = run_python(grader("while True:\n    pass"), [({}, {})], SandboxLimits(cpu_seconds=1, audit_hook=False))
    assert r.error == "server" and "cpu_limit" in (r.detail or ""), r


def test_a_graders_output_costs_its_caller_bounded_memory(boundary: Any) -> None:
    """Before: communicate() kept all a grader wrote. 50 MB printed, or written where its scores
    go (fd 3, the harness's result channel), stayed in the caller's memory (the API, a job, the
    grading pool); printing in a loop for the wall time left gigabytes there."""
    import tracemalloc

    loud = "import os, sys\nfor _ in range(800):\n    sys.stderr.write('x' * 65536)\nsys.stderr.flush()"
    forged = "import os\nfor _ in range(800):\n    os.write(3, b'x' * 65536)"
    limits = SandboxLimits(wall_seconds=20, audit_hook=False)
    tracemalloc.start()
    try:
        (printed,) = run_python(grader(loud), [({}, {})], limits)
        (flooded,) = run_python(grader(forged), [({}, {})], limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert printed.score == 1.0, printed  # what it prints is read and dropped past the last 64 KB
    assert flooded.error == "server" and "output_limit" in (flooded.detail or ""), flooded
    assert peak < 8 * 1024 * 1024, f"the caller held {peak / 2**20:.0f} MB of a grader's output"


def test_what_bounds_the_output_leaves_the_rest_as_it_was(boundary: Any) -> None:
    """The bounded reader keeps the other outcomes: a grader past its wall time is a timeout; long
    errors outside ASCII (up to 12 bytes a character as JSON) stay errors of their cases, within
    the allowance a case; a process that ends without reading its request is its exit status."""
    (r,) = run_python(grader("import time\ntime.sleep(60)"), [({}, {})], SandboxLimits(wall_seconds=2))
    assert r.error == "server" and (r.detail or "").startswith("timeout: over 2 s"), r
    emoji = "raise ValueError('\U0001f600' * 5000)"
    rows = run_python(grader(emoji), [({}, {})] * 20, LIMITS)
    assert [r.error for r in rows] == ["runtime"] * 20, rows[0]
    assert all((r.detail or "").endswith("\U0001f600") and len(json.dumps(r.detail)) <= 4000 for r in rows), rows[0]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    proc = subprocess.Popen(["sh", "-c", "exit 3"], **pipes)  # type: ignore[call-overload]
    assert sandbox._communicate(proc, b"x" * (1 << 20), 10, 1024) == (b"", b"") and proc.returncode == 3


@pytest.fixture
def without_root(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The sandbox as a service user's worker makes it (bwrap's non-root command line: a user
    namespace, the caller seen as nobody), found here as root too."""
    if os.geteuid() == 0:
        monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    sandbox.forget_isolation()
    iso = isolation("kernel")
    if iso.refused:
        sandbox.forget_isolation()
        pytest.skip(f"no user namespaces for bwrap here: {iso.refused}")
    yield iso
    sandbox.forget_isolation()


def test_without_root_the_graders_one_writable_place_is_its_sized_tmpfs(without_root: Any) -> None:
    """Without root, bwrap makes the sandbox's / and /dev as tmpfs of no size owned by the caller,
    whose uid is the grader's inside: before, a grader (the audit hook defeated) wrote to /, /dev,
    /dev/shm and /sandbox without limit, in the machine's memory. Run here as root with the non-root
    command line (a user namespace, the caller seen as nobody), as a service user's worker runs it."""
    body = (
        "import os\nmade = []\nfor p in ('/evil', '/dev/evil', '/dev/shm/evil', '/sandbox/evil', 'mine'):\n"
        "    try:\n        open(p, 'wb').write(b'x')\n        made.append(p)\n    except OSError:\n        pass\n"
        "raise RuntimeError(f'made={made} uid={os.getuid()}')"
    )
    (r,) = run_python(grader(body), [({}, {})], SandboxLimits(audit_hook=False))
    assert r.detail == "RuntimeError: made=['mine'] uid=65534", r


LIB_DYNLOAD = next(p for p in sys.path if p.endswith("lib-dynload"))
HOOK_REFUSES = [
    (
        "fork_exec",
        "import _posixsubprocess",
        "importing _posixsubprocess is not allowed",
    ),
    ("subprocess", "import subprocess\nsubprocess.run(['id'])", "not allowed"),
    ("exec", "import os\nos.execv('/bin/sh', ['/bin/sh'])", "os.exec is not allowed"),
    ("posix_spawn", "import os\nos.posix_spawn('/bin/sh', ['/bin/sh'], {})", "os.posix_spawn is not allowed"),
    ("system", "import os\nos.system('id')", "os.system is not allowed"),
    ("fork", "import os\nos.fork()", "os.fork is not allowed"),
    ("ctypes", "import ctypes\nctypes.CDLL(None).getpid()", "ctypes.dlsym is not allowed"),
    ("ctypes memory", "import ctypes\nctypes.string_at(1, 8)", "not allowed"),
    ("cffi", "import cffi", "importing cffi is not allowed"),
    ("environ", "open('/proc/1/environ').read()", "may not read /proc/1/environ"),
    ("own memory", "open('/proc/self/mem', 'r+b')", "may write only in its own directory"),
    ("own memory read", "open('/proc/self/mem', 'rb')", "may not read"),
    ("signals", "import os\nos.kill(1, 9)", "os.kill is not allowed"),
    ("pidfd", "import os\nos.pidfd_open(1)", "has no attribute 'pidfd_open'"),
    ("loopback socket", "import socket\nsocket.create_connection(('127.0.0.1', 8000))", "socket."),
    ("database socket", "import socket\nsocket.socket().connect(('127.0.0.1', 5432))", "socket."),
    ("write outside", "open('/usr/lib/evil', 'w')", "may write only in its own directory"),
    (
        ".pth in site-packages",
        "import sysconfig\nopen(sysconfig.get_paths()['purelib'] + '/evil.pth', 'w')",
        "may write only in its own directory",
    ),
    (
        "compiled module from its directory",
        f"import shutil, importlib.util, sysconfig\next = sysconfig.get_config_var('EXT_SUFFIX')\n"
        f"shutil.copy('{LIB_DYNLOAD}/_json' + ext, 'evil.so')\n"
        "spec = importlib.util.spec_from_file_location('evil', 'evil.so')\nimportlib.util.module_from_spec(spec)",
        "compiled modules only from the installation",
    ),
    ("hook internals", "import gc\ngc.get_objects()", "gc.get_objects is not allowed"),
    ("threads", "import threading\nthreading.Thread(target=print).start()", "threads are not allowed"),
]


@pytest.mark.parametrize(("what", "body", "says"), HOOK_REFUSES, ids=[h[0] for h in HOOK_REFUSES])
def test_the_audit_hook_refuses_each_class_itself(boundary: Any, what: str, body: str, says: str) -> None:
    (r,) = run_python(grader(body), [({}, {})], LIMITS)
    assert r.score is None and r.error == "runtime" and says in (r.detail or ""), (what, r)


def test_what_a_grader_may_do_it_still_does(boundary: Any) -> None:
    ok = "import json, math, numpy, re\nopen('mine', 'w').write('2')\nreturn float(open('mine').read()) + numpy.sqrt(4)"
    (r,) = run_python("def grade(sample, item):\n" + "\n".join("    " + x for x in ok.splitlines()), [({}, {})], LIMITS)
    assert r.score == 4.0, r


def test_no_boundary_means_no_python_grader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails closed: without bubblewrap (none on PATH) the grader is refused with what to install."""
    sandbox.forget_isolation()
    monkeypatch.setenv("PATH", "/nonexistent")
    try:
        iso = isolation("kernel")
        assert iso.refused and "apt-get install bubblewrap" in iso.refused and "audit-hook" in iso.refused
        with pytest.raises(SandboxUnavailable, match="bubblewrap"):
            run_python(grader("pass"), [({}, {})], LIMITS)
    finally:
        sandbox.forget_isolation()


def test_audit_hook_mode_never_runs_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The single-user mode: where the grader could not drop to nobody (root, with a Python that
    nobody may read), it is refused rather than run as root."""
    monkeypatch.setattr(sandbox, "_readable_by_others", lambda path: False)
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 0)
    sandbox.forget_isolation()
    try:
        iso = isolation("audit-hook")
        assert iso.refused and "never runs as root" in iso.refused
    finally:
        sandbox.forget_isolation()


AS_A_SERVICE_USER = r"""
import sys
sys.path[:0] = sys.argv[1:]
from evaluator.sandbox import SandboxLimits, isolation, run_python
source = '''
def grade(s, i):
    import ctypes, os, socket
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) == 0 or ctypes.get_errno() != 1:  # CLONE_NEWUSER: EPERM, the filter
        return -2.0
    try:
        socket.create_connection(("127.0.0.1", 5432), 2)
        return -1.0
    except OSError:
        return float(os.getuid())
'''
limits = SandboxLimits(mode="audit-hook", audit_hook=False)
print(isolation("audit-hook").prefix, run_python(source, [({}, {})], limits))
"""


def test_audit_hook_mode_grades_for_a_service_user(tmp_path: Path) -> None:
    """Before: started by a user other than root, audit-hook mode ran the harness under
    `unshare -rn`, root in a user namespace of its own, where the harness refuses to run: every
    grader failed "refusing to run a python grader as root". Now `unshare -cn`: the caller's own
    uid, no network, and the system-call filter (no user namespace of its own). Run as nobody with a
    Python nobody may read (the system's, with this environment's packages on its path)."""
    import shutil
    import sysconfig

    python = "/usr/bin/python3"
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.access(python, os.X_OK):
        pytest.skip("needs root, setpriv and /usr/bin/python3 to become another user")
    version = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    if version.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip(f"/usr/bin/python3 is {version.stdout.strip()}, not this environment's {sys.version_info[:2]}")
    from tests.helpers.env import ROOT

    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", "-i", "PATH=/usr/bin:/bin"]
    paths = [str(ROOT), sysconfig.get_paths()["purelib"]]
    proc = subprocess.run(
        [*nobody, "HOME=/tmp", python, "-c", AS_A_SERVICE_USER, *paths],
        capture_output=True, text=True, timeout=120, cwd="/tmp",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "('unshare', '-cn') [CaseResult(score=65534.0, error=None, detail=None)]", proc.stdout


def test_the_api_answers_503_where_no_boundary_can_be_made(app_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox.forget_isolation()
    monkeypatch.setenv("PATH", "/nonexistent")
    try:
        py = {"type": "python", "name": "p", "source": grader("pass")}
        r = app_client.post(
            "/v1/graders:run", json={"grader": py, "items": [{"completion": "x"}]}, headers=admin_key(app_client)
        )
        assert r.status_code == 503 and "bubblewrap" in r.json()["detail"], r.text
        assert r.headers["x-should-retry"] == "false", r.headers  # the SDK retried it twice (issue 66.5)
        r = app_client.post(
            "/v1/fine_tuning/alpha/graders/run", json={"grader": py, "model_sample": "x"}, headers=admin_key(app_client)
        )
        assert r.status_code == 503 and "bubblewrap" in r.json()["detail"], r.text
    finally:
        sandbox.forget_isolation()


def test_the_exploit_of_issue_43_through_the_api(boundary: Any, app_client: Any) -> None:
    """The request that got a root shell: now the hook refuses it, and below the hook it would run as nobody."""
    source = (
        "def grade(sample, item):\n import os,_posixsubprocess\n r,w=os.pipe(); er,ew=os.pipe()\n"
        " _posixsubprocess.fork_exec([b'/bin/sh',b'-c',b'id'],[b'/bin/sh'],True,tuple(sorted((w,ew))),None,None,"
        "-1,-1,-1,w,-1,w,er,ew,False,False,-1,None,None,None,-1,None,False)\n os.close(w); os.close(ew)\n"
        " raise RuntimeError(os.read(r,4096))"
    )
    body = {"grader": {"type": "python", "name": "p", "source": source}, "items": [{"completion": "x"}]}
    r = app_client.post("/v1/graders:run", json=body, headers=admin_key(app_client))
    assert r.status_code == 200 and "uid=0" not in r.text and "_posixsubprocess is not allowed" in r.text, r.text
    (raw,) = run_python(source, [({}, {})], SandboxLimits(audit_hook=False))
    assert raw.detail == "RuntimeError: b''", raw  # below the hook no shell starts at all (execve refused)


def test_the_sandbox_sees_no_path_of_the_service(boundary: Any, tmp_path: Path) -> None:
    """Nothing but the installation is mounted: not the artifact directory, not the project's code."""
    here = Path(__file__).resolve().parents[3]
    paths = (str(here / "api"), str(tmp_path), "/etc/passwd")
    body = f"import os\nraise RuntimeError(repr([os.path.exists(p) for p in {paths!r}]))"
    (r,) = run_python(grader(body), [({}, {})], SandboxLimits(audit_hook=False))
    assert "[False, False, False]" in (r.detail or ""), r


# what the user's code can hand back past the harness's own checks (issue 66.2): NaN written straight
# to the result pipe (the harness's dup of its stdout, fd 3) and the process ended before the harness
# writes; a float whose __float__ is NaN
NON_FINITE = {
    "NaN on the pipe": "import os\nos.write(3, b'[{\"score\": NaN}]')\nos._exit(0)",
    "Infinity on the pipe": "import os\nos.write(3, b'[{\"score\": -Infinity}]')\nos._exit(0)",
    "a string on the pipe": 'import os\nos.write(3, b\'[{"score": "1"}]\')\nos._exit(0)',
    "two rows for one case": 'import os\nos.write(3, b\'[{"score": 1}, {"score": 1}]\')\nos._exit(0)',
    "a float posing": "class F(float):\n    def __float__(self):\n        return float('nan')\nreturn F(1.0)",
}


@pytest.mark.parametrize("body", NON_FINITE.values(), ids=list(NON_FINITE))
def test_a_score_that_is_not_a_finite_number_is_the_graders_error(boundary: Any, body: str) -> None:
    """Before, each came back as the grader's score (NaN: `200 {"score": null}` from /v1/graders:run):
    the caller trusted what the pipe held. Now the caller reads it as the grader's error."""
    (r,) = run_python(grader(body), [({}, {})], LIMITS)
    assert r.score is None and r.error == "runtime", r
    assert "finite number" in (r.detail or "") or "for 1 cases" in (r.detail or ""), r


def test_graders_run_names_a_nan_score_as_the_graders_error(boundary: Any, app_client: Any) -> None:
    source = grader(NON_FINITE["NaN on the pipe"])
    body = {"grader": {"type": "python", "name": "p", "source": source}, "items": [{"completion": "x"}]}
    r = app_client.post("/v1/graders:run", json=body, headers=admin_key(app_client))
    assert r.status_code == 200, r.text
    (row,) = r.json()["data"]
    assert row["score"] == 0.0 and "not a finite number (NaN)" in row["reason"] and r.json()["mean"] == 0.0, r.text


IN_A_TEMPORARY_DIRECTORY = r"""
import sys
sys.path[:0] = sys.argv[1:]
from evaluator.sandbox import SandboxLimits, isolation, run_python
iso = isolation("kernel")
print(iso.kernel, iso.refused)
print(run_python("def grade(s, i):\n    import sys\n    return float(sys.prefix.startswith('/tmp/'))", [({}, {})]))
"""


def test_a_python_installed_under_tmp_grades(boundary: Any, tmp_path: Path) -> None:
    """Issue 66.5: a clone in a temporary directory (its venv under /tmp) had every python grader
    refused: bwrap bound the venv read-only, then mounted the sandbox's private /tmp over it, and
    the 503 said "install bubblewrap". The tmpfs is mounted first now, the venv bound on top."""
    import sysconfig

    assert str(tmp_path).startswith("/tmp/"), tmp_path
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    paths = [str(Path(__file__).resolve().parents[3]), sysconfig.get_paths()["purelib"]]
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", IN_A_TEMPORARY_DIRECTORY, *paths],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["bwrap None", "[CaseResult(score=1.0, error=None, detail=None)]"], proc.stdout


def test_a_bwrap_that_cannot_start_says_why_not_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """bubblewrap is there and its probe failed: the refusal gives the probe's words and the fix for
    that cause, not "install bubblewrap"."""
    sandbox.forget_isolation()
    try:
        missing = "bwrap: execvp /opt/py/bin/python3: No such file or directory"
        monkeypatch.setattr(sandbox, "_probe", lambda *a: missing)
        iso = isolation("kernel")
        assert iso.refused and iso.refused.startswith("bubblewrap is installed, but the interpreter did not start")
        assert "No such file or directory" in iso.refused and "apt-get install bubblewrap" not in iso.refused, iso
        sandbox.forget_isolation()
        monkeypatch.setattr(sandbox, "_probe", lambda *a: "bwrap: No permissions to create new namespace")
        iso = isolation("kernel")
        assert iso.refused and "could not make the sandbox's namespaces" in iso.refused and "sysctl" in iso.refused
        assert "apt-get install bubblewrap" not in iso.refused, iso
    finally:
        sandbox.forget_isolation()


# Issue 66.6: three ways past the audit hook, each found contained by the kernel. Before: (a) ran a
# shell, (b) ran the library's constructor, (c) loaded a compiled module from the grader's directory,
# all with the hook on. Now the hook refuses (a) and (b) itself, and beneath it the kernel refuses all
# three: execve is in the filter's list, and the grader's directory is mounted noexec, so nothing it
# writes can be mapped executable. (c) reaches the loader the hook wraps, so only the kernel stops it.
DYNLOAD = (
    "import os, sys\nd = next(p for p in sys.path if p.endswith('lib-dynload'))\n"
    "def lib(name):\n    return os.path.join(d, next(f for f in os.listdir(d) if f.startswith(name + '.')))\n"
)
PAST_THE_HOOK = {
    "a module under another name": DYNLOAD
    + (
        "import importlib.util\n"
        "spec = importlib.util.spec_from_file_location('g._posixsubprocess', lib('_posixsubprocess'))\n"
        "m = importlib.util.module_from_spec(spec)\nr, w = os.pipe()\ner, ew = os.pipe()\n"
        "pid = m.fork_exec([b'/bin/sh', b'-c', b'echo shell-ran'], [b'/bin/sh'], True, tuple(sorted((w, ew))), None, "
        "None, -1, -1, -1, w, -1, w, er, ew, False, False, -1, None, None, None, -1, None, False)\n"
        "os.close(w)\nos.close(ew)\nos.waitpid(pid, 0)\nraise RuntimeError('OUT=' + os.read(r, 100).decode())"
    ),
    "a library it wrote": DYNLOAD
    + (
        "import ctypes, shutil\nshutil.copy(lib('_bisect'), 'evil.so')\nctypes.CDLL(os.path.abspath('evil.so'))\n"
        "raise RuntimeError('LOADED')"
    ),
    "the loader the hook wraps": DYNLOAD
    + (
        "import _imp, shutil, importlib.util\nshutil.copy(lib('_statistics'), '_statistics.so')\n"
        "cells = [c.cell_contents for c in getattr(_imp.create_dynamic, '__closure__', None) or ()]\n"
        "loader = next((c for c in cells if getattr(c, '__name__', '') == 'create_dynamic'), _imp.create_dynamic)\n"
        "loader(importlib.util.spec_from_file_location('_statistics', os.path.abspath('_statistics.so')))\n"
        "raise RuntimeError('LOADED')"
    ),
}
HOOK_SAYS = {
    "a module under another name": "_posixsubprocess.cpython",  # "loading .../_posixsubprocess... is not allowed"
    "a library it wrote": "may not load a library from its own directory",
    "the loader the hook wraps": "failed to map segment from shared object",  # the kernel's noexec, not the hook
}
KERNEL_SAYS = {
    "a module under another name": "RuntimeError: OUT=",  # fork_exec's child could not exec: no output
    "a library it wrote": "failed to map segment from shared object",
    "the loader the hook wraps": "failed to map segment from shared object",
}


@pytest.mark.parametrize("what", list(PAST_THE_HOOK))
def test_what_went_past_the_audit_hook_is_refused(boundary: Any, what: str) -> None:
    assert boundary.executable_dir is None, boundary.describe()  # noexec held here
    (hooked,) = run_python(grader(PAST_THE_HOOK[what]), [({}, {})], LIMITS)
    assert hooked.error == "runtime" and HOOK_SAYS[what] in (hooked.detail or ""), (what, hooked)
    (bare,) = run_python(grader(PAST_THE_HOOK[what]), [({}, {})], SandboxLimits(audit_hook=False))
    assert bare.error == "runtime" and KERNEL_SAYS[what] in (bare.detail or ""), (what, bare)
    assert "shell-ran" not in (bare.detail or "") and "LOADED" not in (bare.detail or ""), (what, bare)


def test_without_root_the_graders_directory_is_noexec_too(without_root: Any) -> None:
    """The harness makes a user and mount namespace of its own below bwrap's to remount its
    directory, then drops what that namespace gave it."""
    assert without_root.executable_dir is None, without_root.describe()
    body = PAST_THE_HOOK["a library it wrote"] + "\n"
    (r,) = run_python(grader(body), [({}, {})], SandboxLimits(audit_hook=False))
    caps = (
        "import ctypes, struct\nh = ctypes.create_string_buffer(struct.pack('@Ii', 0x20080522, 0))\n"
        "d = ctypes.create_string_buffer(24)\nctypes.CDLL(None).capget(h, d)\nraise RuntimeError(d.raw.hex())"
    )
    (c,) = run_python(grader(caps), [({}, {})], SandboxLimits(audit_hook=False))
    assert "failed to map segment from shared object" in (r.detail or ""), r
    assert c.detail == "RuntimeError: " + "0" * 48, c  # no capability kept from the namespace it made
