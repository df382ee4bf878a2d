"""A Tinker client's create future while its session job waits for a worker (api/routers/tinker.py),
in process on an app with no worker of its own (tests.helpers.api.private_app): its jobs stay queued."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.api import admin_key, db, private_app_client

pytestmark = pytest.mark.quick

app_client = private_app_client()


def test_a_create_that_waits_for_a_worker_says_so_and_names_the_projects_sessions_that_hold_one(
    app_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 69.6: the cookbook never finishes its client, so on a one-worker service the next client
    waited out the first one's heartbeat with nothing said. The create future's try_again now says
    `paused_capacity`, and why: the project's own sessions that hold a worker of that queue, with
    their heartbeat timeouts."""
    from sqlalchemy import text

    from api.routers import tinker

    monkeypatch.setattr(tinker, "CREATE_WAIT_SECONDS", 0.2)
    key = admin_key(app_client)
    mine = {"X-API-Key": "tml-" + key["Authorization"].removeprefix("Bearer ")}
    session = app_client.post("/api/v1/create_session", json={}, headers=mine).json()["session_id"]
    body = {"session_id": session, "base_model": "tiny:2x64", "lora_config": {"rank": 4}}
    first = app_client.post("/api/v1/create_model", json={**body, "model_seq_id": 0}, headers=mine).json()
    r = app_client.post("/api/v1/retrieve_future", json={"request_id": first["request_id"]}, headers=mine)
    assert r.json()["queue_state"] == "paused_capacity", r.text
    assert "waits for a worker of queue 'cpu'" in r.json()["queue_state_reason"] and "hold" not in r.text
    with db(app_client).begin() as c:  # the first client's job took the worker (and its client went away)
        c.execute(text("UPDATE jobs SET status = 'running' WHERE name = :n"), {"n": f"{session}:train:0"})
    second = app_client.post("/api/v1/create_model", json={**body, "model_seq_id": 1}, headers=mine).json()
    r = app_client.post("/api/v1/retrieve_future", json={"request_id": second["request_id"]}, headers=mine)
    out = r.json()
    assert (r.status_code, out["type"], out["queue_state"]) == (200, "try_again", "paused_capacity"), r.text
    assert f"{session}:train:0 (heartbeat timeout 20 s)" in out["queue_state_reason"], out  # (the tests' setting)
    other = admin_key(app_client)  # another project's wait names none of these sessions
    theirs = {"X-API-Key": "tml-" + other["Authorization"].removeprefix("Bearer ")}
    fresh = app_client.post("/api/v1/create_session", json={}, headers=theirs).json()["session_id"]
    made = app_client.post(
        "/api/v1/create_model", json={**body, "session_id": fresh, "model_seq_id": 0}, headers=theirs
    ).json()
    r = app_client.post("/api/v1/retrieve_future", json={"request_id": made["request_id"]}, headers=theirs)
    assert r.json()["queue_state"] == "paused_capacity" and session not in r.text, r.text
