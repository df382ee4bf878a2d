"""The python tool a rollout calls (evaluator/python_tool.py, issue 67.3): hostile code written by a
model, held as a hostile grader is, in one warm sandbox whose calls each start from a clean state.
Each harm is tried with the audit hook on and, where the kernel is the claim, with it off."""

from __future__ import annotations

import json
import os
import textwrap
import threading
import time
from typing import Any

import pytest

from evaluator.python_tool import PythonTool, ToolLimits
from tests.unit.evaluator.test_sandbox import boundary, sandbox_uid, targets  # noqa: F401  (the fixtures)

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def tool(boundary: Any) -> Any:  # noqa: F811
    with PythonTool(ToolLimits(timeout_s=3, max_output_chars=200, parallel=4)) as t:
        yield t


@pytest.fixture(scope="module")
def bare(boundary: Any) -> Any:  # noqa: F811
    """The same sandbox with the audit hook switched off, as if code had got past it."""
    with PythonTool(ToolLimits(timeout_s=3, max_output_chars=2000, parallel=4, audit_hook=False)) as t:
        yield t


def test_each_call_starts_clean_and_replays_its_own_rollouts_history(tool: Any) -> None:
    a, b, c, d = tool.run(
        [
            ("import builtins\nbuiltins.SHARED = 1\nx = 5\nx * 2", []),
            ("print(getattr(__import__('builtins'), 'SHARED', 'clean'))\n'x' in globals()", []),
            ("x += 1\nx", ["x = 41", "print('history prints are dropped')"]),
            ("total(3)", ["def total(n):\n    return sum(range(n + 1))"]),
        ]
    )
    assert (a.output, a.error) == ("10\n", None), a
    assert b.output == "clean\nFalse\n", b  # nothing of another call, not even through builtins
    assert c.output == "42\n" and d.output == "6\n", (c, d)
    (e,) = tool.run([("print(getattr(__import__('builtins'), 'SHARED', 'clean'))", [])])
    assert e.output == "clean\n", e  # nor of an earlier batch


def test_an_error_is_the_calls_output_and_never_runs_as_root(tool: Any) -> None:
    err, who = tool.run([("1/0", []), ("import os\nos.getuid(), os.geteuid()", [])])
    assert err.output == "ZeroDivisionError: division by zero\n" and err.error is None, err
    uid, euid = json.loads(who.output.replace("(", "[").replace(")", "]"))
    assert uid == euid and sandbox_uid(uid), who


def test_a_call_that_hangs_ends_at_its_timeout_and_stalls_no_other(tool: Any) -> None:
    t0 = time.monotonic()
    calls = [("while True:\n    pass", []), ("import time\ntime.sleep(60)", [])] + [("print('ok')", [])] * 12
    results = tool.run(calls)
    took = time.monotonic() - t0
    assert [r.error for r in results[:2]] == ["timeout", "timeout"], results[:2]
    assert all(r.output == "ok\n" and r.error is None for r in results[2:]), results[2:]
    assert took < 3 + 5, took  # the two hung calls in two of the four lanes, the rest beside them
    assert "TimeoutError: the code ran over 3 s" in results[0].text(tool.limits)


def test_huge_prints_memory_and_fork_bombs_are_bounded(tool: Any, bare: Any) -> None:
    huge, memory = tool.run([("while True:\n    print('x' * 10000)", []), ("b = bytearray(4 << 30)", [])])
    assert huge.error == "output_limit" and len(huge.output) <= 4 * 200 + 4, (huge.error, len(huge.output))
    assert huge.text(tool.limits).endswith("[output cut at 200 characters]")
    assert "MemoryError" in memory.output, memory
    bomb = "import os\nfor _ in range(10000):\n    if os.fork() == 0:\n        import time; time.sleep(30)"
    (forked,) = bare.run([(bomb, [])])
    assert forked.error == "timeout", forked  # RLIMIT_NPROC
    (after,) = tool.run([("print('still serving')", [])])  # the bomb's group was killed with its call
    assert after.output == "still serving\n", after


def test_a_fork_bomb_holds_its_own_sandboxs_processes_and_no_other_sandboxs(boundary: Any) -> None:  # noqa: F811
    """RLIMIT_NPROC counts a uid's processes on the whole machine. While every sandbox ran as nobody, a
    call's fork bomb, held until its timeout, left every other sandbox here unable to fork: CI's stop 77
    failed on an eval whose tool calls all answered 'sandbox' beside this file's bomb. Each sandbox runs
    as a uid of its own now (evaluator/sandbox_uids.py); in the bomb's own sandbox, the calls that cannot
    start wait for the bomb's end, where before the server died and took them all with it."""
    # every process it can get, held until its timeout: it takes each one that comes free, as it comes
    bomb = "import os, time\nwhile True:\n    try:\n        if os.fork() == 0:\n            time.sleep(30)\n"
    bomb += "    except BlockingIOError:\n        pass"
    got: list[Any] = []
    with PythonTool(ToolLimits(timeout_s=3, parallel=2, audit_hook=False)) as bombed, PythonTool() as other:
        # beside the bomb, a call that ends once the bomb holds every process: the next cannot fork then
        calls = [(bomb, []), ("import time\ntime.sleep(1)\nprint('after')", [])] + [("print('after')", [])] * 3
        held = threading.Thread(target=lambda: got.extend(bombed.run(calls)))
        held.start()
        time.sleep(1.5)  # the bomb holds all of its sandbox's processes by now
        (beside,) = other.run([("print(17 * 23)", [])])
        held.join(60)
    assert (beside.output, beside.error) == ("391\n", None), beside
    forked, *after = got
    assert forked.error == "timeout", forked
    assert [(r.output, r.error) for r in after] == [("after\n", None)] * 4, after


def test_what_a_call_left_outside_its_group_is_ended_once_it_holds_the_sandboxs_processes(boundary: Any) -> None:  # noqa: F811
    """A call's children that make sessions of their own outlive the kill of its group. Holding the
    sandbox's processes, they left every later call unable to start (answered `process_limit`, the
    server alive): the server now ends every process of its uid in its namespace, then forks."""
    escape = textwrap.dedent(
        """
        import os, time
        def hold():
            os.setsid()  # a session, and a group, of its own
            os.close(1), os.close(2)
            time.sleep(0.5)  # then the place its parent leaves, once the call ends
            try:
                if os.fork() == 0:
                    time.sleep(60)
            except BlockingIOError:
                pass
            time.sleep(60)
        for _ in range(64):
            try:
                if os.fork() == 0:
                    hold()
            except BlockingIOError:
                break
        print('left')
        """
    )
    with PythonTool(ToolLimits(timeout_s=3, parallel=2, audit_hook=False)) as tool:
        (left,) = tool.run([(escape, [])])
        time.sleep(1.5)  # every process of the sandbox held
        (after,) = tool.run([("print('after')", [])])
    assert (left.output, left.error) == ("left\n", None), left
    assert (after.output, after.error) == ("after\n", None), after


WRITES = """
import errno, os
seen = []
for path in ('/tmp/x', 'x', '/dev/shm/x', '/x', '/sandbox/x'):
    try:
        open(path, 'w').write('x')
        seen.append('written ' + path)
    except OSError as e:
        seen.append(errno.errorcode.get(e.errno, str(e.errno)))
print(seen)
"""
CHANNELS = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
seen = {}
for name, args in (("unix", (1, 1, 0)), ("inet", (2, 1, 0)), ("inet6", (10, 2, 0))):
    seen[name] = libc.socket(*args), ctypes.get_errno()
seen["socketpair"] = libc.socketpair(1, 1, 0, ctypes.byref((ctypes.c_int * 2)())), ctypes.get_errno()
seen["shmget"] = libc.shmget(0, 4096, 0o1666), ctypes.get_errno()
seen["msgget"] = libc.msgget(0, 0o1666), ctypes.get_errno()
print(json.dumps(seen))
"""


def test_no_call_can_write_anywhere_or_reach_another_call(tool: Any, bare: Any) -> None:
    """Calls run side by side in one sandbox: no file, socket or IPC object one makes can another see."""
    import ast

    (hooked,) = tool.run([(WRITES, [])])
    assert not any(s.startswith("written") for s in ast.literal_eval(hooked.output)), hooked  # the hook's refusal
    (w,) = bare.run([(WRITES, [])])
    assert ast.literal_eval(w.output) == ["EROFS"] * 5, w  # and the kernel's: the whole sandbox is read-only
    (c,) = bare.run([(CHANNELS, [])])
    seen = json.loads(c.output)
    assert all(result == [-1, 1] for result in seen.values()), seen  # each EPERM: the tool's filter


SIBLINGS = """
import ctypes, errno, json, os, resource, signal
libc = ctypes.CDLL(None, use_errno=True)
me, seen = os.getpid(), {}
def tried(name, f):
    try:
        f()
        seen.setdefault(name, []).append('done')
    except OSError as e:
        seen.setdefault(name, []).append(errno.errorcode.get(e.errno, str(e.errno)))
for pid in [p for p in range(1, 200) if p != me]:  # the sandbox's pid namespace: its server, the calls beside
    tried('prlimit', lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (0, 0)))
    tried('affinity', lambda: os.sched_setaffinity(pid, {0}))
    tried('nice', lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))
    tried('pidfd', lambda: os.close(os.pidfd_open(pid)))
    tried('kill', lambda: os.kill(pid, signal.SIGKILL))
tried('nice', lambda: os.setpriority(os.PRIO_USER, os.getuid(), 19))
tried('killall', lambda: os.kill(-1, signal.SIGKILL))
tried('own', lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)))
tried('own', lambda: resource.prlimit(me, resource.RLIMIT_CPU, resource.getrlimit(resource.RLIMIT_CPU)))
tried('own', lambda: os.kill(me, 0))
tried('own', lambda: os.killpg(0, 0))
print(json.dumps({k: sorted(set(v)) for k, v in seen.items()}))
"""


def test_no_call_can_signal_or_limit_a_call_beside_it_or_the_server(bare: Any) -> None:
    """Calls share a uid, which the kernel lets signal, renice, re-limit and pin one another: the
    filter each call adds takes every such call to another process (the kernel alone: no audit hook)."""
    victims = [("import time\ntime.sleep(1.5)\nprint('alive')", [])] * 2
    *lived, attack = bare.run([*victims, (SIBLINGS, [])])
    seen = json.loads(attack.output)
    assert all((r.output, r.error) == ("alive\n", None) for r in lived), lived
    assert all(seen[k] == ["EPERM"] for k in ("prlimit", "affinity", "nice", "pidfd", "kill", "killall")), seen
    assert seen["own"] == ["done"], seen  # what it does to itself and its own group is left alone
    (after,) = bare.run([("print('still serving')", [])])
    assert after.output == "still serving\n", after


PROBE = """
import errno, json, os, signal
seen = {}
def read(path):
    try:
        return open(path).read()
    except OSError as e:
        return 'refused: ' + errno.errorcode.get(e.errno, str(e.errno))
seen['other'] = read(T['other'])
seen['secret'] = read(T['secret'])
seen['proc'] = os.path.exists('/proc')
try:
    os.kill(T['victim'], signal.SIGKILL)
    seen['kill'] = 'sent'
except OSError as e:
    seen['kill'] = errno.errorcode.get(e.errno, e.errno)
import _posixsubprocess
r, w = os.pipe()
er, ew = os.pipe()
pid = _posixsubprocess.fork_exec(
    [b'/bin/sh', b'-c', b'id -u'], [b'/bin/sh'], True, tuple(sorted((w, ew))), None, None,
    -1, -1, -1, w, -1, w, er, ew, False, False, -1, None, None, None, -1, None, False,
)
os.close(w)
os.close(ew)
os.waitpid(pid, 0)
seen['shell'] = os.read(r, 100).decode()
print(json.dumps(seen))
"""


def test_the_kernel_boundary_holds_for_a_call_without_the_audit_hook(bare: Any, targets: dict[str, Any]) -> None:  # noqa: F811
    (r,) = bare.run([(f"T = {json.dumps(targets)}\n" + PROBE, [])])
    seen = json.loads(r.output)
    assert seen["other"].startswith("refused") and seen["secret"].startswith("refused"), seen
    # the call's filter refuses any other pid (EPERM) before the pid namespace would (ESRCH)
    assert not seen["proc"] and seen["kill"] == "EPERM" and seen["shell"] == "", seen
    assert os.waitpid(targets["victim"], os.WNOHANG) == (0, 0)


def test_the_audit_hook_refuses_for_a_call_as_for_a_grader(tool: Any) -> None:
    results = tool.run(
        [
            ("import _posixsubprocess", []),
            ("import subprocess\nsubprocess.run(['id'])", []),
            ("import socket\nsocket.socket()", []),
            ("open('/proc/1/environ')", []),
        ]
    )
    assert all("not allowed" in r.output or "may not" in r.output for r in results), results


def test_a_sandbox_that_dies_answers_its_calls_and_is_started_again(tool: Any) -> None:
    proc = tool._proc
    assert proc is not None
    proc.kill()
    proc.wait()
    (r,) = tool.run([("print('back')", [])])
    assert r.output == "back\n", r
