"""Jobs forked from a worker's fork server (worker/job_forkserver.py): a forked job is the
process a fresh `python -m worker.child` would be (its own session, the job's environment, its
log), and it dies with the server as a started job dies with its worker; a server that died is
started again, and jobs go on meanwhile (as fresh processes)."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from subprocess import Popen

import pytest

from tests.helpers.jobs import eval_spec
from tests.helpers.processes import child_pid, pid_alive, wait_for
from tests.helpers.service import Service

pytestmark = pytest.mark.slow
POOL = "forked"


@pytest.fixture(scope="module")
def forking_worker(service: Service) -> Iterator[Popen[bytes]]:
    """A worker of its own pool: the fork server found under it is this test's."""
    worker = service.start_worker(queues=POOL, name="forker")
    yield worker
    service.stop_worker(worker)


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return [str(pid), "comm", *text[text.rindex(")") + 2 :].split()]  # pid, comm, state, ppid, pgrp, session


def _fork_server(worker: Popen[bytes]) -> int | None:
    """The fork server under the worker's process tree, if it runs."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes().split(b"\0")
            ancestor = int(d.name)
            for _ in range(4):  # the worker's process or one below it started the server
                ancestor = int(_stat(ancestor)[3])
                if ancestor == worker.pid:
                    break
        except (OSError, ValueError, IndexError):
            continue
        if b"worker.job_forkserver" in cmdline and ancestor == worker.pid:
            return int(d.name)
    return None


def _ready_server(service: Service, worker: str, after: int | None = None) -> int | None:
    """The pid of the worker's newest fork server that said it was ready (and is not `after`)."""
    log = (service.logs / f"worker-{worker}.log").read_text()
    ready = [int(pid) for pid in re.findall(r"job fork server (\d+) ready", log)]
    return ready[-1] if ready and ready[-1] != after else None


def _long_eval(model: str) -> dict[str, object]:
    return eval_spec(model, limit=400, batch_size=2, sampling={"max_new_tokens": 400}, resources={"pool": POOL})


def test_a_forked_job_is_a_job_process_and_dies_with_its_server(
    service: Service, forking_worker: Popen[bytes], tiny_model: str
) -> None:
    c = service.client()
    server = wait_for(lambda: _ready_server(service, "forker"), 120, 0.5, "the worker's fork server to be ready")
    assert _fork_server(forking_worker) == server
    job = c.jobs.create(_long_eval(tiny_model))
    pid = child_pid(c, job.id)
    stat = _stat(pid)
    assert int(stat[3]) == server, (stat, server)  # forked from the server
    assert int(stat[5]) == pid  # a session (so a process group) of its own: a cancel reaches what it starts
    environ = dict(e.split("=", 1) for e in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in e)
    assert environ["MATHRL_DATABASE__URL"] == service.env["MATHRL_DATABASE__URL"]
    assert environ["PYTHONUNBUFFERED"] == "1"
    os.kill(server, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), 10, what="the forked job to die with its server")
    done = c.jobs.wait(job.id, timeout=60)
    assert done.status == "failed" and "SIGKILL" in (done.error or ""), done.error
    after = c.jobs.create(eval_spec(tiny_model, resources={"pool": POOL}))
    assert c.jobs.wait(after.id, timeout=180).status == "succeeded"  # as a fresh process, or forked again
    again = wait_for(lambda: _ready_server(service, "forker", after=server), 120, 0.5, "a new fork server")
    assert _fork_server(forking_worker) == again and forking_worker.poll() is None


def test_with_fork_jobs_off_a_job_is_a_fresh_process_of_the_worker(service: Service, tiny_model: str) -> None:
    worker = service.start_worker(queues=f"{POOL}-off", name="no-fork", env={"MATHRL_WORKER__FORK_JOBS": "false"})
    try:
        c = service.client()
        job = c.jobs.create(eval_spec(tiny_model, resources={"pool": f"{POOL}-off"}))
        pid = child_pid(c, job.id)
        assert c.jobs.wait(job.id, timeout=180).status == "succeeded"
        assert _fork_server(worker) is None
        log = (service.logs / "worker-no-fork.log").read_text()
        assert f"process {pid} started" in log, log[-2000:]
    finally:
        service.stop_worker(worker)
