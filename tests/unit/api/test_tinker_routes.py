"""The Tinker API's routes (api/routers/tinker.py) on bad input, in-process: the SDK's key header,
and a clear 4xx problem naming the field for what cannot be served, before any job is made. (The
SDK against a running service: tests/system/test_tinker.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.api import admin_key
from tests.helpers.env import ADMIN_TOKEN

pytestmark = pytest.mark.quick


def _tinker(headers: dict[str, str]) -> dict[str, str]:
    """The SDK's header for a mathrl key: X-API-Key: tml-<key>."""
    return {"X-API-Key": "tml-" + headers["Authorization"].removeprefix("Bearer ")}


def test_the_sdk_key_header_is_a_mathrl_key(app_client: Any) -> None:
    key = _tinker(admin_key(app_client))
    assert app_client.post("/api/v1/client/config", json={"sdk_version": "0.38.0"}, headers=key).status_code == 200
    bare = {"X-API-Key": key["X-API-Key"].removeprefix("tml-")}
    assert app_client.post("/api/v1/client/config", json={}, headers=bare).status_code == 200
    r = app_client.post("/api/v1/client/config", json={})
    assert r.status_code == 401 and r.headers["content-type"].startswith("application/problem+json"), r.text
    r = app_client.post("/api/v1/create_session", json={}, headers={"X-API-Key": f"tml-{ADMIN_TOKEN}"})
    assert r.status_code == 403 and "project" in r.json()["detail"], r.text
    r = app_client.post("/api/v1/create_session", json={"tags": []}, headers=key)
    assert r.status_code == 200 and r.json()["session_id"], r.text


@pytest.mark.parametrize(
    ("route", "body", "pointer"),
    [
        ("create_model", {"session_id": "s", "model_seq_id": "one", "base_model": "org/m"}, "/model_seq_id"),
        ("create_model", {"session_id": "s", "base_model": "org/m", "lora_config": [8]}, "/lora_config"),
        ("create_model", {"session_id": "s", "optimizer_config": {"type": "dimuon"}}, "/optimizer_config/type"),
        ("create_model", {"session_id": "s", "model_seq_id": 0}, "/model"),
        ("create_model", {"session_id": "s", "base_model": "org/m", "lora_config": {"rank": 0}}, "/lora_rank"),
        ("load_weights", {"session_id": "s", "path": "/etc/passwd"}, "/path"),
        ("create_sampling_session", {"session_id": "s", "sampling_session_seq_id": 0}, "/base_model"),
    ],
)
def test_a_call_that_cannot_be_served_is_a_400_naming_the_field(
    app_client: Any, route: str, body: dict[str, Any], pointer: str
) -> None:
    r = app_client.post(f"/api/v1/{route}", json=body, headers=_tinker(admin_key(app_client)))
    assert r.status_code == 400, r.text
    assert r.json()["errors"][0]["pointer"] == pointer, r.json()


def test_a_forward_backward_chunk_may_be_larger_than_other_requests(app_client: Any) -> None:
    """The SDK sends a batch's data in chunks of up to about 5 MB, which it cannot be told to make
    smaller: 1 MB (max_request_bytes) refused an ordinary RL batch with 413 at its first call."""
    key = _tinker(admin_key(app_client))
    body = {"forward_backward_input": {"data": [], "pad": "x" * 3_000_000}, "model_id": "s:train:0", "seq_id": 1}
    r = app_client.post("/api/v1/forward_backward", json=body, headers=key)
    assert r.status_code == 400 and "model_id" in r.json()["detail"], r.text  # read whole, then answered
    r = app_client.post("/api/v1/optim_step", json={**body, "adam_params": {}}, headers=key)
    assert r.status_code == 413, r.text
    from fastapi.testclient import TestClient  # behind a proxy's prefix: the same route, the same limit

    prefixed = TestClient(app_client.app, root_path="/mathrl")
    assert prefixed.post("/mathrl/api/v1/forward_backward", json=body, headers=key).status_code == 400
    protobuf = {**key, "content-type": "application/x-protobuf"}
    r = app_client.post("/api/v1/forward_backward", content=b"\x0a\x01\xff", headers=protobuf)  # a 500 before
    assert r.status_code == 400 and "carries no model_id" in r.json()["detail"], r.text
    for cut in (b"\x0a", b"\x0a\xff", b"\x08" + b"\xff" * 11):  # a length, a varint or a key cut short / too long
        r = app_client.post("/api/v1/forward_backward", content=cut, headers=protobuf)
        assert r.status_code == 400 and "cut short" in r.json()["detail"], (cut, r.text)


def test_what_is_not_in_the_project_is_a_404(app_client: Any) -> None:
    key = _tinker(admin_key(app_client))
    missing = "01a00000-0000-7000-8000-000000000000"
    for route, body in [
        ("get_info", {"model_id": "s:train:0"}),
        ("optim_step", {"model_id": "s:train:0", "seq_id": 1, "adam_params": {}}),
        ("retrieve_future", {"request_id": f"{missing}:1"}),
        ("asample", {"sampling_session_id": f"{missing}:sample:0", "num_samples": 1}),
        ("load_weights", {"session_id": "s", "path": "tinker://s:train:0/weights/final"}),
        ("sessions/s/finish", {"reason": {"type": "success"}}),
    ]:
        r = app_client.post(f"/api/v1/{route}", json=body, headers=key)
        assert r.status_code == 404, (route, r.text)
    r = app_client.post("/api/v1/session_heartbeat", json={"session_id": "s"}, headers=key)
    assert r.status_code == 200, r.text  # a session with no client yet: nothing to keep alive


def test_another_projects_session_id_is_refused_not_taken(app_client: Any) -> None:
    """Issue 69.6: create_model with another project's session id made a job in the caller's own project,
    named after the other project's session."""
    from sqlalchemy import text

    from tests.helpers.api import db

    mine, theirs = _tinker(admin_key(app_client)), _tinker(admin_key(app_client))
    session = app_client.post("/api/v1/create_session", json={}, headers=mine).json()["session_id"]
    body = {"session_id": session, "model_seq_id": 0, "base_model": "tiny:2x64", "lora_config": {"rank": 4}}
    r = app_client.post("/api/v1/create_model", json=body, headers=mine)
    assert r.status_code == 200 and r.json()["model_id"] == f"{session}:train:0", r.text
    for route, extra in [
        ("create_model", {"model_seq_id": 1}),
        ("create_sampling_session", {"sampling_session_seq_id": 0}),
    ]:
        r = app_client.post(f"/api/v1/{route}", json={**body, **extra}, headers=theirs)
        assert r.status_code == 404 and r.json()["errors"][0]["pointer"] == "/session_id", (route, r.text)
        assert "create_session" in r.json()["detail"], r.text
    with db(app_client).connect() as c:
        held = c.execute(text("SELECT count(DISTINCT project_id) FROM jobs WHERE name LIKE :n"), {"n": f"{session}:%"})
        assert held.scalar_one() == 1  # the other project made no job under it
    r = app_client.post("/api/v1/create_model", json={**body, "model_seq_id": 1}, headers=mine)
    assert r.status_code == 200, r.text  # the owner goes on
    fresh = app_client.post("/api/v1/create_session", json={}, headers=theirs).json()["session_id"]
    r = app_client.post("/api/v1/create_model", json={**body, "session_id": fresh}, headers=theirs)
    assert r.status_code == 200, r.text


def test_a_body_that_is_not_json_is_a_400(app_client: Any) -> None:
    key = _tinker(admin_key(app_client))
    r = app_client.post("/api/v1/create_model", content=b"\xff{", headers={**key, "Content-Type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["detail"], r.text
    r = app_client.post("/api/v1/forward_backward", content=b"\x0a\xff", headers=key)
    assert r.status_code == 400 and "forward_backward" in r.json()["detail"], r.text
    for op in ("create_model", "optim_step", "asample", "retrieve_future"):  # 5 KB nested 5,000 deep: a 500
        r = app_client.post(f"/api/v1/{op}", content=b"[" * 5000, headers={**key, "Content-Type": "application/json"})
        assert r.status_code == 400 and "nests too deeply" in r.json()["detail"], (op, r.text)


def test_the_rest_clients_reads_are_the_projects_runs_and_refuse_what_is_not_served(app_client: Any) -> None:
    """api/routers/tinker_runs.py: with no session yet, the project has no runs and no saves; a run
    or save it does not hold is a 404; a weights_info without a path names the field; deleting,
    publishing a save of its own run or setting its TTL is a 400 that says it is not served."""
    owner = admin_key(app_client)
    key = _tinker(owner)
    r = app_client.get("/api/v1/training_runs", params={"limit": 5}, headers=key)
    assert r.status_code == 200 and r.json() == {
        "training_runs": [],
        "cursor": {"offset": 0, "limit": 5, "total_count": 0},
    }, r.text
    assert app_client.get("/api/v1/checkpoints", headers=key).json()["checkpoints"] == []
    assert app_client.get("/api/v1/training_runs", params={"limit": 0}, headers=key).status_code == 422
    for path in ("/api/v1/training_runs/s:train:0", "/api/v1/training_runs/s:train:0/checkpoints"):
        r = app_client.get(path, headers=key)
        assert r.status_code == 404 and "training_run_id" in r.json()["detail"], r.text
    r = app_client.post("/api/v1/weights_info", json={}, headers=key)
    assert r.status_code == 400 and r.json()["errors"][0]["pointer"] == "/tinker_path", r.text
    r = app_client.post("/api/v1/weights_info", json={"tinker_path": "tinker://s:train:0/weights/w"}, headers=key)
    assert r.status_code == 404, r.text
    save = "/api/v1/training_runs/s:train:0/checkpoints/weights/w"
    assert app_client.delete(save, headers=key).status_code == 404  # no such run in the project
    spec = {"kind": "session", "model": "org/model", "session": "s", "name": "s:train:0"}
    made = app_client.post("/v1/jobs", json={**spec, "resources": {"pool": "routes-parked"}}, headers=owner)
    assert made.status_code == 201, made.text  # a training run of the project's own, parked: no worker serves it
    for method, path, what in [
        ("DELETE", save, "deleting"),
        ("POST", save + "/publish", "publishing"),
        ("DELETE", save + "/publish", "publishing"),
        ("PUT", save + "/ttl", "TTL"),
    ]:
        r = app_client.request(method, path, headers=key)
        assert r.status_code == 400 and what in r.json()["detail"] and "not served" in r.json()["detail"], r.text
    assert app_client.get("/api/v1/training_runs").status_code == 401


def test_a_project_reads_a_few_forward_backward_bodies_at_once(
    app_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """32 concurrent 32 MiB forward_backward calls of one tenant were all read into the API's memory
    (~1 GiB, the chart's limit for an API pod). A project's calls past LARGE_CALLS_PER_PROJECT wait,
    their bytes unread; another project's go on."""
    import anyio
    import httpx
    from fastapi import Response

    from api.routers import tinker

    now, most = 0, 0

    async def forward(settings: Any, at: Any, op: str, body: bytes, content_type: str) -> Response:
        nonlocal now, most
        now += 1
        most = max(most, now)
        await anyio.sleep(0.2)  # the session's compute
        now -= 1
        return Response(b"{}", 200, media_type="application/json")

    async def job(settings: Any, caller: Any, model_id: str) -> str:
        return model_id

    monkeypatch.setattr(tinker, "forward", forward)
    monkeypatch.setattr(tinker, "model_job", job)
    monkeypatch.setattr(tinker, "proto_model_id", lambda body: "s:train:0")
    key = _tinker(admin_key(app_client))

    async def calls() -> list[int]:
        transport = httpx.ASGITransport(app=app_client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            codes: list[int] = []

            async def one() -> None:
                r = await client.post("/api/v1/forward_backward", content=b"\x0a\x01s", headers=key)
                codes.append(r.status_code)

            async with anyio.create_task_group() as tg:
                for _ in range(3 * tinker.LARGE_CALLS_PER_PROJECT):
                    tg.start_soon(one)
            return codes

    codes = anyio.run(calls)
    assert codes == [200] * (3 * tinker.LARGE_CALLS_PER_PROJECT), codes
    assert most == tinker.LARGE_CALLS_PER_PROJECT, most


def test_one_projects_long_polls_do_not_hold_the_calls_of_another(
    app_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every project's forwarded calls shared one pool of httpx's 100 connections: a tenant holding
    100 retrieve_future long polls (20 s each, re-sent as they end) made another project's calls wait
    40 s for a connection, then fail with 503. A project's calls in flight are capped now
    (FORWARDS_PER_PROJECT); another project's go on. The session process here is a real HTTP server
    on loopback that holds the first project's calls as a long poll does."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from types import SimpleNamespace

    import anyio
    import httpx

    from api.routers import tinker
    from api.tinker import forwarding
    from api.tinker.common import Located
    from api.tinker.forwarding import FORWARDS_PER_PROJECT

    beats: list[str] = []

    class Session(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path.endswith("/session_heartbeat"):
                beats.append(self.path)
            if b"slow" in body:
                time.sleep(4)  # a long poll with no result yet
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 512  # every call's connection at once (socketserver's default backlog is 5)
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Session)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"

    async def located(settings: Any, caller: Any, value: str, what: str) -> Any:
        job = SimpleNamespace(id=value.split(":")[0], project_id=caller.project_id, status="running")
        return Located(job, (url, "token"))  # type: ignore[arg-type]

    monkeypatch.setattr(tinker, "id_job", located)

    def session_jobs(settings: Any, project_id: str, session_id: str) -> list[Any]:
        job = SimpleNamespace(id="j", project_id=project_id, status="running", spec={"session": session_id})
        return [Located(job, (url, "token"))]  # type: ignore[arg-type]

    monkeypatch.setattr(tinker, "session_jobs", session_jobs)
    monkeypatch.setattr(forwarding, "_client", None)  # a client of this test's event loop
    monkeypatch.setattr(forwarding, "FORWARD_WAIT_SECONDS", 1.0)
    noisy, other = _tinker(admin_key(app_client)), _tinker(admin_key(app_client))
    many = 100 + 20  # past httpx's default pool

    async def calls() -> tuple[float, list[int]]:
        transport = httpx.ASGITransport(app=app_client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            codes: list[int] = []

            async def poll() -> None:
                body = {"request_id": "j:1", "slow": True}
                codes.append((await client.post("/api/v1/retrieve_future", json=body, headers=noisy)).status_code)

            async with anyio.create_task_group() as tg:
                for _ in range(many):
                    tg.start_soon(poll)
                await anyio.sleep(1.5)  # the polls are in flight
                t0 = time.monotonic()
                r = await client.post("/api/v1/retrieve_future", json={"request_id": "k:1"}, headers=other)
                took = time.monotonic() - t0
                assert r.status_code == 200, r.text
                # the busy project's own heartbeat is not held up behind its polls: its session lives on
                beat = await client.post("/api/v1/session_heartbeat", json={"session_id": "s"}, headers=noisy)
                assert beat.status_code == 200 and beats, (beat.text, beats)
            await forwarding._http().aclose()
            return took, codes

    try:
        took, codes = anyio.run(calls)
    finally:
        server.shutdown()
    assert took < 1.0, took  # before: it waited for the first project's polls to end (4 s)
    assert sorted(codes) == [200] * FORWARDS_PER_PROJECT + [429] * (many - FORWARDS_PER_PROJECT), codes
