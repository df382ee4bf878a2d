"""The demo run again after an interrupted run (issue 44): what the earlier run left unfinished is
picked up or cancelled through the API, and the demo says which (service/demo.py `earlier_runs`).
The real routes, in-process; the jobs are parked (they ask for a GPU, and no worker runs here).
The whole story with real processes, a Ctrl-C and a closed terminal: tests/system/test_embedded.py."""

from __future__ import annotations

import io
import uuid
from typing import Any

import pytest
from rich.console import Console

from mathrl import client as sdk
from service.demo import earlier_runs
from tests.helpers.env import ADMIN_TOKEN, ROOT

pytestmark = pytest.mark.quick

PARKED = {"kind": "eval", "model": "org/model", "limit": 5, "resources": {"gpus": 1}}
SPEC = {"name": "demo: parked", "tags": ["demo"], "jobs": {"a": PARKED, "b": {**PARKED, "limit": 6}}}


def _client(app_client: Any, key: str) -> sdk.Client:
    from fastapi.testclient import TestClient

    c = sdk.Client("http://testserver", api_key=key)
    c.http.close()
    c.http = TestClient(app_client.app, headers=c.headers)
    return c


def _demo_project(app_client: Any) -> sdk.Client:
    key = _client(app_client, ADMIN_TOKEN).keys.create(project=f"demo-{uuid.uuid4().hex[:8]}").key
    return _client(app_client, key)


def test_the_newest_unfinished_run_of_the_same_spec_is_picked_up_and_the_rest_cancelled(app_client: Any) -> None:
    c = _demo_project(app_client)
    older = c.pipelines.create(SPEC)  # two runs interrupted before this one
    other = c.pipelines.create({**SPEC, "name": "demo: another pipeline file"})
    broken = c.pipelines.create(SPEC)
    c.jobs.cancel(next(j.job_id for j in broken.jobs if j.step == "a"))  # 'b' still queued: unfinished
    ended = c.pipelines.cancel(c.pipelines.create(SPEC).id)
    newest = c.pipelines.create(SPEC)
    lone = c.jobs.create(PARKED)  # an eval demo's job
    out = io.StringIO()

    picked = earlier_runs(Console(file=out, width=300), c, dict(SPEC))

    said = out.getvalue()
    assert picked is not None and picked.id == newest.id, said
    status = {p.id: p.status for p in c.pipelines.list()}
    assert status[newest.id] == "queued"
    assert [pid for pid, s in status.items() if s not in ("cancelled", "failed", "succeeded")] == [newest.id]
    for p, why in (
        (older, f"the newer pipeline {newest.id}, of the same spec, is picked up instead"),
        (other, "a different spec"),
        (broken, "its step 'a' was cancelled"),
    ):
        assert status[p.id] == "cancelled"
        assert f"cancelled pipeline {p.id} from an earlier run: {why}" in said, said
    assert ended.id not in said  # ended already: left alone, not mentioned
    assert c.jobs.retrieve(lone.id).status == "cancelled"
    assert f"cancelled eval job {lone.id} from an earlier run" in said

    out = io.StringIO()  # the eval demo picks nothing up: the same pipeline is cancelled then
    assert earlier_runs(Console(file=out, width=300), c, None) is None
    assert c.pipelines.retrieve(newest.id).status == "cancelled"
    assert f"cancelled pipeline {newest.id} from an earlier run: a different spec" in out.getvalue()


def test_a_spec_the_api_would_refuse_leaves_the_earlier_run_alone(app_client: Any) -> None:
    c = _demo_project(app_client)
    earlier = c.pipelines.create(SPEC)
    out = io.StringIO()
    assert earlier_runs(Console(file=out), c, {"jobs": {}}) is None
    assert c.pipelines.retrieve(earlier.id).status == "queued" and out.getvalue() == ""


# ---- issue 66.7: what a newcomer meets in the demo --------------------------------------------


def _progress(n: int, total: int, name: str, every: int = 1) -> list[tuple[int, int, str]]:
    """A phase's progress events as the worker's sink stores them: every `every` steps, and the last."""
    return [(d, total, f"{d}/{total} {name}") for d in range(1, total + 1) if d % every == 0 or d == total]


def _shown(job_id: str, events: list[tuple[int, int, str]], shown: Any = None) -> list[str]:
    from service.demo import ProgressShown

    shown = shown or ProgressShown()
    return [message for done, total, message in events if shown.show(job_id, message, done, total)]


def test_every_phase_of_a_job_prints_its_tenths_the_reward_models_training_as_often_as_sfts() -> None:
    """The demo's RM trained 762 steps and printed one progress line, at the very end: its sampling
    phase, counted first, had reached 10/10 and the job's training was never past it. SFT printed
    one every 50 of its 500 steps. Each phase of a job now prints its own tenths."""
    sft = _shown("sft", _progress(500, 500, "training", every=3))
    rm_events = _progress(2000, 2000, "sampling solutions", every=32) + _progress(762, 762, "training", every=5)
    rm = _shown("rm", rm_events)
    sft_training = [m for m in sft if m.endswith(" training")]
    rm_training = [m for m in rm if m.endswith(" training")]
    assert len(sft_training) == len(rm_training) == 10, (sft_training, rm_training)
    assert rm_training[0] == "80/762 training" and rm_training[-1] == "762/762 training", rm_training
    assert len([m for m in rm if m.endswith(" sampling solutions")]) == 10, rm
    # an eval's message carries its rate, which changes with every event: still one phase
    generating = [(d, 300, f"{d}/300 generating ({d / 7:.2f} problems/s)") for d in range(10, 301, 10)]
    assert len(_shown("eval", generating)) == 10


def test_the_sandbox_is_said_in_one_line_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo printed the sandbox's whole refusal, a paragraph of every remedy; now one line: the
    reason, what to do, and whether the demo needs python graders at all."""
    from evaluator import sandbox
    from service.demo import sandbox_line

    refused = sandbox.Isolation("none", (), "nobody", "bubblewrap (bwrap) is not installed: " + sandbox.INSTALL_HINT)
    monkeypatch.setattr(sandbox, "isolation", lambda mode="kernel": refused)
    line = sandbox_line({}, {"jobs": {"grpo": {"rewards": [{"name": "accuracy"}]}}})
    assert line == (
        "python graders: refused here (bubblewrap (bwrap) is not installed; "
        "as root, scripts/setup-sandbox installs it); this demo uses none"
    ), line
    graded = {"jobs": {"e": {"graders": [{"type": "python", "source": "def grade(s, i): return 1"}]}}}
    assert sandbox_line({}, graded).endswith("; this demo's jobs use them")
    probe = "could not make the sandbox's namespaces here (bwrap: setting up uid map: Permission denied)"
    refused = sandbox.Isolation(
        "none", (), "nobody", f"bubblewrap is installed, but it {probe}: {sandbox.INSTALL_HINT}"
    )
    monkeypatch.setattr(sandbox, "isolation", lambda mode="kernel": refused)
    line = sandbox_line({})
    assert line == (
        f"python graders: refused here (bubblewrap is installed, but it {probe}; "
        "what to do: docs/openai-rft.md, 'The python grader's sandbox')"
    ), line
    assert "sysctl" not in line and "\n" not in line


class _Stream:
    def __init__(self, tty: bool) -> None:
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_the_service_stays_up_at_a_terminal_and_a_pipe_or_ci_ends_with_the_command_that_brings_it_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The demo printed links to its pages and its API, then stopped the server they point to. At a
    terminal it now stays up until Ctrl-C; a pipe, a test or CI ends (the demo's system tests do), and
    either way it says the one command that brings the pages back."""
    from service import demo

    tty, pipe = (_Stream(True), _Stream(True)), (_Stream(True), _Stream(False))
    assert demo.at_terminal({}, tty) and not demo.at_terminal({}, pipe)
    assert not demo.at_terminal({"CI": "true"}, tty) and demo.at_terminal({"CI": "false"}, tty)
    assert demo.stays_up(None, at_terminal=True) and not demo.stays_up(None, at_terminal=False)
    assert demo.stays_up(True, at_terminal=False) and not demo.stays_up(False, at_terminal=True)

    assert demo.serve_command(demo.DEFAULT_HOME, 8000) == "scripts/demo --serve"
    assert demo.serve_command(tmp_path / "h", 8123) == f"scripts/demo --serve --home {tmp_path / 'h'} --port 8123"

    out = io.StringIO()
    monkeypatch.setattr(demo, "_block", lambda: pytest.fail("a pipe must not wait"))
    assert demo._finish(Console(file=out, width=300), 0.0, None, tmp_path / "h", 0) == 0  # a StringIO: no tty
    said = out.getvalue()
    assert "demo finished" in said and f"`scripts/demo --serve --home {tmp_path / 'h'}` brings them back" in said

    def ctrl_c() -> None:
        raise KeyboardInterrupt

    out = io.StringIO()
    monkeypatch.setattr(demo, "_block", ctrl_c)
    assert demo._finish(Console(file=out, width=300), 0.0, True, demo.DEFAULT_HOME, 8000) == 0
    said = out.getvalue()
    assert "stays up for the links above; Ctrl-C stops it" in said, said
    assert "`scripts/demo --serve` brings the pages and the API back" in said, said


def test_the_demos_options_say_whether_it_stays_up_and_serve_runs_no_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from service import demo
    from service.cli import app

    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(
        demo, "run_pipeline_demo", lambda home, port, quick, keep, pipe: calls.append(("demo", keep)) or 0
    )
    monkeypatch.setattr(demo, "run_serve", lambda home, port: calls.append(("serve", port)) or 0)
    runner = CliRunner()
    for args in ([], ["--keep-running"], ["--no-keep-running"], ["--serve", "--port", "8123"]):
        assert runner.invoke(app, ["demo", *args]).exit_code == 0, args
    assert calls == [("demo", None), ("demo", True), ("demo", False), ("serve", 8123)]


def _sandbox_setup(tmp_path: Any, uid: int, apt: str | None) -> Any:
    """scripts/setup-sandbox on a machine without bwrap: `uid` is who runs it, `apt` apt-get's
    body (None: no apt-get)."""
    import os
    import shutil
    import subprocess

    bin_dir = tmp_path / f"bin-{len(list(tmp_path.glob('bin-*')))}"
    bin_dir.mkdir()
    for tool in ("dirname", "date", "mkdir", "cat"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or tool)
    fakes = {"id": f"echo {uid}", **({"apt-get": apt} if apt is not None else {})}
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": str(bin_dir), "SETUP_LOG": str(tmp_path / "setup.log"), "HOME": os.environ.get("HOME", "/")}
    bash = shutil.which("bash") or "/bin/bash"
    return subprocess.run(
        [bash, str(ROOT / "scripts" / "setup-sandbox")], env=env, capture_output=True, text=True, timeout=30
    )


def test_the_sandbox_set_up_says_in_one_line_what_it_could_not(tmp_path: Any) -> None:
    """scripts/demo now runs scripts/setup-sandbox, as scripts/test does, and goes on where it fails."""
    r = _sandbox_setup(tmp_path, 1000, None)  # not root: nothing tried
    assert r.returncode == 0 and len(r.stderr.splitlines()) == 1 and "needs root" in r.stderr, r.stderr
    r = _sandbox_setup(tmp_path, 0, 'echo "E: Unable to locate package bubblewrap" >&2; exit 100')
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert f"apt-get install bubblewrap failed (its output: {tmp_path / 'setup.log'})" in r.stderr
    assert "Unable to locate" in (tmp_path / "setup.log").read_text()
    r = _sandbox_setup(tmp_path, 0, "echo installing")
    assert r.returncode == 0 and r.stderr.startswith("==> bubblewrap, the python grader's sandbox ("), r.stderr
    assert "scripts/setup-sandbox || true" in (ROOT / "scripts" / "demo").read_text()
