"""The python grader's system-call filter (seccomp), beneath its namespaces and its audit hook.

A deny list (DENIED): new namespaces, mounts, another program (execve), the keyring, eBPF, perf,
userfaultfd, io_uring, ptrace and the kernel's other rarer doors answer EPERM (clone3 ENOSYS),
sockets other than unix, IPv4 and IPv6 are refused, and a foreign architecture's calls kill the
process. The python tool's filter adds TOOL_DENIED, and each call's own filter keeps it to its own
processes (`own_process_calls`). `program` builds it with libseccomp (pyseccomp) as a classic BPF
program, which the harness (evaluator/sandbox_harness.py) loads before it drops to the sandbox's uid, in both
sandbox modes. Why a deny list, and what each refusal shuts: RELIABILITY.md,
"`evaluator/sandbox.py`: how the boundary is built"."""

from __future__ import annotations

import errno
import functools
import tempfile

from runtime.errors import SandboxUnavailable

# syscall: why a grader never needs it
DENIED: dict[str, str] = {
    **dict.fromkeys(("unshare", "setns"), "new or other namespaces (a user namespace gives every capability in it)"),
    **dict.fromkeys(
        (
            "mount",
            "umount2",
            "pivot_root",
            "chroot",
            "move_mount",
            "open_tree",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "mount_setattr",
        ),
        "mounts",
    ),
    **dict.fromkeys(("keyctl", "add_key", "request_key"), "the kernel keyring, not namespaced"),
    "bpf": "eBPF programs",
    "perf_event_open": "performance counters: a side channel, and a long list of kernel bugs",
    "userfaultfd": "page-fault handling in user space: what turns a kernel race into an exploit",
    **dict.fromkeys(("io_uring_setup", "io_uring_enter", "io_uring_register"), "io_uring, around seccomp"),
    **dict.fromkeys(
        ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd"), "other processes' memory"
    ),
    **dict.fromkeys(("open_by_handle_at", "name_to_handle_at"), "files by handle, past the mount namespace"),
    **dict.fromkeys(
        ("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot"), "the kernel itself"
    ),
    **dict.fromkeys(
        (
            "swapon",
            "swapoff",
            "acct",
            "quotactl",
            "quotactl_fd",
            "syslog",
            "vhangup",
            "iopl",
            "ioperm",
            "uselib",
            "sysfs",
            "ustat",
        ),
        "the machine's administration",
    ),
    **dict.fromkeys(
        ("settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname"),
        "the machine's clock and names",
    ),
    "personality": "another execution domain (READ_IMPLIES_EXEC and the like)",
    # the interpreter is running when the filter loads: a new program is only ever a shell or a binary
    # the grader wrote (a module loaded under another name reached _posixsubprocess.fork_exec past the hook)
    **dict.fromkeys(("execve", "execveat"), "running another program"),
    "fanotify_init": "watching the filesystem",
}
# clone(2) with any of these flags makes a namespace, as unshare does
CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
# calls newer than libseccomp 2.5 can name, by number: since Linux 5.1 a new call has one number on
# every architecture but alpha
NEWER_DENIED = {467: "open_tree_attr: mounts"}
# socket(2) families a grader may open: its own network namespace (bubblewrap's, or unshare -n)
# bounds IPv4 and IPv6 and abstract unix sockets, bubblewrap's filesystem the unix sockets with a path
# (audit-hook mode has no such filesystem: one reason it is for single-user installs); the rest
# (netlink, packet, vsock, tipc, rds, alg, ...) are kernel surface only
SOCKET_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10}
REFUSED = "could not load the system-call filter"  # what the harness says where the kernel refuses it
LOAD_HINT = (
    "python graders need a kernel with seccomp filters (CONFIG_SECCOMP_FILTER, on in distributions' kernels) "
    "and a container runtime that lets a process filter itself (Docker's and Kubernetes' default profiles do)"
)
INSTALL_HINT = "install libseccomp (Debian: apt-get install libseccomp2; the mathrl images carry it)"


# what the python tool's calls may not do besides (evaluator/python_tool.py): its calls run side by side
# in one sandbox, and these are the kernel's ways for one to reach another: sockets of any family (its
# loopback, abstract unix names) and System V / POSIX IPC objects
TOOL_DENIED = ("socket", "socketpair", "shmget", "msgget", "semget", "mq_open")

# what a tool call may do only to itself (arg 0: its own pid, 0, or its own group), and what it may not
# do at all (by a pid file descriptor, which a /proc directory's also is, or to a whole uid or group):
# the kernel lets a process signal, re-limit, renice and pin every other process of its uid, and the
# calls of a sandbox share its uid with each other and with the server that forks them. The harness
# adds this filter in each call's own process, where its pid is known (evaluator/sandbox_harness.py).
OWN_PROCESS_ONLY = (
    "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open", "prlimit64",
    "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr",
)  # fmt: skip
NO_OTHER_PROCESS = ("pidfd_send_signal", "process_madvise", "process_mrelease", "setpriority", "ioprio_set")


def own_process_calls() -> dict[str, list[int]]:
    """This machine's numbers of OWN_PROCESS_ONLY ('own') and NO_OTHER_PROCESS ('denied'), for the
    harness's per-call filter (nothing of mathrl or libseccomp is loaded there)."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError, RuntimeError) as e:
        raise SandboxUnavailable(f"the python tool's system-call filter needs libseccomp ({e}): {INSTALL_HINT}") from e

    def numbers(names: tuple[str, ...]) -> list[int]:
        found = (seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) for name in names)
        return [n for n in found if n >= 0]  # a call this architecture lacks resolves below 0

    return {"own": numbers(OWN_PROCESS_ONLY), "denied": numbers(NO_OTHER_PROCESS)}


@functools.lru_cache(maxsize=2)
def program(tool: bool = False) -> bytes:
    """The filter as a classic BPF program (struct sock_filter[]), for prctl(PR_SET_SECCOMP); `tool`:
    the python tool's, with TOOL_DENIED too. Raises SandboxUnavailable where libseccomp cannot be
    loaded: python graders and the tool fail closed."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError, RuntimeError) as e:  # pyseccomp raises RuntimeError without libseccomp.so
        raise SandboxUnavailable(
            f"the python grader's system-call filter needs libseccomp ({e}): {INSTALL_HINT}"
        ) from e
    f = seccomp.SyscallFilter(seccomp.ALLOW)
    f.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    refuse = seccomp.ERRNO(errno.EPERM)
    for name in [*DENIED, *NEWER_DENIED]:
        f.add_rule(refuse, name)
    flags = 1 if seccomp.system_arch() in (seccomp.Arch.S390, seccomp.Arch.S390X) else 0  # clone's flags argument
    for flag in CLONE_NAMESPACE_FLAGS.values():
        f.add_rule(refuse, "clone", seccomp.Arg(flags, seccomp.MASKED_EQ, flag, flag))
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    for name in TOOL_DENIED if tool else ():
        f.add_rule(refuse, name)
    allowed = [] if tool else sorted(SOCKET_FAMILIES.values())  # every other family: below, between and above them
    for low, high in zip([0, *(a + 1 for a in allowed)], [*allowed, None], strict=True):
        if high is None:
            f.add_rule(refuse, "socket", seccomp.Arg(0, seccomp.GE, low))
        else:
            for family in range(low, high):
                f.add_rule(refuse, "socket", seccomp.Arg(0, seccomp.EQ, family))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        bpf = out.read()
    if not bpf or len(bpf) % 8:
        raise SandboxUnavailable(f"libseccomp exported {len(bpf)} bytes, not a BPF program: {INSTALL_HINT}")
    return bpf


def why_unavailable() -> str | None:
    """None where the filter can be built here, else why not and what to install."""
    try:
        program()
    except SandboxUnavailable as e:
        return str(e)
    return None
