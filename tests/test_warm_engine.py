"""The worker's pool of warm vLLM engines (worker/warm_engine.py): which job gets which engine,
and when an engine is stopped. The engine is a real process here, a sleeping Python started
through the same guard as `vllm serve` (the real server is run by tests/test_vllm.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from service.settings import Settings
from worker import warm_engine

pytestmark = pytest.mark.quick


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setattr(
        warm_engine, "server_command", lambda *a, **k: [sys.executable, "-c", "import time; time.sleep(600)"]
    )
    s = Settings()
    s.worker.warm_engines = 1
    s.worker.warm_engine_idle_seconds = 600
    yield s
    warm_engine.stop_idle()
    assert warm_engine.running() == []


def _acquire(settings: Settings, model: str, tmp_path: Path) -> tuple[Any, bool]:
    return warm_engine.acquire(settings, model, "auto", [], tmp_path / "engine.log", None)


def test_the_next_job_of_the_same_model_reuses_the_engine(settings: Settings, tmp_path: Path) -> None:
    first, reused = _acquire(settings, "/models/a", tmp_path)
    assert not reused and first.users == 1
    warm_engine.release(first, settings)
    second, reused = _acquire(settings, "/models/a", tmp_path)
    assert reused and second is first and second.jobs == 2
    assert second.server.exited() is None
    warm_engine.release(second, settings)


def test_another_model_takes_the_slot_of_an_idle_engine_but_not_of_a_busy_one(
    settings: Settings, tmp_path: Path
) -> None:
    a, _ = _acquire(settings, "/models/a", tmp_path)
    b, reused = _acquire(settings, "/models/b", tmp_path)  # a is in use: both run
    assert not reused and {e.key[0] for e in warm_engine.running()} == {"/models/a", "/models/b"}
    warm_engine.release(a, settings)
    warm_engine.release(b, settings)
    c, _ = _acquire(settings, "/models/c", tmp_path)  # one slot: the idle ones make way
    assert [e.key[0] for e in warm_engine.running()] == ["/models/c"]
    assert a.server.proc.wait(timeout=30) is not None and b.server.proc.wait(timeout=30) is not None
    warm_engine.release(c, settings)


def test_idle_engines_stop_after_the_idle_time_and_for_other_jobs(settings: Settings, tmp_path: Path) -> None:
    settings.worker.warm_engine_idle_seconds = 0.5
    e, _ = _acquire(settings, "/models/a", tmp_path)
    time.sleep(1.0)
    warm_engine.reap(settings)
    assert warm_engine.running() == [e]  # in use: never reaped
    warm_engine.release(e, settings)  # its timer stops it 1.5 s later
    deadline = time.monotonic() + 30
    while warm_engine.running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert warm_engine.running() == [] and e.server.exited() is not None

    settings.worker.warm_engine_idle_seconds = 600
    f, _ = _acquire(settings, "/models/a", tmp_path)
    warm_engine.release(f, settings)
    assert warm_engine.stop_idle() == 1  # what the supervisor does before a training job
    assert f.server.exited() is not None


def test_an_engine_that_died_is_replaced(settings: Settings, tmp_path: Path) -> None:
    e, _ = _acquire(settings, "/models/a", tmp_path)
    warm_engine.release(e, settings)
    e.server.stop()
    f, reused = _acquire(settings, "/models/a", tmp_path)
    assert not reused and f is not e and f.server.exited() is None
    warm_engine.release(f, settings)


def test_the_context_length_is_the_models_up_to_the_cap(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 8192}')
    assert warm_engine.max_model_len(str(tmp_path), 4096) == 4096
    assert warm_engine.max_model_len(str(tmp_path), 16384) == 8192
    assert warm_engine.max_model_len(str(tmp_path / "missing"), 4096) == 4096
