"""Event streams on PostgreSQL wait for the database's NOTIFY instead of polling it
(api/job_wakeups.py, migration 0008): idle streams make no reads, and an event written to the
job reaches every open stream at once. Streams on SQLite keep polling (tests/system/test_embedded.py
and the pages' tests follow jobs that way)."""

from __future__ import annotations

import json
import re
import statistics
import threading
import time
from typing import Any

import httpx
import pytest

from store.db import session_scope
from store.jobs import add_event
from tests.helpers.service import Service

STREAMS = 5
EVENTS = 10


def stream_reads(service: Service) -> float:
    text = httpx.get(f"{service.url}/metrics").text
    m = re.search(r"^mathrl_stream_reads_total (\S+)$", text, re.M)
    assert m, "mathrl_stream_reads_total is not exported"
    return float(m.group(1))


@pytest.mark.slow
def test_idle_streams_make_no_reads_and_events_arrive_at_once(service: Service, pg_url: str) -> None:
    key = service.key()
    h = {"Authorization": f"Bearer {key}"}
    # a job no worker takes (no gpu-1 worker here): it stays queued, its streams stay open
    parked = {"kind": "eval", "model": "org/model", "limit": 5, "resources": {"gpus": 1}}
    r = httpx.post(f"{service.url}/v1/jobs", json=parked, headers=h)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    arrivals: list[dict[int, float]] = [{} for _ in range(STREAMS)]
    opened = threading.Barrier(STREAMS + 1)
    stop = threading.Event()

    def follow(i: int) -> None:
        with httpx.stream(
            "GET", f"{service.url}/v1/jobs/{job_id}/events/stream", headers=h, timeout=httpx.Timeout(30)
        ) as r:
            assert r.status_code == 200
            opened.wait()
            for line in r.iter_lines():
                if stop.is_set():
                    return
                if line.startswith("data: "):
                    row: dict[str, Any] = json.loads(line[6:])
                    if row.get("type") == "bench":
                        arrivals[i][row["data"]["n"]] = time.time() - row["data"]["sent"]
                        if len(arrivals[i]) == EVENTS:
                            return

    threads = [threading.Thread(target=follow, args=(i,), daemon=True) for i in range(STREAMS)]
    for t in threads:
        t.start()
    opened.wait(timeout=30)
    time.sleep(1.0)  # each stream has read what was there and is waiting
    before = stream_reads(service)
    time.sleep(3.0)
    idle_reads = stream_reads(service) - before
    # polling every 0.5 s: 5 streams x 6 reads in 3 s; woken by NOTIFY: none until a write
    assert idle_reads <= STREAMS, f"{idle_reads} reads by {STREAMS} idle streams in 3 s"

    for n in range(EVENTS):
        with session_scope(pg_url) as s:
            add_event(s, job_id, "bench", data={"n": n, "sent": time.time()})
        time.sleep(0.2)
    for t in threads:
        t.join(timeout=20)
    stop.set()
    latencies = sorted(v for a in arrivals for v in a.values())
    assert len(latencies) == STREAMS * EVENTS, [len(a) for a in arrivals]
    p50, worst = statistics.median(latencies), latencies[-1]
    print(
        f"\n{STREAMS} streams: {idle_reads:.0f} reads in 3 s idle; "
        f"event -> stream p50 {p50 * 1000:.1f} ms, max {worst * 1000:.1f} ms"
    )
    # polling every 0.5 s gives a median near 250 ms
    assert p50 < 0.15 and worst < 1.0, (p50, worst)
    httpx.post(f"{service.url}/v1/jobs/{job_id}/cancel", headers=h)
