"""The embedded default: the whole service on one machine with no external services.

SQLite for the database, kombu's SQLAlchemy transport on a SQLite file for the broker, one
Celery worker process and uvicorn on 127.0.0.1. Everything a job does still goes through
the API, the broker and the worker, exactly as in a cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from runtime.processes import die_with_parent_gently, free_port


def embedded_env(home: Path, model_roots: list[str] | None = None) -> dict[str, str]:
    home = home.resolve()
    roots = [str(home / "models"), *(model_roots or [])]
    return {
        "MATHRL_SOURCES__MODEL_ROOTS": json.dumps(roots),
        "MATHRL_DATABASE__URL": f"sqlite:///{home / 'mathrl.db'}",
        "MATHRL_BROKER__URL": f"sqla+sqlite:///{home / 'broker.db'}",
        "MATHRL_ARTIFACT_DIR": str(home / "artifacts"),
        "MATHRL_WORKER__HEARTBEAT_SECONDS": "2",
        "MATHRL_WORKER__RECONCILE_SECONDS": "10",
    }


def wait_ready(url: str, procs: list[subprocess.Popen[bytes]], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args!r} exited with {p.returncode} while starting")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} not ready after {timeout:.0f}s")


@contextmanager
def embedded_service(
    home: Path,
    port: int,
    model_roots: list[str] | None = None,
    queues: str = "cpu",
    extra_env: dict[str, str] | None = None,
) -> Iterator[tuple[str, dict[str, str]]]:
    """Start API and worker (on `queues`) as child processes; stop them on exit. Yields (url, env)."""
    from store.migrate import upgrade

    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **embedded_env(home, model_roots), **(extra_env or {})}
    upgrade(env["MATHRL_DATABASE__URL"])
    port = free_port(preferred=port)
    logs = home / "logs"
    logs.mkdir(exist_ok=True)
    py = sys.executable
    procs = [
        subprocess.Popen(
            [py, "-m", "service.cli", "api", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=open(logs / "api.log", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent_gently,  # a killed demo (Ctrl-C twice, a timeout) takes them along
        ),
        subprocess.Popen(
            [py, "-m", "service.cli", "worker", "--queues", queues, "--concurrency", "1"],
            env=env,
            stdout=open(logs / "worker.log", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent_gently,
        ),
    ]
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, procs)
        yield url, env
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def demo_key(env: dict[str, str]) -> str:
    from store.db import session_scope
    from store.keys import create_key, get_or_create_project

    with session_scope(env["MATHRL_DATABASE__URL"]) as s:
        _, secret = create_key(s, get_or_create_project(s, "demo"), name="demo")
    return secret


def prepare_model(choice: str, home: Path) -> str:
    """A local model directory for the demo (no hub access needed)."""
    from evaluator.models import cache_smollm2
    from trainer.tiny import build_tiny_model

    if choice == "smollm2":
        return str(cache_smollm2(home / "models" / "SmolLM2-135M-Instruct"))
    if choice == "tiny":
        target = home / "models" / "tiny-qwen2"
        if not (target / "config.json").exists():
            build_tiny_model(target, chat=True)
        return str(target)
    return choice
