"""`jobs.wait` against a real API process: where the API refuses the job's event stream (the
key's stream limit, 429), the wait polls instead and still ends with the job (the stream itself,
one request and no polling: tests/system/test_worker.py::test_eval_job_end_to_end)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mathrl.client import Client
from tests.helpers.env import free_port
from tests.helpers.jobs import parked_eval
from tests.helpers.processes import wait_for
from tests.helpers.service import Service, service_env


@pytest.fixture(scope="module")
def one_stream_api(db_url: str, broker_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """An API process whose keys may each hold one event stream open."""
    env = {
        **service_env(db_url, broker_url, tmp_path_factory.mktemp("artifacts-one-stream")),
        "MATHRL_LIMITS__MAX_STREAMS_PER_KEY": "1",
    }
    svc = Service(env=env, logs=tmp_path_factory.mktemp("logs-one-stream"), port=free_port())
    svc.start_api()
    yield svc
    svc.stop_api()


def test_wait_polls_where_the_stream_is_refused_and_ends_with_the_job(one_stream_api: Service) -> None:
    key = one_stream_api.key()
    c = Client(one_stream_api.url, api_key=key)
    job = c.jobs.create(parked_eval())  # in a pool no worker serves: queued until cancelled
    seen: list[tuple[str, int]] = []
    c.http.event_hooks["response"] = [lambda r: seen.append((r.request.url.path, r.status_code))]
    held = threading.Event()
    stop = threading.Event()

    def hold_the_keys_stream() -> None:
        with httpx.stream(
            "GET", f"{one_stream_api.url}/v1/jobs/{job.id}/events/stream",
            headers={"Authorization": f"Bearer {key}"}, timeout=60,
        ) as r:  # fmt: skip
            assert r.status_code == 200, r.read()
            held.set()
            stop.wait(60)

    holder = threading.Thread(target=hold_the_keys_stream, daemon=True)
    holder.start()
    assert held.wait(30), "the first stream did not open"
    result: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: result.update(job=c.jobs.wait(job.id, timeout=60, poll=0.05)))
    waiter.start()
    try:
        polls = wait_for(lambda: [p for p, _ in seen].count(f"/v1/jobs/{job.id}") >= 3, 30, 0.05, "the wait to poll")
        assert polls
        Client(one_stream_api.url, api_key=key).jobs.cancel(job.id)
        waiter.join(30)
    finally:
        stop.set()
    assert not waiter.is_alive() and result["job"].status == "cancelled", result
    stream = f"/v1/jobs/{job.id}/events/stream"
    assert seen[:2] == [(f"/v1/jobs/{job.id}", 200), (stream, 429)], seen
    assert all(entry == (f"/v1/jobs/{job.id}", 200) for entry in seen[2:]), seen  # polled, no second stream
