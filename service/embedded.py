"""The embedded default: the whole service on one machine with no external services.

SQLite for the database, kombu's SQLAlchemy transport on a SQLite file for the broker, one
Celery worker process and uvicorn on 127.0.0.1. Everything a job does still goes through
the API, the broker and the worker, exactly as in a cluster.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from collections.abc import Iterator
from pathlib import Path

import httpx


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


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return int(s.getsockname()[1])
            except OSError:
                continue
    raise RuntimeError("no free port")


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
def embedded_service(home: Path, port: int, model_roots: list[str] | None = None) -> Iterator[tuple[str, dict[str, str]]]:
    """Start API and worker as child processes; stop them on exit. Yields (url, env)."""
    from store.migrate import upgrade

    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **embedded_env(home, model_roots)}
    upgrade(env["MATHRL_DATABASE__URL"])
    port = free_port(port)
    logs = home / "logs"
    logs.mkdir(exist_ok=True)
    py = sys.executable
    procs = [
        subprocess.Popen(
            [py, "-m", "service.cli", "api", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=open(logs / "api.log", "ab"), stderr=subprocess.STDOUT, start_new_session=True,
        ),
        subprocess.Popen(
            [py, "-m", "service.cli", "worker", "--queues", "cpu", "--concurrency", "1"],
            env=env, stdout=open(logs / "worker.log", "ab"), stderr=subprocess.STDOUT, start_new_session=True,
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


def run_demo(home: str, port: int, model: str, limit: int, max_new_tokens: int, keep_running: bool) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from mathrl.client import Client

    console = Console()
    root = Path(home).resolve()
    t0 = time.monotonic()
    with console.status("preparing the model (first run converts SmolLM2's GGUF to safetensors)"):
        model_path = prepare_model(model, root)
    console.print(f"model: [bold]{model_path}[/bold] ({time.monotonic() - t0:.0f}s)")
    with console.status("starting the embedded service: SQLite, SQLite broker, worker, API"):
        local = Path(model_path).expanduser()
        ctx = embedded_service(root, port, [str(local.resolve())] if local.exists() else None)
        url, env = ctx.__enter__()
    try:
        key = demo_key(env)
        console.print(f"API at [bold]{url}[/bold] (docs: {url}/docs); demo key written to {root / 'demo-key'}")
        (root / "demo-key").write_text(key + "\n")
        client = Client(url, api_key=key)
        spec = {
            "kind": "eval", "name": "demo: GSM8K", "model": model_path, "benchmark": "gsm8k", "limit": limit,
            "batch_size": 10, "sampling": {"max_new_tokens": max_new_tokens}, "tags": ["demo"],
        }
        job = client.jobs.create(spec)
        console.print(f"submitted eval job [bold]{job.id}[/bold] through the API")
        with Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(), console=console,
        ) as bar:
            task = bar.add_task("queued", total=limit)
            for ev in client.jobs.follow(job.id):
                if ev.type == "progress" and ev.data:
                    bar.update(task, completed=ev.data["done"], total=ev.data["total"], description="generating")
                else:
                    bar.console.print(f"[dim]{ev.time:%H:%M:%S}[/dim] {ev.type}: {ev.message}")
        job = client.jobs.retrieve(job.id)
        if job.status != "succeeded":
            console.print(f"[red]job {job.status}: {job.error}[/red]")
            return 1
        table = Table(title=f"GSM8K, first {limit} test problems")
        for col in ("model", "metric", "value", "95% CI", "n", "backend"):
            table.add_column(col)
        for s in sorted(client.scores.list(job_id=job.id), key=lambda s: s.metric):
            ci = f"{s.ci_low:.1%} - {s.ci_high:.1%}" if s.ci_low is not None else ""
            value = f"{s.value:.1%}" if s.metric == "accuracy" or "@" in s.metric or "rate" in s.metric else f"{s.value:.2f}"
            table.add_row(Path(s.model_ref).name, s.metric, value, ci, str(s.n), s.backend)
        console.print(table)
        console.print(
            f"next: MATHRL_URL={url} MATHRL_API_KEY=$(cat {root / 'demo-key'}) mathrl jobs get {job.id}\n"
            f"      curl -H 'Authorization: Bearer ...' {url}/v1/jobs/{job.id}/samples"
        )
        console.print(f"demo finished in {time.monotonic() - t0:.0f}s")
        if keep_running:
            console.print("service left running; Ctrl-C to stop")
            while True:
                time.sleep(3600)
        return 0
    finally:
        ctx.__exit__(None, None, None)
