"""A real API process and real worker processes on the tests' database and broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.helpers.env import ADMIN_TOKEN, ROOT, data_dir, die_with_parent

# pools no test worker serves: their jobs stay queued
PARKED_POOLS = ["abuse-parked", "objects-parked", "graders-parked", "routes-parked", "results-parked", "fuzz-parked"]


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
        # the pools tests name (a pool no worker consumes is refused at submit): the parked ones, and
        # those the workers of the tests that name them consume
        "MATHRL_WORKER__POOLS": json.dumps(
            dict.fromkeys([*PARKED_POOLS, "cpu", "vllm-test", "vllm-drill", "forked", "forked-off"], 0)
            | dict.fromkeys(["mlflow-up", "mlflow-down"], 0)
            | {"nogpu-test": 1}
        ),
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        # OpenAI-shaped reinforcement jobs generate on HF here: no vLLM engine start per test job
        "MATHRL_FINE_TUNING__GENERATION_BACKEND": "hf",
        "MATHRL_FINE_TUNING__INFERENCE_BACKEND": "hf",
        # vLLM engines start without torch.compile here (a cold start 30 s shorter on this CPU:
        # 59 s against 90 s); tests/system/test_vllm.py's colocated weight-sync check runs compiled
        "MATHRL_VLLM__ENFORCE_EAGER": "1",
        # a Tinker client killed mid-session frees its worker this soon (tests/system/test_tinker.py)
        "MATHRL_SESSIONS__HEARTBEAT_TIMEOUT_SECONDS": "20",
        "MATHRL_SESSIONS__WARM_ENGINE": "true",  # sessions on a warm engine's base sample there (test_vllm.py)
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
            preexec_fn=die_with_parent,
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
            preexec_fn=die_with_parent,
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
