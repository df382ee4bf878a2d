"""Both clients come from one source (mathrl/_transport.py runs the operations of
mathrl/client.py on httpx.Client or httpx.AsyncClient; issue 44.6). These fail if they drift
apart: a method on one side only, other parameters, defaults or types, other requests sent or
other answers read (a scripted API here, on httpx.MockTransport; tests/unit/mathrl/test_client.py
runs both against the real routes)."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from mathrl import client as sdk

pytestmark = pytest.mark.quick


# what only the spelling of the async side changes
_ASYNC_NAMES = {"close": "aclose"}


def _twins() -> list[tuple[type, type]]:
    """Every public class X of mathrl.client with an AsyncX."""
    return [
        (cls, getattr(sdk, f"Async{name}"))
        for name, cls in vars(sdk).items()
        if isinstance(cls, type) and cls.__module__ == sdk.__name__ and hasattr(sdk, f"Async{name}")
    ]


def test_every_sync_class_has_an_async_twin() -> None:
    names = {sync.__name__ for sync, _ in _twins()}
    assert names == {"Client", "Jobs", "Pipelines", "Scores", "Graders", "Keys"}, names


@pytest.mark.parametrize(("sync", "async_"), _twins(), ids=[s.__name__ for s, _ in _twins()])
def test_each_public_method_has_an_async_twin_with_the_same_signature(sync: type, async_: type) -> None:
    def public(cls: type) -> dict[str, Any]:
        return {n: f for n, f in inspect.getmembers(cls, callable) if not n.startswith("_")}

    want, have = public(sync), public(async_)
    assert sorted(_ASYNC_NAMES.get(n, n) for n in want) == sorted(have), (sorted(want), sorted(have))
    for name, method in want.items():
        twin = have[_ASYNC_NAMES.get(name, name)]
        sig, async_sig = inspect.signature(method, eval_str=True), inspect.signature(twin, eval_str=True)
        assert list(sig.parameters.values()) == list(async_sig.parameters.values()), (name, sig, async_sig)
        returns, async_returns = sig.return_annotation, async_sig.return_annotation
        if getattr(returns, "__origin__", None) is Iterator:  # an iterator: an async iterator of the same
            assert async_returns == AsyncIterator[returns.__args__[0]], (name, sig, async_sig)
            assert not inspect.iscoroutinefunction(twin), name
        else:  # a value: a coroutine of the same
            assert returns == async_returns and inspect.iscoroutinefunction(twin), (name, sig, async_sig)
    init, async_init = inspect.signature(sync.__init__), inspect.signature(async_.__init__)
    assert [(p.name, p.default) for p in init.parameters.values()] == [
        (p.name, p.default) for p in async_init.parameters.values()
    ]


def test_both_clients_hold_the_twin_resources() -> None:
    c = sdk.Client("http://x", api_key="k", transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    ac = sdk.AsyncClient("http://x", api_key="k", transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    twins = dict(_twins())
    assert vars(c).keys() == vars(ac).keys()
    for name, value in vars(c).items():
        if type(value) in twins:
            assert type(getattr(ac, name)) is twins[type(value)], name
    assert c.headers == ac.headers == {"Authorization": "Bearer k"} and c.base_url == ac.base_url == "http://x"
    c.close()
    asyncio.run(ac.aclose())


_T0 = "2026-01-01T00:00:00Z"


def _job(job_id: str, status: str = "queued") -> dict[str, Any]:
    return {
        "id": job_id, "project_id": "p", "kind": "eval", "name": None, "status": status, "tags": [], "spec": {},
        "resolved_config": None, "queue": "q", "attempts": 0, "max_attempts": 1, "cancel_requested": False,
        "error": None, "created_at": _T0, "started_at": None, "finished_at": None,
    }  # fmt: skip


def _event(seq: int, type_: str) -> dict[str, Any]:
    return {"seq": seq, "job_id": "j1", "time": _T0, "level": "info", "type": type_, "message": type_, "data": None}


def _series(name: str, step: int) -> dict[str, Any]:
    return {"name": name, "points": [{"step": step, "value": step / 10, "time": _T0}]}


class _FakeAPI:
    """Canned answers for one run of `_script`, and the requests that asked for them."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str, str, str | None, str | None]] = []
        self.retrieves = 0

    def __call__(self, r: httpx.Request) -> httpx.Response:
        r.read()
        query = dict(r.url.params)
        self.sent.append(
            (r.method, r.url.path, str(r.url.query, "ascii"), r.content.decode(),
             r.headers.get("authorization"), r.headers.get("idempotency-key"))
        )  # fmt: skip
        match r.method, r.url.path:
            case "GET", "/v1/jobs":
                if query.get("cursor") == "c1":
                    return httpx.Response(200, json={"data": [_job("j2")], "next_cursor": None})
                return httpx.Response(200, json={"data": [_job("j1")], "next_cursor": "c1"})
            case "POST", "/v1/jobs":
                return httpx.Response(201, json=_job("j1"))
            case "GET", "/v1/jobs/j1":
                self.retrieves += 1
                return httpx.Response(200, json=_job("j1", "running" if self.retrieves == 1 else "succeeded"))
            case "GET", "/v1/jobs/j1/metrics":
                if query.get("after_step") == "1":
                    data, cursor = [_series("loss", 2), _series("acc", 2)], None
                else:
                    data, cursor = [_series("loss", 1)], 1
                return httpx.Response(200, json={"data": data, "next_cursor": cursor})
            case "GET", "/v1/jobs/j1/events/stream":
                sse = "".join(f"data: {json.dumps(e)}\n\n" for e in [_event(1, "queued"), _event(2, "succeeded")])
                return httpx.Response(200, text=": keep-alive\n\n" + sse)
            case "GET", "/v1/jobs/j1/results":
                return httpx.Response(200, text='{"prompt": "1+1", "completion": "2"}\n\n{"prompt": "2+2"}\n')
            case "POST", "/v1/graders:run":
                return httpx.Response(202, json={"job_id": "g1", "status": "queued", "detail": "running"})
            case "GET", "/v1/graders/runs/g1":
                return httpx.Response(200, json={"data": [{"score": 1.0, "reason": "ok"}], "mean": 1.0, "job_id": "g1"})
            case "DELETE", "/v1/keys/k1":
                return httpx.Response(204)
        return httpx.Response(404, json={"title": "Not Found", "detail": f"no {r.url.path}", "errors": []})


def _results(*outs: Any) -> list[Any]:
    """Answers as plain data, to compare across the two clients."""

    def plain(x: Any) -> Any:
        if isinstance(x, list):
            return [plain(i) for i in x]
        return x.model_dump(mode="json") if hasattr(x, "model_dump") else x

    return [plain(o) for o in outs]


def _errors(*calls: Any) -> list[tuple[int, str]]:
    out = []
    for call in calls:
        try:
            call()
        except sdk.MathRLError as exc:
            out.append((exc.status, str(exc)))
    return out


def test_the_sync_and_async_clients_send_the_same_requests_and_read_the_same_answers() -> None:
    sync_api, async_api = _FakeAPI(), _FakeAPI()
    c = sdk.Client("http://x", api_key="k", transport=httpx.MockTransport(sync_api))
    sync_out = _results(
        list(c.jobs.list(tag="t", page_size=1)),
        c.jobs.create({"kind": "eval"}, idempotency_key="once"),
        c.jobs.metrics("j1"),
        list(c.jobs.follow("j1")),
        c.jobs.results("j1"),
        c.graders.run({"type": "exact"}, [{"completion": "2", "answer": "2"}], poll=0),
        c.keys.revoke("k1"),
        c.jobs.wait("j1", poll=0),
    ) + _errors(lambda: c.jobs.retrieve("j9"), lambda: list(c.jobs.follow("j9")), lambda: c.jobs.results("j9"))

    async def run_async() -> list[Any]:
        async with sdk.AsyncClient("http://x", api_key="k", transport=httpx.MockTransport(async_api)) as ac:
            out = _results(
                [j async for j in ac.jobs.list(tag="t", page_size=1)],
                await ac.jobs.create({"kind": "eval"}, idempotency_key="once"),
                await ac.jobs.metrics("j1"),
                [e async for e in ac.jobs.follow("j1")],
                await ac.jobs.results("j1"),
                await ac.graders.run({"type": "exact"}, [{"completion": "2", "answer": "2"}], poll=0),
                await ac.keys.revoke("k1"),
                await ac.jobs.wait("j1", poll=0),
            )
            for call in (ac.jobs.retrieve("j9"), _drain(ac.jobs.follow("j9")), ac.jobs.results("j9")):
                try:
                    await call
                except sdk.MathRLError as exc:
                    out.append((exc.status, str(exc)))
            return out

    assert asyncio.run(run_async()) == sync_out
    assert async_api.sent == sync_api.sent
    # and what they sent and read is the API's: the cursor loops, the stream, the poll
    jobs, created, metrics, events, results, graded, revoked, waited, *errors = sync_out
    assert [j["id"] for j in jobs] == ["j1", "j2"] and created["id"] == "j1"
    assert [(s["name"], [p["step"] for p in s["points"]]) for s in metrics] == [("acc", [2]), ("loss", [1, 2])]
    assert [e["type"] for e in events] == ["queued", "succeeded"]
    assert results == [{"prompt": "1+1", "completion": "2"}, {"prompt": "2+2"}]
    assert graded["mean"] == 1.0 and revoked is None and waited["status"] == "succeeded"
    assert errors == [(404, "404 Not Found: no /v1/jobs/j9")] + [
        (404, "404 Not Found: no /v1/jobs/j9/events/stream")
    ] + [(404, "404 Not Found: no /v1/jobs/j9/results")]
    requests = [(method, path, query) for method, path, query, *_ in sync_api.sent]
    assert requests[:2] == [("GET", "/v1/jobs", "tag=t&limit=1"), ("GET", "/v1/jobs", "tag=t&limit=1&cursor=c1")]
    assert ("GET", "/v1/jobs/j1/metrics", "after_step=1") in requests
    assert requests[-6:-3] == [
        ("GET", "/v1/jobs/j1", ""),
        ("GET", "/v1/jobs/j1/events/stream", f"after={2**63 - 1}"),
        ("GET", "/v1/jobs/j1", ""),
    ]
    assert {auth for *_, auth, _ in sync_api.sent} == {"Bearer k"}
    assert [key for *_, key in sync_api.sent if key] == ["once"]


async def _drain(events: AsyncIterator[Any]) -> None:
    async for _ in events:
        pass


class _Flaky:
    """A scripted API whose answers to each path come from a list, in order: a status (with its
    headers) or an exception to raise. It records each request's path and Idempotency-Key."""

    def __init__(self, script: dict[str, list[Any]]) -> None:
        self.script = {path: list(answers) for path, answers in script.items()}
        self.sent: list[tuple[str, str | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.url.path, request.headers.get("idempotency-key")))
        answer = self.script[request.url.path].pop(0)
        if isinstance(answer, Exception):
            raise answer
        status, headers = answer
        body = {"title": "t", "detail": "d"} if status >= 400 else _job("j1")
        return httpx.Response(status, json=body, headers=headers)


def test_the_clients_retry_what_may_succeed_and_raise_a_class_per_status() -> None:
    """Issue 68.6: 408, 409, 429 and 5xx are sent again (twice by default, after Retry-After), and a
    lost connection too; an answer saying x-should-retry: false is final; a create carries one
    Idempotency-Key across its tries, made by the client when the caller gives none; the error
    raised is the status's class (NotFoundError, RateLimitError, ...), still a MathRLError."""
    from mathrl import errors

    again, final = {"Retry-After": "0"}, {"x-should-retry": "false"}
    script = {
        "/v1/jobs": [httpx.ConnectError("refused"), (503, again), (201, {})],
        "/v1/jobs/busy": [(429, again)] * 3,
        "/v1/jobs/ended": [(409, final)],
        "/v1/jobs/gone": [(404, {})],
        "/v1/jobs/bad": [(422, {})],
        "/v1/keys": [(503, again)],
    }
    expected = [
        ("created", "j1"),
        errors.RateLimitError,
        errors.ConflictError,
        errors.NotFoundError,
        errors.UnprocessableEntityError,
        errors.InternalServerError,
    ]

    def outcome(call: Any) -> Any:
        try:
            return ("created", call()["id"])
        except sdk.MathRLError as exc:
            return type(exc)

    sync_api = _Flaky(script)
    c = sdk.Client("http://x", transport=httpx.MockTransport(sync_api))
    calls = [
        lambda: c.jobs.create({"kind": "eval"}).model_dump(),
        lambda: c.jobs.retrieve("busy"),
        lambda: c.jobs.retrieve("ended"),
        lambda: c.jobs.retrieve("gone"),
        lambda: c.jobs.retrieve("bad"),
        lambda: c.keys.create(name="x"),  # the API keeps no key for it: sent once
    ]
    assert [outcome(call) for call in calls] == expected

    async def run_async() -> tuple[list[Any], _Flaky]:
        api = _Flaky(script)
        async with sdk.AsyncClient("http://x", transport=httpx.MockTransport(api)) as ac:
            out = []
            for coro in (
                ac.jobs.create({"kind": "eval"}),
                ac.jobs.retrieve("busy"),
                ac.jobs.retrieve("ended"),
                ac.jobs.retrieve("gone"),
                ac.jobs.retrieve("bad"),
                ac.keys.create(name="x"),
            ):
                try:
                    out.append(("created", (await coro).id))
                except sdk.MathRLError as exc:
                    out.append(type(exc))
            return out, api

    async_out, async_api = asyncio.run(run_async())
    assert async_out == expected
    for api in (sync_api, async_api):
        paths = [path for path, _ in api.sent]
        assert paths == ["/v1/jobs"] * 3 + ["/v1/jobs/busy"] * 3 + [
            "/v1/jobs/ended",
            "/v1/jobs/gone",
            "/v1/jobs/bad",
            "/v1/keys",
        ]
        keys = {key for path, key in api.sent if path == "/v1/jobs"}
        assert len(keys) == 1 and next(iter(keys)).startswith("mathrl-sdk-")  # one key, made by the client
    assert issubclass(errors.NotFoundError, sdk.MathRLError)
    once = _Flaky({"/v1/jobs/busy": [(503, again)]})
    with pytest.raises(errors.InternalServerError):
        sdk.Client("http://x", transport=httpx.MockTransport(once), max_retries=0).jobs.retrieve("busy")
    assert len(once.sent) == 1
