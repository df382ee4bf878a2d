"""The grading pool (service/grading_pool.py): a real `mathrl-server grading-pool` process that
runs python graders for callers presenting its token, sandboxed in its own mode, and the
sandbox's client (evaluator.sandbox.run_python with pool_url) that the API and workers use."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from evaluator.sandbox import SandboxLimits, SandboxUnavailable, isolation, run_python
from tests.helpers.env import free_port
from tests.helpers.processes import wait_for
from tests.unit.evaluator.test_sandbox import sandbox_uid

pytestmark = pytest.mark.quick
TOKEN = "pool-token-for-tests"


def _pool(env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "grading-pool", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            return httpx.get(f"{url}/livez", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, timeout=60, what="the grading pool")
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def pool() -> Iterator[str]:
    # what a pool pod gets: its token and its mode, nothing of the database, broker or admin
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATHRL_")}
    yield from _pool({**env, "MATHRL_GRADERS__POOL_TOKEN": TOKEN})


def test_the_pool_runs_graders_for_its_callers_only(pool: str) -> None:
    if isolation("kernel").refused:
        pytest.skip(f"no kernel boundary here: {isolation('kernel').refused}")
    assert "kernel boundary" in httpx.get(f"{pool}/readyz").json()["sandbox"]
    body = {"source": "def grade(sample, item):\n    return 0.5", "cases": [{"sample": {}, "item": {}}]}
    assert httpx.post(f"{pool}/v1/run", json=body).status_code == 401
    assert httpx.post(f"{pool}/v1/run", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    limits = SandboxLimits(pool_url=pool, pool_token=TOKEN)
    src = "def grade(sample, item):\n    import os\n    return float(len(item['x'])) + os.getuid()"
    (r,) = run_python(src, [({}, {"x": "abc"})], limits)
    assert r.score is not None and sandbox_uid(int(r.score) - 3), r  # as the sandbox's user, never root
    exploit = "def grade(sample, item):\n    import _posixsubprocess"
    (r,) = run_python(exploit, [({}, {})], limits)
    assert r.error == "runtime" and "_posixsubprocess is not allowed" in (r.detail or ""), r
    (r,) = run_python(
        "def grade(s, i):\n    while True:\n        pass",
        [({}, {})],
        SandboxLimits(cpu_seconds=1, pool_url=pool, pool_token=TOKEN),
    )
    assert r.error == "server" and "cpu_limit" in (r.detail or ""), r
    r = httpx.post(
        f"{pool}/v1/run", json={**body, "limits": {"cpu_seconds": 10**6}}, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert r.status_code == 422, r.text


def test_the_pool_runs_a_jobs_python_tool_calls_in_a_sandbox_of_its_own(pool: str) -> None:
    """Where the workers cannot make namespaces (the chart's pods), the tool's calls go to the pool:
    a batch as on a worker (a fresh state a call, its history replayed, a hung call stopped, as
    the sandbox's user), each job's calls in a warm sandbox of their own, which `close` ends."""
    if isolation("kernel").refused:
        pytest.skip(f"no kernel boundary here: {isolation('kernel').refused}")
    from evaluator.python_tool import PoolTool, job_tool

    limits = SandboxLimits(pool_url=pool, pool_token=TOKEN)
    with job_tool(2, 200, limits) as tool, job_tool(2, 200, limits) as other:
        assert isinstance(tool, PoolTool) and tool.key != other.key
        fresh, replayed, hung, who = tool.run(
            [
                ("import builtins\nbuiltins.SHARED = 1\nprint('set')", []),
                ("x += 1\nx", ["x = 41"]),
                ("while True:\n    pass", []),
                ("import os\nos.getuid()", []),
            ]
        )
        assert (fresh.output, replayed.output) == ("set\n", "42\n") and sandbox_uid(int(who.output)), (
            fresh,
            replayed,
            who,
        )
        assert hung.error == "timeout" and "TimeoutError" in hung.text(tool.limits), hung
        (clean,) = other.run([("print(getattr(__import__('builtins'), 'SHARED', 'clean'))", [])])
        assert clean.output == "clean\n", clean
    body = {"key": "0" * 32, "calls": [{"code": "print(1)"}]}
    assert httpx.post(f"{pool}/v1/tool", json=body).status_code == 401  # its callers only
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.post(f"{pool}/v1/tool", json={**body, "limits": {"timeout_s": 10**6}}, headers=auth)
    assert r.status_code == 422, r.text  # the spec's bounds
    assert httpx.post(f"{pool}/v1/tool", json={**body, "key": "../x"}, headers=auth).status_code == 422
    with pytest.raises(SandboxUnavailable, match="kernel boundary, not in graders.python_sandbox='audit-hook'"):
        job_tool(2, 200, SandboxLimits(mode="audit-hook"))  # no pool: the hook alone never holds the tool


def test_a_tool_sandbox_in_use_is_never_ended_for_others_past_the_most_held() -> None:
    """The pool keeps at most `most` warm tool sandboxes, ending the least recently used: one whose
    job's batch was still running was ended under it (its calls then all answered 'sandbox'). A
    sandbox in use is passed over, and the idle ones are ended in its place."""
    if isolation("kernel").refused:
        pytest.skip(f"no kernel boundary here: {isolation('kernel').refused}")
    from evaluator.python_tool import ToolLimits
    from service.grading_pool import ToolSandboxes

    sandboxes, limits = ToolSandboxes(most=1), ToolLimits(timeout_s=5)
    try:
        with sandboxes.using("long", limits) as long:
            (first,) = long.run([("print('started')", [])])
            others = []
            for key in ("a", "b", "c"):  # other jobs' batches, each past `most`, while 'long' runs
                with sandboxes.using(key, limits) as other:
                    assert [r.output for r in other.run([(f"print('{key}')", [])])] == [f"{key}\n"]
                others.append(other)
            assert ("long", limits) in sandboxes.held and long._proc is not None  # not ended under its call
            (second,) = long.run([("print('still')", [])])
            assert (first.output, second.output) == ("started\n", "still\n"), (first, second)
            assert all(o._proc is None for o in others)  # each ended once idle: the one in use held the room
        assert list(sandboxes.held) == [("long", limits)]  # within `most` again
        with sandboxes.using("d", limits):
            pass
        assert list(sandboxes.held) == [("d", limits)] and long._proc is None  # idle, least recently used: ended
    finally:
        sandboxes.close()


def test_a_pool_that_cannot_sandbox_is_not_ready_and_refuses() -> None:
    """Fails closed: a pool whose machine has no bubblewrap says so on /readyz and to every call."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATHRL_")}
    env["PATH"] = os.path.dirname(sys.executable)  # python, and no bwrap
    for url in _pool({**env, "MATHRL_GRADERS__POOL_TOKEN": TOKEN}):
        ready = httpx.get(f"{url}/readyz")
        assert ready.status_code == 503 and "bubblewrap" in ready.text, ready.text
        with pytest.raises(SandboxUnavailable, match="bubblewrap"):
            run_python("def grade(s, i):\n    return 1", [({}, {})], SandboxLimits(pool_url=url, pool_token=TOKEN))
        from evaluator.python_tool import job_tool

        with pytest.raises(SandboxUnavailable, match="grading pool cannot run the python tool.*bubblewrap"):
            with job_tool(2, 200, SandboxLimits(pool_url=url, pool_token=TOKEN)) as tool:
                tool.run([("print(1)", [])])


def test_an_unreachable_pool_is_a_server_error_not_a_score(tmp_path: Any) -> None:
    (r,) = run_python(
        "def grade(s, i):\n    return 1", [({}, {})], SandboxLimits(pool_url=f"http://127.0.0.1:{free_port()}")
    )
    assert r.score is None and r.error == "server" and "did not answer" in (r.detail or ""), r
