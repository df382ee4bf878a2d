"""The python tool a rollout calls: the model's code runs behind the python graders' kernel boundary
(evaluator/sandbox.py), in one warm sandbox per job that forks a fresh interpreter state for each
call (`PythonTool`).

A call replays its rollout's earlier code blocks (their output dropped), then runs its own: a clean
state plus its rollout's history. Calls run side by side (`parallel`), each its own process group,
kept to its own processes, killed at its timeout or past `max_output_chars`. The sandbox fails
closed (SandboxUnavailable); it runs here or in a grading pool (`PoolTool`,
service/grading_pool.py), and `job_tool` picks which. Why replay, and what a call can reach:
docs/tools.md, "What runs where"."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from evaluator import sandbox, sandbox_seccomp
from evaluator.sandbox import SandboxLimits, SandboxUnavailable, check_available
from evaluator.sandbox_uids import box_uid

# the server's own CPU seconds: it only forks and reads; past them it is started again
SERVER_CPU_SECONDS = 3600


@dataclass(frozen=True)
class ToolLimits:
    """One call's: wall seconds, what of its output comes back, and the sandbox's share of the machine."""

    timeout_s: float = 5.0
    max_output_chars: int = 1024
    parallel: int = 8  # calls at once in the sandbox
    memory_mb: int = 1024  # address space of the sandbox and each call
    # threads and processes of the sandbox's uid (RLIMIT_NPROC): the server and every call it runs
    processes: int = 32
    audit_hook: bool = True  # off only in the tests that show the kernel boundary holds by itself


@dataclass(frozen=True)
class ToolResult:
    output: str  # what the call printed (and its last expression's value, or its error's last line)
    # None, 'timeout', 'output_limit', 'cpu_limit', 'killed ...', 'process_limit' (it could not start) or 'sandbox'
    error: str | None = None
    seconds: float = 0.0  # from its batch's start to its answer

    def text(self, limits: ToolLimits) -> str:
        """What the rollout reads back: the output, cut at max_output_chars, with why it stopped."""
        out = self.output[: limits.max_output_chars]
        if self.error == "timeout":
            out += f"\nTimeoutError: the code ran over {limits.timeout_s:g} s and was stopped"
        elif self.error == "output_limit" or len(self.output) > limits.max_output_chars:
            out += f"\n[output cut at {limits.max_output_chars} characters]"
        elif self.error == "process_limit":
            out += f"\nError: the code did not run: the sandbox's {limits.processes} processes were all in use"
        elif self.error is not None:
            out += f"\nError: the code was stopped ({self.error})"
        return out.strip("\n")


def raised(output: str) -> bool:
    """Whether a call's output ends with an exception's line (the harness prints its last line)."""
    last = output.strip().splitlines()[-1:] or [""]
    head = last[0].split(":", 1)[0]
    return head.endswith(("Error", "Exception")) or head in ("KeyboardInterrupt", "SystemExit")


class Tool(Protocol):
    """What a rollout calls: `run(calls)` answers a batch of (code, history) calls, each in a fresh
    state, in the calls' order; `close()` ends it. PythonTool on this machine, PoolTool in a grading pool."""

    limits: ToolLimits

    def run(self, calls: list[tuple[str, list[str]]]) -> list[ToolResult]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Tool: ...

    def __exit__(self, *exc: object) -> None: ...


def batch_deadline(limits: ToolLimits, n: int) -> float:
    """The longest a batch of `n` calls may take before its sandbox is taken for stuck: their timeouts in
    `parallel` lanes, and a margin for starting."""
    rounds = -(-n // max(1, limits.parallel))
    return rounds * (limits.timeout_s + 1.0) + 30.0


class PythonTool:
    """A warm tool sandbox: `run(calls)` answers a batch of (code, history) calls, each in a fresh
    state. Started on first use, started again when it died; `close()` ends it. Thread-safe."""

    def __init__(self, limits: ToolLimits = ToolLimits()):
        self.limits = limits
        self._proc: subprocess.Popen[bytes] | None = None
        self._uid = contextlib.ExitStack()  # the uid its sandbox runs as, held while it runs (root only)
        self._lock = threading.Lock()
        self._next = 0

    def __enter__(self) -> PythonTool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
            sandbox._kill_group(proc)
            proc.wait()
        self._uid.close()

    def _start(self) -> subprocess.Popen[bytes]:
        check_available("kernel")
        cmd = [*sandbox._bwrap_prefix(1, writable=False), sys.executable, "-I", "-B", sandbox.INSIDE_HARNESS]
        request = {
            "limits": {
                "cpu_seconds": SERVER_CPU_SECONDS,
                "memory_mb": self.limits.memory_mb,
                "file_mb": 0,
                "processes": self.limits.processes,
            },
            # its own: what its calls fork counts against it alone (RLIMIT_NPROC counts a uid's processes)
            "uid": self._uid.enter_context(box_uid()),
            "seccomp": _tool_seccomp(),
            "tool": {
                "timeout_s": self.limits.timeout_s,
                "max_output_bytes": 4 * self.limits.max_output_chars + 4,  # UTF-8's most per character
                "parallel": self.limits.parallel,
                "own_process_calls": sandbox_seccomp.own_process_calls(),
            },
        }
        proc = subprocess.Popen(
            cmd,
            env=sandbox._env(sandbox.WORKDIR),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(request).encode() + b"\n")
        proc.stdin.flush()
        return proc

    def run(self, calls: list[tuple[str, list[str]]]) -> list[ToolResult]:
        """Each (code, history): `code` run after its rollout's earlier blocks `history`, in a state of
        its own. Results in the calls' order. A sandbox that dies answers its open calls with error
        'sandbox' and is started again on the next run."""
        if not calls:
            return []
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self.close()
                self._proc = self._start()
            proc = self._proc
            base, self._next = self._next, self._next + len(calls)
            started, hook = time.monotonic(), self.limits.audit_hook
            rows = [
                {"id": base + i, "code": code, "history": list(history), "audit_hook": hook}
                for i, (code, history) in enumerate(calls)
            ]
            lines = b"".join(json.dumps(row).encode() + b"\n" for row in rows)
            results: dict[int, ToolResult] = {}
            try:
                _feed_and_read(proc, lines, base, len(calls), results, started, self._deadline(len(calls)))
            except (OSError, ValueError, TimeoutError):
                self.close()
            return [results.get(base + i, ToolResult("", "sandbox")) for i in range(len(calls))]

    def _deadline(self, n: int) -> float:
        return time.monotonic() + batch_deadline(self.limits, n)


def _feed_and_read(
    proc: subprocess.Popen[bytes],
    lines: bytes,
    base: int,
    n: int,
    results: dict[int, ToolResult],
    started: float,
    deadline: float,
) -> None:
    """Write the calls (a thread: the server answers while it reads) and read their answers, as
    untrusted lines: an id of this batch that has no answer yet, an output string, an error string."""
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def feed() -> None:
        try:
            stdin.write(lines)
            stdin.flush()
        except OSError:
            pass

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    fd, buf = stdout.fileno(), b""
    while len(results) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the tool sandbox did not answer")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise OSError("the tool sandbox ended")
        buf += chunk
        *answers, buf = buf.split(b"\n")
        for line in answers:
            row = json.loads(line)
            call = row.get("id") if isinstance(row, dict) else None
            if not isinstance(call, int) or not base <= call < base + n or call in results:
                raise ValueError("the tool sandbox wrote an answer to no call of this batch")
            results[call] = _result(row, time.monotonic() - started)
    feeder.join(5)


def _result(row: dict[str, Any], seconds: float) -> ToolResult:
    """An untrusted answer as a ToolResult: an output string, an error string or None."""
    output, error = row.get("output"), row.get("error")
    return ToolResult(
        output if isinstance(output, str) else "",
        error if isinstance(error, str) or error is None else "sandbox",
        seconds,
    )


class PoolTool:
    """The python tool in a grading pool (service/grading_pool.py, POST /v1/tool): on Kubernetes,
    where the workers' pods may not make bubblewrap's namespaces. A call replays its history, so a
    batch needs no state between requests; the pool keeps this job's warm sandbox under a key of its
    own (`key`), which no other job's calls share, and ends it on `close()`."""

    def __init__(self, url: str, token: str | None, limits: ToolLimits):
        import httpx

        self.limits, self.url, self.key = limits, url.rstrip("/"), secrets.token_hex(16)
        self._http = httpx.Client(headers={"Authorization": f"Bearer {token}"} if token else {})

    def __enter__(self) -> PoolTool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _body(self) -> dict[str, Any]:
        limits = {"timeout_s": self.limits.timeout_s, "max_output_chars": self.limits.max_output_chars}
        return {"key": self.key, "limits": limits | {"memory_mb": self.limits.memory_mb}}

    def run(self, calls: list[tuple[str, list[str]]]) -> list[ToolResult]:
        """As PythonTool.run. A pool that cannot sandbox raises SandboxUnavailable (its 503); one that
        does not answer, or answers what is not this batch's results, answers each call 'sandbox'."""
        import httpx

        if not calls:
            return []
        body = self._body() | {"calls": [{"code": code, "history": list(history)} for code, history in calls]}
        failed = [ToolResult("", "sandbox")] * len(calls)
        started = time.monotonic()
        try:
            r = self._http.post(f"{self.url}/v1/tool", json=body, timeout=batch_deadline(self.limits, len(calls)))
        except httpx.HTTPError:
            return failed
        try:
            answer = r.json()
        except ValueError:
            answer = None
        if r.status_code == 503:
            why = answer.get("detail", r.text) if isinstance(answer, dict) else r.text[:500]
            raise SandboxUnavailable(f"the grading pool cannot run the python tool: {why}")
        rows = answer.get("results") if r.status_code == 200 and isinstance(answer, dict) else None
        if not isinstance(rows, list) or len(rows) != len(calls) or not all(isinstance(x, dict) for x in rows):
            return failed
        seconds = time.monotonic() - started
        return [_result(row, seconds) for row in rows]

    def close(self) -> None:
        import httpx

        try:
            self._http.post(f"{self.url}/v1/tool/close", json={"key": self.key}, timeout=10)
        except httpx.HTTPError:
            pass  # the pool ends an idle job's sandbox itself
        self._http.close()


def _tool_seccomp() -> str:
    import base64

    return base64.b64encode(sandbox_seccomp.program(tool=True)).decode()


def job_tool(timeout_s: float, max_output_chars: int, sandbox: SandboxLimits | None) -> Tool:
    """The job's tool sandbox, within the operator's graders settings: behind this machine's kernel
    boundary, or in the grading pool where the operator runs python there (`graders.pool_url`, the
    chart's `grading` block); audit-hook mode is refused (the calls need the sandbox's namespaces)."""
    limits = sandbox or SandboxLimits()
    tool = ToolLimits(timeout_s=timeout_s, max_output_chars=max_output_chars, memory_mb=limits.memory_mb)
    if limits.pool_url:
        return PoolTool(limits.pool_url, limits.pool_token, tool)
    if limits.mode != "kernel":
        raise SandboxUnavailable(
            f"the python tool runs only behind a kernel boundary, not in graders.python_sandbox={limits.mode!r}"
        )
    return PythonTool(tool)
