"""Which jobs the worker forks (worker/job_handle.py): `worker.fork_jobs` auto forks only where
torch is a CPU build, read from torch's version file (a fork must not carry a CUDA driver's state).
The forked jobs themselves: tests/system/test_job_forkserver.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from worker import job_handle

pytestmark = pytest.mark.quick


def _torch_at(tmp_path: Path, cuda: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / cuda.replace("'", "") / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text(f"__version__ = '2.13.0'\ncuda: Optional[str] = {cuda}\nhip = None\n")
    spec = importlib.util.spec_from_file_location("torch", pkg / "__init__.py")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "torch" else None)


def test_auto_forks_jobs_only_on_a_cpu_build_of_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    envs: list[dict[str, str]] = []

    def ready(cls: object, env: dict[str, str], log: object) -> None:
        started.append(log)
        envs.append(env)

    monkeypatch.setattr(job_handle.ForkServer, "ready", classmethod(ready))
    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)

    def settings(mode: str) -> SimpleNamespace:
        worker = SimpleNamespace(fork_jobs=mode, job_slots=1, job_threads=3)
        return SimpleNamespace(worker=worker, artifact_dir=str(tmp_path / "artifacts"))

    _torch_at(tmp_path, "'12.8'", monkeypatch)
    assert not job_handle.torch_is_cpu_build()
    job_handle.fork_server(settings("auto"))
    assert started == []  # a CUDA build: no fork server
    job_handle.fork_server(settings("true"))
    assert len(started) == 1  # unless the operator says so
    # its OpenMP pool is made at its imports: the jobs' threads and wait policy from the start
    assert envs[0]["OMP_NUM_THREADS"] == "3" and envs[0]["OMP_WAIT_POLICY"] == "PASSIVE"
    _torch_at(tmp_path, "None", monkeypatch)
    assert job_handle.torch_is_cpu_build()
    job_handle.fork_server(settings("auto"))
    job_handle.fork_server(settings("false"))
    assert len(started) == 2
