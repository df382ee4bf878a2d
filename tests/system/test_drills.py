"""Fault drills (RELIABILITY.md): a killed worker, a lost broker, a duplicate delivery, a
database outage and a failed checkpoint write, each done to a real API + Celery worker on
PostgreSQL + Redis. The drills get their own database, Redis databases (13, 14) and worker
processes, so they can kill workers and flush the broker without touching other tests; the
outage drill runs its own throwaway PostgreSQL cluster, which it stops and starts."""

from __future__ import annotations

import glob
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.helpers.env import PG_SERVER, REDIS, free_port
from tests.helpers.jobs import eval_spec
from tests.helpers.processes import child_pid, pid_alive, wait_for
from tests.helpers.service import Service, service_env

pytestmark = pytest.mark.slow

ARITH = {"name": "arith", "split": "train"}


def redis_db(n: int) -> str:
    """The test Redis server, database n (the main test session uses another)."""
    return f"{REDIS.rsplit('/', 1)[0]}/{n}"


def flush_redis(url: str) -> None:
    import redis

    redis.Redis.from_url(url).flushdb()


def grpo_spec(model: str, **over: Any) -> dict[str, Any]:
    return {
        "kind": "grpo",
        "model": model,
        "dataset": {**ARITH, "limit": 500},
        "max_steps": 12,
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_completion_length": 6,
        "logging_steps": 1,
        "save_steps": 4,
        "learning_rate": 1e-4,
        **over,
    }


def sft_spec(model: str, **over: Any) -> dict[str, Any]:
    return {
        "kind": "sft",
        "model": model,
        "dataset": {**ARITH, "limit": 500},
        "max_steps": 30,
        "learning_rate": 1e-3,
        "per_device_train_batch_size": 64,
        "max_length": 32,
        "logging_steps": 1,
        "save_steps": 10,
        **over,
    }


def start_service(env: dict[str, str], logs: Path, workers: int = 1) -> Service:
    svc = Service(env=env, logs=logs, port=free_port())
    svc.start_api()
    for _ in range(workers):
        svc.start_worker(name=f"w{uuid.uuid4().hex[:6]}")
    return svc


def stop_service(svc: Service) -> None:
    svc.stop_api(signal.SIGKILL)
    for w in list(svc.workers):
        svc.stop_worker(w, signal.SIGKILL)


def set_workers(svc: Service, n: int) -> None:
    """Exactly n idle workers (a worker stopped here must have no job running)."""
    while len(svc.workers) > n:
        svc.stop_worker(svc.workers[-1])
    while len(svc.workers) < n:
        svc.start_worker(name=f"w{uuid.uuid4().hex[:6]}")


def kill_workers(svc: Service, job_pids: list[int]) -> None:
    """The pod dies: SIGKILL every worker's process group, and the job processes with them."""
    for w in list(svc.workers):
        os.killpg(w.pid, signal.SIGKILL)
        w.wait()
        svc.workers.remove(w)
    for pid in job_pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not any(pid_alive(p) for p in job_pids), 10, what="the job processes to die")


def count(events: list[Any], type: str) -> int:
    return sum(e.type == type for e in events)


@pytest.fixture(scope="module")
def drills(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """An API and worker of their own: a fresh database on the test PostgreSQL, Redis db 13."""
    from store.migrate import upgrade

    name = f"mathrl_drills_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_SERVER).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    broker = redis_db(13)
    flush_redis(broker)
    env = service_env(url, broker, tmp_path_factory.mktemp("artifacts-drills"))
    svc = start_service(env, tmp_path_factory.mktemp("logs-drills"), workers=0)  # each drill sets its workers
    yield svc
    stop_service(svc)
    flush_redis(broker)
    with admin.connect() as c:
        c.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


# The drills that share the `drills` service run in the order that restarts the fewest workers.


# -- drill 2 ---------------------------------------------------------------------------------


def test_broker_flushed_with_jobs_queued_runs_each_job_exactly_once(drills: Service, tiny_model: str) -> None:
    """Jobs queued while no worker runs, then Redis loses every message: the reconciler sends
    them again from the database and each runs once."""
    import redis

    svc = drills
    set_workers(svc, 0)
    c = svc.client()
    jobs = [c.jobs.create(eval_spec(tiny_model, limit=2, batch_size=2)) for _ in range(3)]
    broker = redis.Redis.from_url(svc.env["MATHRL_BROKER__URL"])
    assert broker.llen("cpu") == 3
    broker.flushdb()
    assert broker.dbsize() == 0
    set_workers(svc, 1)
    for j in jobs:
        done = c.jobs.wait(j.id, timeout=180, poll=0.5)
        assert done.status == "succeeded" and done.attempts == 1, done.error
        events = c.jobs.events(j.id)
        assert count(events, "claimed") == 1 and count(events, "started") == 1
        assert len([s for s in c.scores.list(job_id=j.id) if s.metric == "accuracy"]) == 1


# -- drill 5 ---------------------------------------------------------------------------------


def test_checkpoint_write_failure_fails_the_job_and_keeps_the_last_checkpoint(drills: Service, tiny_model: str) -> None:
    """After the first checkpoint, the job process may write no file over 256 KiB (its
    RLIMIT_FSIZE, lowered from outside: the write fails as on a full disk, and it works as
    root, where a read-only directory would not stop anything). The next checkpoint's model
    file (~350 KiB) fails: the job fails with the reason, and the first checkpoint is intact."""
    from transformers import AutoModelForCausalLM

    from trainer.checkpoints import latest_checkpoint

    svc = drills
    set_workers(svc, 1)
    c = svc.client()
    job = c.jobs.create(sft_spec(tiny_model, max_steps=60))
    pid = child_pid(c, job.id)
    wait_for(lambda: c.jobs.checkpoints(job.id), 120, 0.05, "the first checkpoint")
    limit = 256 * 1024
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, limit))
    first = [cp.step for cp in c.jobs.checkpoints(job.id)]
    assert first == [10], first  # the limit came before the next save

    done = c.jobs.wait(job.id, timeout=120, poll=0.5)
    assert done.status == "failed"
    assert "checkpoint at step 20 write failed" in (done.error or ""), done.error
    assert "File too large" in (done.error or ""), done.error
    assert [cp.step for cp in c.jobs.checkpoints(job.id)] == [10]
    train = Path(svc.env["MATHRL_ARTIFACT_DIR"]) / "jobs" / job.id / "train"
    assert sorted(p.name for p in train.iterdir() if "checkpoint" in p.name) == ["checkpoint-10"]
    assert latest_checkpoint(train) == train / "checkpoint-10"
    state = json.loads((train / "checkpoint-10" / "trainer_state.json").read_text())
    assert state["global_step"] == 10
    model = AutoModelForCausalLM.from_pretrained(train / "checkpoint-10")
    assert sum(p.numel() for p in model.parameters()) > 0


# -- drill 3 ---------------------------------------------------------------------------------


def test_duplicate_delivery_runs_the_job_once(drills: Service, tiny_model: str) -> None:
    """The same message delivered twice more while the job runs, to an idle second worker:
    each duplicate finds the job leased and is skipped."""
    from worker.celery_app import get_celery, send_job

    svc = drills
    set_workers(svc, 2)
    c = svc.client()
    # long enough to still run when both duplicates have been consumed (16 problems were not, once
    # two workers' job processes stopped fighting over the cores: runtime/cpu_threads.py)
    job = c.jobs.create(eval_spec(tiny_model, limit=96, batch_size=2, sampling={"max_new_tokens": 32}))
    child_pid(c, job.id)
    app = get_celery(svc.env["MATHRL_BROKER__URL"])
    send_job(app, job.id, "cpu")  # the same message again, as a redelivery would
    send_job(app, job.id, "cpu")

    def skipped() -> int:
        return sum(f.read_text().count(f"job {job.id} not claimable") for f in svc.logs.glob("worker-*.log"))

    wait_for(lambda: skipped() == 2, 30, what="both duplicates to be consumed")
    assert c.jobs.retrieve(job.id).status == "running"  # they were skipped because of the lease
    done = c.jobs.wait(job.id, timeout=180, poll=0.5)
    assert done.status == "succeeded" and done.attempts == 1
    events = c.jobs.events(job.id)
    assert count(events, "claimed") == 1 and count(events, "started") == 1
    assert len([s for s in c.scores.list(job_id=job.id) if s.metric == "accuracy"]) == 1


# -- drill 1 ---------------------------------------------------------------------------------


def test_worker_killed_mid_grpo_resumes_from_its_latest_checkpoint(drills: Service, tiny_model: str) -> None:
    """SIGKILL the workers (and so their job processes) mid-GRPO. The leases lapse, a new
    worker's reconciler re-queues the GRPO job, which resumes from its newest checkpoint with
    its attempt counted and no metric step logged twice or missed; a job with max_attempts=1
    killed the same way fails with the reason."""
    svc = drills
    set_workers(svc, 2)
    c = svc.client()
    # The long job starts first, so that nothing is left to wait for between the 40-step job's
    # first checkpoint and the kill: waiting for a second job to start after that checkpoint let
    # the 40 steps finish first on a busy CI machine. It is 5,000 steps (and saves rarely): 200
    # steps once ran out in 25 s, before the 40-step job had even started its steps.
    once = c.jobs.create({**grpo_spec(tiny_model, max_steps=5000, save_steps=1000), "max_attempts": 1})
    pids = [child_pid(c, once.id)]
    job = c.jobs.create(grpo_spec(tiny_model, max_steps=40))  # on the other worker
    pids.append(child_pid(c, job.id))
    wait_for(lambda: c.jobs.checkpoints(job.id), 180, 0.1, "a checkpoint")
    saved = max(cp.step for cp in c.jobs.checkpoints(job.id) if cp.kind == "checkpoint")
    assert c.jobs.retrieve(once.id).status == "running", "the long job ended before the kill"
    kill_workers(svc, pids)
    assert c.jobs.retrieve(job.id).status == "running"  # nobody knows yet
    svc.start_worker(name=f"after-kill-{uuid.uuid4().hex[:6]}")

    failed = c.jobs.wait(once.id, timeout=60, poll=0.5)
    assert failed.status == "failed" and failed.attempts == 1
    assert "lease lapsed" in (failed.error or "") and "max_attempts=1" in (failed.error or ""), failed.error

    done = c.jobs.wait(job.id, timeout=300, poll=0.5)
    assert done.status == "succeeded", done.error
    assert done.attempts == 2
    events = c.jobs.events(job.id)
    assert [e.data["attempt"] for e in events if e.type == "claimed"] == [1, 2]
    assert count(events, "requeued") == 1 and count(events, "started") == 2
    resumed = [e.data["step"] for e in events if e.type == "resumed"]
    checkpoints = {cp.step for cp in c.jobs.checkpoints(job.id) if cp.kind == "checkpoint"}
    # from the newest checkpoint on disk when it died: the one the test saw, or one saved after
    assert len(resumed) == 1 and resumed[0] >= saved and resumed[0] in checkpoints, (resumed, saved, checkpoints)
    series = {m.name: [p.step for p in m.points] for m in c.jobs.metrics(job.id)}
    assert series["loss"] == list(range(1, 41)), series["loss"]
    for name, steps in series.items():
        assert len(steps) == len(set(steps)), f"{name} logged a step twice: {steps}"


# -- drill 7 ---------------------------------------------------------------------------------


def test_worker_sigterm_drains_its_job_to_a_checkpoint_and_another_worker_resumes_it(
    drills: Service, tiny_model: str
) -> None:
    """SIGTERM to a worker (Kubernetes stopping its pod) mid-GRPO (60 steps: a 12-step job ended
    before the SIGTERM on a quick run), with no periodic checkpoint
    yet: the job saves a checkpoint of the step it is at, stops, and goes back to the queue
    (a drain, not a cancel, not counted against max_attempts=1); the worker exits cleanly; a
    new worker resumes the job from that step and finishes it, every metric step stored once."""
    svc = drills
    set_workers(svc, 1)
    c = svc.client()
    job = c.jobs.create({**grpo_spec(tiny_model, max_steps=60, save_steps=1000), "max_attempts": 1})
    pid = child_pid(c, job.id)

    def step() -> int:
        return max((p.step for m in c.jobs.metrics(job.id) if m.name == "loss" for p in m.points), default=0)

    wait_for(lambda: step() >= 2, 180, 0.1, "two GRPO steps")
    assert not c.jobs.checkpoints(job.id)
    worker = svc.workers[0]
    t0 = time.monotonic()
    os.killpg(worker.pid, signal.SIGTERM)
    assert worker.wait(timeout=60) == 0  # a warm shutdown, after the drain
    drain_seconds = time.monotonic() - t0
    svc.workers.remove(worker)
    assert not pid_alive(pid)

    parked = c.jobs.retrieve(job.id)
    assert parked.status == "queued" and parked.drains == 1 and parked.attempts == 1, parked
    events = c.jobs.events(job.id)
    assert [e.type for e in events if e.type in ("drain_requested", "drained", "cancelled", "failed")] == [
        "drain_requested",
        "drained",
    ]
    drained = next(e for e in events if e.type == "drained")
    saved = drained.data["checkpoint_step"]
    assert saved is not None and 2 <= saved < 60 and not drained.data["timed_out"], drained  # mid-training
    assert [cp.step for cp in c.jobs.checkpoints(job.id)] == [saved]

    svc.start_worker(name=f"after-drain-{uuid.uuid4().hex[:6]}")
    done = c.jobs.wait(job.id, timeout=300, poll=0.5)
    assert done.status == "succeeded", done.error
    assert done.attempts == 2 and done.drains == 1
    events = c.jobs.events(job.id)
    assert [e.data["step"] for e in events if e.type == "resumed"] == [saved]
    series = {m.name: [p.step for p in m.points] for m in c.jobs.metrics(job.id)}
    assert series["loss"] == list(range(1, 61)), series["loss"]
    for name, steps in series.items():
        assert len(steps) == len(set(steps)), f"{name} logged a step twice: {steps}"
    print(f"drain: SIGTERM to worker exit {drain_seconds:.1f}s, checkpoint at step {saved}")


# -- drill 6 ---------------------------------------------------------------------------------


class Partition:
    """A TCP proxy between one worker and PostgreSQL that the test can cut: while cut, its open
    connections are closed and new ones are closed as soon as they arrive (the worker sees the
    database go away; everyone else still reaches it directly)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        import socket

        self.upstream, self.cut = upstream, threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.open: set[Any] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.cut.is_set():
                client.close()
                continue
            try:
                up = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.open.update((client, up))
            for a, b in ((client, up), (up, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: Any, dst: Any) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            self._close(sock)

    def _close(self, sock: Any) -> None:
        import socket

        with self.lock:
            self.open.discard(sock)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()

    def block(self) -> None:
        self.cut.set()
        with self.lock:
            socks = list(self.open)
        for sock in socks:
            self._close(sock)

    def unblock(self) -> None:
        self.cut.clear()

    def close(self) -> None:
        self.block()
        self.server.close()


def test_worker_cut_off_from_the_database_cannot_write_into_the_job_it_lost(drills: Service, tiny_model: str) -> None:
    """Issue 16.4: only worker A's database connection is cut (its reconciler too; the API and
    worker B still reach the database) for longer than the lease. B's reconciler re-queues the
    job and B resumes it (attempt 2). When A's link comes back, every write its job process
    tries is refused by the fence (counted), the process stops, and the job's checkpoints and
    final model are B's."""
    from sqlalchemy.engine import make_url as _url

    svc = drills
    set_workers(svc, 0)
    url = _url(svc.env["MATHRL_DATABASE__URL"])
    link = Partition((url.host or "127.0.0.1", url.port or 5432))
    try:
        proxied = url.set(host="127.0.0.1", port=link.port).render_as_string(hide_password=False)
        svc.start_worker(name=f"cut-{uuid.uuid4().hex[:6]}", env={"MATHRL_DATABASE__URL": proxied})
        c = svc.client()
        job = c.jobs.create(sft_spec(tiny_model, max_steps=40, save_steps=10))
        stale_pid = child_pid(c, job.id)
        wait_for(lambda: c.jobs.checkpoints(job.id), 120, 0.05, "the first checkpoint")
        link.block()
        cut_at = time.monotonic()
        svc.start_worker(name=f"direct-{uuid.uuid4().hex[:6]}")

        def claimed_again() -> bool:
            return any(e.type == "claimed" and e.data["attempt"] == 2 for e in c.jobs.events(job.id))

        wait_for(claimed_again, 60, 0.2, "worker B to take the job over")
        assert pid_alive(stale_pid)  # A's process is still there, unable to reach the database
        time.sleep(max(0.0, 6 - (time.monotonic() - cut_at)))  # cut for longer than the 4 s lease
        link.unblock()
        wait_for(lambda: not pid_alive(stale_pid), 30, 0.2, "the stale job process to stop")

        done = c.jobs.wait(job.id, timeout=180, poll=0.5)
        assert done.status == "succeeded" and done.attempts == 2, done.error
        events = c.jobs.events(job.id)
        stale = [e for e in events if e.type == "stale_attempt"]
        assert len(stale) == 1 and stale[0].data["attempt"] == 1, [(e.type, e.message) for e in events]
        rejected = stale[0].data["rejected_writes"]
        attempt1 = Path(svc.env["MATHRL_ARTIFACT_DIR"]) / "jobs" / job.id / "attempt-1"
        assert rejected >= 1 and len((attempt1 / "rejected-writes.log").read_text().splitlines()) == rejected
        print(f"partition drill: {rejected} writes of the stale attempt refused")
        # what the job keeps was promoted by the owner of each moment: attempt 1 up to the cut, then 2
        ckpts = c.jobs.checkpoints(job.id)
        final = [cp for cp in ckpts if cp.kind == "final"]
        assert len(final) == 1 and final[0].data["attempt"] == 2 and final[0].step == 40
        resumed = [e.data["step"] for e in events if e.type == "resumed"]
        assert len(resumed) == 1
        assert all(cp.data["attempt"] == 2 for cp in ckpts if cp.step > resumed[0]), [
            (cp.step, cp.data) for cp in ckpts
        ]
        train = attempt1.parent / "train"  # the job's directory holds exactly what was recorded
        assert {p.name for p in train.iterdir()} == {
            f"checkpoint-{cp.step}" for cp in ckpts if cp.kind == "checkpoint"
        } | {"final"}
        assert (train / "final" / "config.json").exists()
        steps = [m for m in c.jobs.metrics(job.id) if m.name == "loss"][0]
        assert [p.step for p in steps.points] == list(range(1, 41))
    finally:
        link.close()
        set_workers(svc, 0)


# -- drill 4 ---------------------------------------------------------------------------------


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    path = found[-1] if found else shutil.which("pg_ctl")
    if not path:
        pytest.skip("PostgreSQL server binaries (pg_ctl, initdb) are not installed")
    return Path(path).parent


class Postgres:
    """A throwaway PostgreSQL cluster in a temp dir under /tmp (pytest's are private to us),
    run as the postgres user when we are root (the server refuses to run as root)."""

    def __init__(self) -> None:
        self.bin, self.port = _pg_bin(), free_port()
        self.root = root = Path(tempfile.mkdtemp(prefix="mathrl-drill-pg-"))
        self.data = root / "data"
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(root, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        r = subprocess.run([*self.as_user, str(self.bin / tool), *args], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"{tool} failed ({r.returncode}): {r.stdout}{r.stderr}")

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "log"), "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class Traffic(threading.Thread):
    """API calls in a loop, each recorded with its start and end time."""

    def __init__(self, url: str, key: str, job_id: str) -> None:
        super().__init__(daemon=True)
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=15)
        self.job_id, self.stop, self.calls = job_id, threading.Event(), []

    def run(self) -> None:
        calls = [
            ("GET", f"/v1/jobs/{self.job_id}"),
            ("GET", "/v1/jobs?limit=5"),
            ("GET", f"/v1/jobs/{self.job_id}/events"),
            ("GET", f"/v1/jobs/{self.job_id}/metrics"),
            ("POST", f"/v1/jobs/{uuid.uuid4()}/cancel"),
            ("POST", "/v1/jobs"),
            ("GET", "/readyz"),
        ]
        i = 0
        while not self.stop.is_set():
            method, path = calls[i % len(calls)]
            i += 1
            t0 = time.monotonic()
            if method == "POST" and path == "/v1/jobs":  # on a queue no worker serves: it never runs
                r = self.http.post(
                    path,
                    json={"kind": "eval", "model": "org/m", "resources": {"gpus": 2}},
                    headers={"Idempotency-Key": "outage-drill"},
                )
            else:
                r = self.http.request(method, path)
            self.calls.append(
                (
                    t0,
                    time.monotonic(),
                    path,
                    r.status_code,
                    r.headers.get("content-type", ""),
                    r.headers.get("retry-after"),
                )
            )
            time.sleep(0.05)


def test_database_outage_answers_503_and_the_running_job_loses_nothing(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: str
) -> None:
    """PostgreSQL stopped for ~10 s under API traffic and a running SFT job: every API answer
    meanwhile is a 503 problem (never a 500), /readyz fails then recovers, and the job
    finishes on its first attempt with every metric step and event stored."""
    from store.migrate import upgrade

    pg = Postgres()
    pg.start()
    svc: Service | None = None
    try:
        upgrade(pg.url)
        broker = redis_db(14)
        flush_redis(broker)
        env = {
            **service_env(pg.url, broker, tmp_path_factory.mktemp("artifacts-outage")),
            "MATHRL_AUTH__CACHE_SECONDS": "1",
        }
        svc = start_service(env, tmp_path_factory.mktemp("logs-outage"))
        key = svc.key()
        c = svc.client(key)
        job = c.jobs.create(sft_spec(tiny_model, max_steps=24, save_steps=8))
        wait_for(
            lambda: any(m.name == "loss" and m.points[-1].step >= 3 for m in c.jobs.metrics(job.id)),
            120,
            0.2,
            "training to be under way",
        )
        traffic = Traffic(svc.url, key, job.id)
        traffic.start()
        time.sleep(1)
        pg.stop()
        down_from = time.monotonic()
        time.sleep(10)
        down_until = time.monotonic()
        pg.start()
        wait_for(lambda: httpx.get(f"{svc.url}/readyz").status_code == 200, 30, what="/readyz to recover")
        up_at = time.monotonic()
        time.sleep(2)
        traffic.stop.set()
        traffic.join(20)

        done = c.jobs.wait(job.id, timeout=180, poll=0.5)
        calls = traffic.calls
        assert not [x for x in calls if x[3] >= 500 and x[3] != 503], calls
        during = [x for x in calls if x[0] > down_from + 0.5 and x[1] < down_until]
        assert len(during) > 20, len(during)
        bad = [x for x in during if x[3] != 503 or not x[4].startswith("application/problem+json") or not x[5]]
        assert not bad, bad[:5]
        assert any(p == "/readyz" for _, _, p, *_ in during)
        after = [x for x in calls if x[0] > up_at]
        assert after and all(x[3] in (200, 201, 404) for x in after), after[:5]

        assert done.status == "succeeded", done.error
        assert done.attempts == 1  # its lease lapsed in the outage, yet nobody took it away
        events = c.jobs.events(job.id)
        assert count(events, "requeued") == 0 and count(events, "claimed") == 1
        assert {e.data["step"] for e in events if e.type == "checkpoint"} == {8, 16, 24}
        assert [e.type for e in events][-3:] == ["final", "trained", "succeeded"], [e.type for e in events][-5:]
        assert [e.seq for e in events] == sorted({e.seq for e in events})
        series = {m.name: [p.step for p in m.points] for m in c.jobs.metrics(job.id)}
        assert series["loss"] == list(range(1, 25)), series["loss"]
    finally:
        if svc is not None:
            stop_service(svc)
        flush_redis(redis_db(14))
        pg.remove()
