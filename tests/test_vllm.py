"""The vLLM backend for real, on vLLM's CPU build (in .venv-vllm, made by scripts/setup-vllm):
local evaluation agreeing with the HF backend, and an eval job through a worker that has vLLM."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, Service, data_dir

pytestmark = pytest.mark.slow

VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"


@pytest.fixture(scope="module")
def vllm_ready() -> Path:
    if not VLLM_PY.exists():
        pytest.skip("no .venv-vllm: run scripts/setup-vllm (scripts/test does)")
    return VLLM_PY


@pytest.fixture(scope="module")
def model_for_vllm(tmp_path_factory: pytest.TempPathFactory) -> str:
    # vLLM's CPU attention needs head_dim 32/64/128...: 128 wide with 2 heads
    from trainer.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("vllm") / "tiny", hidden_size=128, heads=2, chat=True, seed=3))


def _eval(python: Path, model: str, backend: str, out: Path) -> list[dict]:
    r = subprocess.run(
        [str(python), "-m", "mathrl.cli", "eval", "--model", model, "--benchmark", "gsm8k", "--limit", "6",
         "--backend", backend, "--max-new-tokens", "12", "--out", str(out), "--data-dir", data_dir()],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={"PATH": "/usr/bin:/bin", "HOME": str(out)},
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]


def test_vllm_and_hf_give_the_same_greedy_completions(vllm_ready: Path, model_for_vllm: str, tmp_path: Path) -> None:
    vllm_items = _eval(vllm_ready, model_for_vllm, "vllm", tmp_path / "vllm")
    hf_items = _eval(ROOT / ".venv" / "bin" / "python", model_for_vllm, "hf", tmp_path / "hf")
    assert [i["prompt"] for i in vllm_items] == [i["prompt"] for i in hf_items]
    # both run float32 on the CPU: the same greedy text, token for token
    same = sum(a["completion"] == b["completion"] for a, b in zip(vllm_items, hf_items))
    assert same == len(hf_items), [(a["completion"], b["completion"]) for a, b in zip(vllm_items, hf_items)]


def test_eval_job_on_a_worker_with_vllm(vllm_ready: Path, service: Service, model_for_vllm: str) -> None:
    import os
    import signal

    env = dict(service.env)
    proc = subprocess.Popen(
        [str(vllm_ready), "-m", "service.cli", "worker", "--queues", "vllm-test", "--hostname", "vllm@%h"],
        env=env, cwd=ROOT, stdout=open(service.logs / "worker-vllm.log", "ab"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        from tests.conftest import wait_for

        wait_for(lambda: "ready." in (service.logs / "worker-vllm.log").read_text(), 120, what="the vLLM worker")
        c = service.client()
        job = c.jobs.create({"kind": "eval", "model": model_for_vllm, "benchmark": "gsm8k", "limit": 3,
                             "backend": "vllm", "sampling": {"max_new_tokens": 8},
                             "resources": {"pool": "vllm-test"}})
        assert job.queue == "vllm-test"
        done = c.jobs.wait(job.id, timeout=600)
        assert done.status == "succeeded", done.error
        acc = next(s for s in c.scores.list(job_id=job.id) if s.metric == "accuracy")
        assert acc.backend == "vllm" and acc.backend_version.startswith("vllm-")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
