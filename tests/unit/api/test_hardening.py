"""Hardening, round three (issue 31, items 2-5): bounded query parameters and streams that
fail before they start, finite and bounded spec numbers, IPv4 addresses embedded in IPv6,
and the smaller gaps around keys, job references, unkeyed floods and streams per project.
RELIABILITY.md's "Abuse" table lists each guarantee with its test here.
"""

from __future__ import annotations

import logging
import math
import socket
import types
import uuid
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from annotated_types import Ge, Gt, Le, Lt, MaxLen
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from sqlalchemy import text

from api.problems import openai_paths
from tests.helpers.api import admin_key, db, make_objects, overridden, project_jobs
from tests.helpers.env import ADMIN_TOKEN
from tests.helpers.jobs import PARKED, parked_eval, parked_grpo

pytestmark = pytest.mark.quick


# --- item 2: integer query parameters are bounded; a stream fails before it starts ----------


def _numeric_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """The integer/number part of a parameter's schema (plain, or a member of anyOf)."""
    for s in [schema, *schema.get("anyOf", [])]:
        if s.get("type") in ("integer", "number"):
            return s
    return None


def _bounds(s: dict[str, Any]) -> tuple[float | None, float | None]:
    low = s.get("minimum", s.get("exclusiveMinimum"))
    high = s.get("maximum", s.get("exclusiveMaximum"))
    return low, high


def _ids_for(app_client: Any, h: dict[str, str]) -> dict[str, str]:
    return make_objects(app_client, h)


def test_every_numeric_query_parameter_is_bounded_and_named_when_out_of_range(app_client: Any) -> None:
    """Enumerated from app.openapi(): a new integer (or number) query parameter without both
    bounds fails here; one past either bound is a 422 (400 on OpenAI's routes) whose error points at it."""
    h = admin_key(app_client)
    ids = _ids_for(app_client, h)
    checked: list[str] = []
    for path, item in app_client.app.openapi()["paths"].items():
        for method, op in item.items():
            for param in op.get("parameters", []):
                numeric = _numeric_schema(param.get("schema", {}))
                if param.get("in") != "query" or numeric is None:
                    continue
                name = param["name"]
                low, high = _bounds(numeric)
                assert low is not None and high is not None, f"{method.upper()} {path}: ?{name} has no bounds"
                for value in (high + 1, low - 1):
                    body = {} if "requestBody" in op else None
                    r = app_client.request(
                        method.upper(), path.format(**ids), params={name: value}, headers=h, json=body
                    )
                    want = 400 if path.startswith(openai_paths()) else 422  # OpenAI's routes answer as OpenAI does
                    assert r.status_code == want, (path, name, value, r.status_code, r.text[:300])
                    pointers = [e["pointer"] for e in r.json()["errors"]]
                    assert f"query:/{name}" in pointers, (path, name, r.text)
                checked.append(f"{method.upper()} {path}?{name}")
    assert len(checked) >= 8, checked


@pytest.mark.parametrize(
    "params",
    [
        {"after": 2**63},
        {"metrics": "true", "metrics_after_step": 2**31},
        {"after": 9223372036854775808, "metrics": "true"},
    ],
)
def test_a_stream_with_an_out_of_range_parameter_is_422_before_it_starts(
    app_client: Any, params: dict[str, Any]
) -> None:
    """Issue 31.2: these were answered 200, then the connection dropped (bigint out of range)."""
    h = admin_key(app_client)
    job_id = app_client.post("/v1/jobs", json=parked_eval(), headers=h).json()["id"]
    r = app_client.get(f"/v1/jobs/{job_id}/events/stream", params=params, headers=h)
    name = next(k for k in params if k != "metrics")
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json", r.text
    assert r.json()["errors"][0]["pointer"] == f"query:/{name}", r.text


@pytest.mark.parametrize(
    ("route", "name", "bad", "edge"),
    [
        ("events", "after", 9223372036854775808, 2**63 - 1),
        ("metrics", "after_step", 12741188109, 2**31 - 1),
        ("samples", "step", 2147483648, 2**31 - 1),
    ],
)
def test_out_of_range_query_parameters_are_422_naming_them(
    app_client: Any, route: str, name: str, bad: int, edge: int
) -> None:
    """Issue 31.2: these were 422 'a character that cannot be stored (NUL)' pointing at '/'."""
    h = admin_key(app_client)
    job_id = app_client.post("/v1/jobs", json=parked_eval(), headers=h).json()["id"]
    r = app_client.get(f"/v1/jobs/{job_id}/{route}", params={name: bad}, headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == f"query:/{name}", r.text
    assert "NUL" not in r.text
    assert app_client.get(f"/v1/jobs/{job_id}/{route}", params={name: edge}, headers=h).status_code == 200


def test_a_database_error_in_a_started_stream_ends_it_cleanly(app_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the headers are sent, an error cannot become a problem response: the stream ends
    (with a comment saying why) instead of an unhandled exception dropping the connection."""
    from sqlalchemy.exc import DataError

    import api.job_stream as job_stream

    h = admin_key(app_client)
    job_id = app_client.post("/v1/jobs", json=parked_eval(), headers=h).json()["id"]  # parked: never ends
    real = job_stream.events_after
    calls: list[int] = []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            raise DataError("SELECT", {}, Exception("value out of range"))
        return real(*args, **kwargs)

    monkeypatch.setattr(job_stream, "events_after", flaky)
    r = app_client.get(f"/v1/jobs/{job_id}/events/stream", headers=h)
    assert r.status_code == 200
    assert "event: queued" in r.text and r.text.rstrip().splitlines()[-1].startswith(":"), r.text
    assert len(calls) == 2


# --- item 3: non-finite and unbounded numbers in specs --------------------------------------


def _all_models() -> list[type[BaseModel]]:
    from mathrl.specs import AnySpec, PipelineSpec

    seen: dict[type[BaseModel], None] = {}

    def walk(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp in seen:
                return
            seen[tp] = None
            for f in tp.model_fields.values():
                walk(f.annotation)
            return
        for arg in get_args(tp):
            walk(arg)

    walk(AnySpec)
    walk(PipelineSpec)
    return list(seen)


# lower bounds checked on the resolved value by mathrl.specs.presets.resolve_grpo, with a message of its own
LOWER_BOUND_IN_RESOLVER = {"GRPOSpec.beta", "GRPOSpec.num_generations", "GRPOSpec.delta"}


def _unbounded(tp: Any, metadata: list[Any], where: str) -> list[str]:
    origin = get_origin(tp)
    if origin is Annotated:
        base, *extra = get_args(tp)
        meta = list(metadata)
        for e in extra:
            meta.extend(e.metadata if isinstance(e, FieldInfo) else [e])
        return _unbounded(base, meta, where)
    if origin in (Union, types.UnionType):
        return [p for a in get_args(tp) if a is not type(None) for p in _unbounded(a, metadata, where)]
    if tp is bool or origin is Literal or (isinstance(tp, type) and issubclass(tp, BaseModel)):
        return []
    if tp in (int, float):
        out = (
            [] if any(isinstance(m, (Le, Lt)) for m in metadata) else [f"{where}: {tp.__name__} without an upper bound"]
        )
        if not any(isinstance(m, (Ge, Gt)) for m in metadata) and where not in LOWER_BOUND_IN_RESOLVER:
            out.append(f"{where}: {tp.__name__} without a lower bound")
        return out
    if origin in (list, dict, set, tuple):
        out = [] if any(isinstance(m, MaxLen) for m in metadata) else [f"{where}: {origin.__name__} without max_length"]
        return out + _unbounded(get_args(tp)[-1], [], f"{where}[]")
    return []


def test_every_number_and_list_of_a_spec_is_bounded() -> None:
    """Issue 31.3: k (150,000 entries), lora.target_modules (50,000), seeds, logging_steps and
    dataset.limit (10^30) were accepted. Every int, float, list and dict of every model a spec
    is made of (the graders' and recipes' included) has both bounds / a max_length."""
    models = _all_models()
    assert len(models) >= 15, models
    gaps = [
        p
        for m in models
        for name, f in m.model_fields.items()
        for p in _unbounded(f.annotation, list(f.metadata), f"{m.__name__}.{name}")
    ]
    assert not gaps, "\n".join(gaps)


def _mentions_float(tp: Any) -> bool:
    return tp is float or any(_mentions_float(a) for a in get_args(tp))


def test_every_float_field_refuses_nan_and_infinity() -> None:
    checked = []
    for m in _all_models():
        for name, f in m.model_fields.items():
            if not _mentions_float(f.annotation):
                continue
            for value in (math.inf, -math.inf, math.nan):
                with pytest.raises(ValidationError) as err:
                    m.model_validate({f.alias or name: value})
                assert any(e["loc"][:1] == (f.alias or name,) for e in err.value.errors()), (m.__name__, name, value)
            checked.append(f"{m.__name__}.{name}")
    assert "GRPOSpec.beta" in checked and "GRPOSpec.delta" in checked and len(checked) >= 15, checked


@pytest.mark.parametrize(
    ("raw", "pointer"),
    [
        ('"beta": Infinity', "/beta"),
        ('"beta": NaN', "/beta"),
        ('"delta": Infinity', "/delta"),
        ('"beta": -Infinity', "/beta"),
        ('"learning_rate": NaN', "/learning_rate"),
    ],
)
def test_nan_and_infinity_in_a_body_are_422_naming_the_field(app_client: Any, raw: str, pointer: str) -> None:
    """Issue 31.3: {"beta": Infinity} was 201 and stored as null (JSON has no Infinity; Python's
    parser reads it anyway)."""
    h = admin_key(app_client)
    body = (
        '{"kind": "grpo", "model": "org/m", "dataset": {"name": "gsm8k-train"}, '
        + raw
        + ', "resources": {"pool": "abuse-parked"}}'
    )
    r = app_client.post("/v1/jobs", content=body, headers={**h, "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == pointer, r.text
    assert project_jobs(app_client, h) == []


@pytest.mark.parametrize(
    ("spec", "pointer"),
    [
        (parked_eval(k=[1] * 150_000), "/k"),
        (parked_eval(sampling={"temperature": 1, "n": 8}, k=[0]), "/k/0"),
        (parked_grpo(lora={"target_modules": ["q_proj"] * 50_000}), "/lora/target_modules"),
        (parked_grpo(seed=2**64), "/seed"),
        (parked_eval(sampling={"seed": 10**30}), "/sampling/seed"),
        (parked_grpo(logging_steps=10**30), "/logging_steps"),
        (parked_grpo(dataset={"name": "gsm8k-train", "limit": 10**30}), "/dataset/limit"),
        (parked_grpo(beta=1e300), "/beta"),
        (parked_grpo(beta=-0.5), "/beta"),
        (parked_grpo(delta=1e300), "/delta"),
        (parked_grpo(num_generations=10**9), "/num_generations"),
        (parked_grpo(global_batch_size=10**12), "/global_batch_size"),
    ],
)
def test_unbounded_spec_fields_now_have_bounds(app_client: Any, spec: dict[str, Any], pointer: str) -> None:
    h = admin_key(app_client)
    r = app_client.post("/v1/jobs", json=spec, headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == pointer, r.text[:500]
    assert project_jobs(app_client, h) == []


# --- item 4: IPv4 addresses embedded in IPv6 ------------------------------------------------

EMBEDDED_PRIVATE = [
    "::127.0.0.1",  # IPv4-compatible
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:0:7f00:1",  # IPv4-translated (127.0.0.1)
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254 (cloud metadata)
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "64:ff9b:1::808:808",  # local-use NAT64 prefix (RFC 8215): never public
    "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo, client 10.0.0.1 (XOR 0xffffffff)
    "2001:0:7f00:1:8000:63bf:f7f7:f7f7",  # Teredo, server 127.0.0.1, public client 8.8.8.8
]
EMBEDDED_PUBLIC = [
    "::ffff:8.8.8.8",
    "64:ff9b::808:808",
    "2002:808:808::1",
    "2001:0:4136:e378:8000:63bf:f7f7:f7f7",  # Teredo, server 65.54.227.120, client 8.8.8.8
]


@pytest.mark.parametrize("address", EMBEDDED_PRIVATE)
def test_embedded_ipv4_is_judged_by_the_address_it_carries(address: str) -> None:
    """Issue 31.4: is_public() said True for these: they are IPv6 forms of private IPv4 addresses."""
    from config.sources import is_public

    assert is_public(address) is False
    assert is_public(f"[{address}]") is False


@pytest.mark.parametrize("address", EMBEDDED_PUBLIC)
def test_embedded_public_ipv4_stays_public(address: str) -> None:
    from config.sources import is_public

    assert is_public(address) is True


@pytest.mark.parametrize(
    "url",
    [
        "http://[::127.0.0.1]/",
        "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/",
        "http://[64:ff9b::7f00:1]/",
        "http://[2002:a9fe:a9fe::]/",
        "http://[::ffff:0:7f00:1]/",
    ],
)
def test_embedded_ipv4_urls_are_refused_at_submit(app_client: Any, url: str) -> None:
    """Issue 31.4: with the host allow-listed, these datasets were 201."""
    h = admin_key(app_client)
    with overridden(sources={"allowed_url_prefixes": [url]}):
        r = app_client.post("/v1/jobs", json=parked_eval(dataset={"path": url + "x.jsonl"}), headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/dataset/path", r.text
    assert "private, loopback or link-local" in r.json()["detail"]
    assert project_jobs(app_client, h) == []


def test_embedded_ipv4_is_refused_again_when_the_job_fetches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fetch-time check (config.sources.fetch_url) runs the same test: a host whose DNS
    now answers with a NAT64 address of the metadata service, and a redirect to a 6to4
    address of loopback, are refused before a connection is made."""
    import httpx

    from config import sources
    from config.sources import RefusedURL, fetch_url

    real = socket.getaddrinfo

    def dns(host: str, *args: Any, **kwargs: Any) -> Any:
        if host == "rebind.example":
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("64:ff9b::a9fe:a9fe", 0, 0, 0))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", dns)
    sent: list[str] = []

    def send(self: Any, request: Any, **kwargs: Any) -> Any:
        sent.append(str(request.url))
        raise AssertionError(f"connected to {request.url}")

    monkeypatch.setattr(httpx.Client, "send", send)
    with pytest.raises(RefusedURL, match="private, loopback or link-local"):
        fetch_url("http://rebind.example/sets/x.jsonl", ["http://rebind.example/sets"], tmp_path)
    for url in ("http://[2002:7f00:1::]/sets/x.jsonl", "http://[64:ff9b::7f00:1]/sets/x.jsonl"):
        prefix = url.rsplit("/", 1)[0]
        with pytest.raises(RefusedURL, match="private"):
            fetch_url(url, [prefix], tmp_path)
    assert sent == [] and sources.is_public("rebind.example") is False


# --- item 5: keys, job references, unkeyed floods, streams per project -----------------------


def _key(app_client: Any, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    r = app_client.post("/v1/keys", json=body, headers=headers)
    assert r.status_code == 201, r.text
    return dict(r.json())


def _bearer(key: dict[str, Any]) -> dict[str, str]:
    return {"Authorization": f"Bearer {key['key']}"}


def test_a_minted_key_never_outlives_its_parent(app_client: Any) -> None:
    """Issue 31.5: a 1-day key minted a 3650-day key. Asked for a longer life: 422 at
    /expires_in_days saying the most it may ask; not asked: the child expires with its parent."""
    owner = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    root = _key(app_client, owner, project=f"outlive-{uuid.uuid4().hex[:8]}")
    day = _key(app_client, _bearer(root), name="day", expires_in_days=1)
    r = app_client.post("/v1/keys", json={"expires_in_days": 3650}, headers=_bearer(day))
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/expires_in_days", r.text
    assert "outlive" in r.json()["detail"] and "at most 0" in r.json()["detail"], r.text
    r = app_client.post("/v1/keys", json={"expires_in_days": 120}, headers=_bearer(root))  # root: 90 days
    assert r.status_code == 422 and "at most 89" in r.json()["detail"], r.text
    assert _key(app_client, _bearer(root), expires_in_days=89)["expires_at"]
    parent_end = datetime.fromisoformat(day["expires_at"])
    for days in (None, 0):
        with overridden(auth={"default_key_days": 90 if days is None else 0}):
            child = _key(app_client, _bearer(day), name="child")
        assert child["expires_at"] is not None and datetime.fromisoformat(child["expires_at"]) <= parent_end
    # a key that never expires (made by the admin token) may mint any lifetime, and keys that do not
    with overridden(auth={"default_key_days": 0}):
        forever = _key(app_client, owner, project=root["project"], name="forever")
        assert _key(app_client, _bearer(forever))["expires_at"] is None
    assert forever["expires_at"] is None
    assert _key(app_client, _bearer(forever), expires_in_days=3650)["expires_at"]


def test_expires_in_days_is_a_strict_integer(app_client: Any) -> None:
    """Issue 31.5: `true` was read as 1 (and "2" or 2.0 as 2)."""
    h = admin_key(app_client)
    for bad in (True, "2", 2.0):
        r = app_client.post("/v1/keys", json={"expires_in_days": bad}, headers=h)
        assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/expires_in_days", (bad, r.text)
    assert app_client.post("/v1/keys", json={"expires_in_days": 2}, headers=h).status_code == 201


def test_a_key_revokes_only_keys_with_no_more_scopes_than_its_own(app_client: Any) -> None:
    """Issue 31.5: a key with only the 'keys' scope revoked a full-scope key."""
    owner = admin_key(app_client)
    full = _key(app_client, owner, name="full")
    keeper = _key(app_client, owner, name="keeper", scopes=["read", "keys"])
    reader = _key(app_client, owner, name="reader", scopes=["read"])
    only_keys = _key(app_client, owner, name="only-keys", scopes=["keys"])
    for attacker, victim in ((keeper, full), (only_keys, full), (only_keys, keeper), (only_keys, reader)):
        r = app_client.delete(f"/v1/keys/{victim['id']}", headers=_bearer(attacker))
        assert r.status_code == 403 and "scope" in r.json()["detail"], r.text
    with db(app_client).connect() as c:
        revoked = c.execute(
            text("SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL AND id IN (:a, :b, :c)"),
            {"a": full["id"], "b": keeper["id"], "c": reader["id"]},
        ).scalar()
    assert revoked == 0
    assert app_client.get("/v1/jobs", headers=_bearer(full)).status_code == 200
    assert app_client.delete(f"/v1/keys/{reader['id']}", headers=_bearer(keeper)).status_code == 204  # a subset
    assert app_client.delete(f"/v1/keys/{keeper['id']}", headers=_bearer(full)).status_code == 204
    assert app_client.delete(f"/v1/keys/{only_keys['id']}", headers=_bearer(only_keys)).status_code == 204  # itself


def test_job_references_are_checked_at_submit_and_leak_nothing(app_client: Any) -> None:
    """Issue 31.5: POST /v1/jobs took model 'job:<another project's job>' (201); only the
    worker refused it later. Now the same 422 as for a job that does not exist, at every field
    that holds a model reference; a job of the caller's own project is fine."""
    a, b = admin_key(app_client), admin_key(app_client)
    theirs = app_client.post("/v1/jobs", json=parked_eval(), headers=a).json()["id"]
    mine = app_client.post("/v1/jobs", json=parked_grpo(), headers=b).json()["id"]
    missing = "0190a0a0-0000-7000-8000-000000000000"
    rm = lambda ref: parked_grpo(rewards=[{"name": "reward_model", "model": ref}])  # noqa: E731
    graded = lambda ref: parked_eval(grader={"type": "reward_model", "model": ref})  # noqa: E731
    policy = lambda ref: {  # noqa: E731
        "kind": "reward_model",
        "model": "org/m",
        "policy": ref,
        "dataset": {"name": "gsm8k"},
        "resources": PARKED,
    }
    cases = [
        (lambda ref: parked_eval(model=ref), "/model"),
        (rm, "/rewards/0/model"),
        (graded, "/grader/model"),
        (policy, "/policy"),
    ]
    for make, pointer in cases:
        details = set()
        for target in (theirs, missing, f"{theirs}@step-10", "not-an-id"):
            r = app_client.post("/v1/jobs", json=make(f"job:{target}"), headers=b)
            assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == pointer, (pointer, r.text)
            details.add(r.json()["detail"].replace(target, "<id>"))
        assert len(details) == 1, details  # another project's job reads exactly like a missing one
    assert {j["id"] for j in project_jobs(app_client, b)} == {mine}
    r = app_client.post("/v1/jobs", json=parked_eval(model=f"job:{mine}"), headers=b)
    assert r.status_code == 201, r.text
    mine_ref = r.json()["id"]
    # a job that saves no model (an eval), or a step an ended job never saved: 201, then the worker failed it
    r = app_client.post("/v1/jobs", json=parked_eval(model=f"job:{mine_ref}"), headers=b)
    assert r.status_code == 422 and "eval jobs save no model: name a job that trains one" in r.text, r.text
    assert r.json()["errors"][0]["pointer"] == "/model"
    app_client.post(f"/v1/jobs/{mine}/cancel", headers=b)
    r = app_client.post("/v1/jobs", json=parked_eval(model=f"job:{mine}@step-7"), headers=b)
    assert r.status_code == 422 and "saved no checkpoint at step 7" in r.text, r.text
    # pipelines say the same, pointing into the step
    r = app_client.post("/v1/pipelines", json={"jobs": {"ev": parked_eval(model=f"job:{theirs}")}}, headers=b)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/jobs/ev/model", r.text
    # and a graders:run call with another project's reward model (a grade job), at /grader/model
    body = {"grader": {"type": "reward_model", "model": f"job:{theirs}"}, "items": [{"completion": "1", "answer": "1"}]}
    r = app_client.post("/v1/graders:run?wait=0", json=body, headers=b)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/grader/model", r.text
    assert {j["id"] for j in project_jobs(app_client, b)} == {mine, mine_ref}


def test_requests_without_a_valid_key_are_rate_limited_per_address(app_client: Any) -> None:
    """Issue 31.5: a flood of invalid (or missing) keys got only 401s, however fast."""
    from api import ratelimit

    h, fresh = admin_key(app_client), admin_key(app_client)
    ratelimit.reset()
    with overridden(limits={"rate_per_address_per_second": 0.5, "burst_per_address": 3}):
        assert app_client.get("/v1/jobs", headers=h).status_code == 200
        codes = [
            app_client.get("/v1/jobs", headers={"Authorization": "Bearer mrl_wrong"}).status_code,
            app_client.get("/v1/jobs").status_code,
            app_client.post("/v1/jobs", json=parked_eval(), headers={"Authorization": "Bearer x"}).status_code,
        ]
        assert codes == [401, 401, 401]
        for r in (
            app_client.get("/v1/jobs", headers={"Authorization": "Bearer mrl_wrong"}),
            app_client.get("/v1/jobs"),
            app_client.post("/v1/jobs", json=parked_eval(), headers={"Authorization": "Bearer x"}),
        ):
            assert r.status_code == 429 and r.headers["content-type"] == "application/problem+json", r.text
            assert r.json()["title"] == "Too many requests" and "address" in r.json()["detail"]
            assert 1 <= int(r.headers["Retry-After"]) <= 2
        # a valid key is never held back by its address: one in use, and one not looked up yet
        assert app_client.get("/v1/jobs", headers=h).status_code == 200
        assert app_client.post("/v1/jobs", json=parked_eval(), headers=fresh).status_code == 201
        assert app_client.get("/livez").status_code == 200  # health is exempt
        assert app_client.get("/readyz").status_code in (200, 503)
    ratelimit.reset()


def test_streams_are_capped_per_project(app_client: Any) -> None:
    """Issue 31.5: streams were capped per key only; a project with many keys held any number."""
    from api import streams

    owner = admin_key(app_client)
    other_key = _key(app_client, owner, name="second")
    job_id = app_client.post("/v1/jobs", json=parked_eval(), headers=owner).json()["id"]
    project_id = app_client.get(f"/v1/jobs/{job_id}", headers=owner).json()["project_id"]
    with overridden(limits={"max_streams_per_project": 2, "max_streams_per_key": 100}):
        # two streams held open by other keys of the project (counted as the route counts them)
        streams.open_stream("k1", 100, project_id, 2)
        streams.open_stream("k2", 100, project_id, 2)
        try:
            r = app_client.get(f"/v1/jobs/{job_id}/events/stream", headers=_bearer(other_key))
            assert r.status_code == 429 and "project" in r.json()["detail"], r.text
            assert "Retry-After" in r.headers
            other = admin_key(app_client)  # another project is unaffected (its job ended: the stream ends)
            done = app_client.post("/v1/jobs", json=parked_eval(), headers=other).json()["id"]
            app_client.post(f"/v1/jobs/{done}/cancel", headers=other)
            assert app_client.get(f"/v1/jobs/{done}/events/stream", headers=other).status_code == 200
        finally:
            streams.close_stream("k1", project_id)
            streams.close_stream("k2", project_id)
        assert streams.project_open_count(project_id) == 0
        app_client.post(f"/v1/jobs/{job_id}/cancel", headers=owner)
        assert app_client.get(f"/v1/jobs/{job_id}/events/stream", headers=owner).status_code == 200
        assert streams.project_open_count(project_id) == 0


def test_one_projects_stream_reads_leave_the_api_threads_to_others() -> None:
    """Streams at different cursors cannot share a read (api.job_wakeups.shared_read): a project's 300
    streams (its limit), each at a cursor past every event, made 300 reads of each wake-up of its busy
    job, and took the API's 40 threads and its database connections from every other project. Here
    50 reads of one project are held in their threads; another project's read goes through at once."""
    import threading
    import time

    import anyio

    from api.job_wakeups import READS_PER_PROJECT, project_read

    held, most, lock, release = 0, 0, threading.Lock(), threading.Event()

    def slow() -> str:  # a read of the busy project's, stuck in the database
        nonlocal held, most
        with lock:
            held += 1
            most = max(most, held)
        release.wait(10)
        with lock:
            held -= 1
        return "busy"

    async def main() -> float:
        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(project_read, "busy", slow)
            await anyio.sleep(0.5)
            t0 = time.monotonic()
            assert await project_read("other", lambda: "other") == "other"
            took = time.monotonic() - t0
            release.set()
        return took

    took = anyio.run(main)
    assert took < 2, took  # before: it waited for a free thread, until the busy project's reads ended (10 s)
    assert most == READS_PER_PROJECT, most


def test_a_stream_that_goes_away_while_its_shared_read_waits_does_not_end_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stream that started a shared read (api.job_wakeups.shared_read) waited there for its
    project's turn; its client going away cancelled it, and the cancellation went to every stream that
    shared the read: their clients' streams were cut. The read is a task of its own now."""
    import threading

    import anyio

    from api import job_wakeups
    from api.project_gates import ProjectGates

    monkeypatch.setattr(job_wakeups, "_project_reads", ProjectGates(1))
    release = threading.Event()
    got: dict[str, object] = {}

    async def main() -> None:
        leader = anyio.CancelScope()

        async def lead() -> None:
            with leader:
                got["leader"] = await job_wakeups.shared_read("k", lambda: "rows", "p")

        async def follow() -> None:
            try:
                got["follower"] = await job_wakeups.shared_read("k", lambda: "rows", "p")
            except BaseException as exc:  # (a CancelledError before)
                got["follower"] = type(exc).__name__
                raise

        async with anyio.create_task_group() as tg:
            tg.start_soon(job_wakeups.project_read, "p", lambda: release.wait(10))  # holds the project's turn
            await anyio.sleep(0.2)
            tg.start_soon(lead)
            await anyio.sleep(0.1)
            tg.start_soon(follow)
            await anyio.sleep(0.1)
            leader.cancel()  # the leading stream's client went away
            await anyio.sleep(0.1)
            release.set()

    anyio.run(main)
    assert got.get("follower") == "rows" and "leader" not in got, got


def test_a_stream_whose_client_went_away_before_it_began_gives_its_count_back(
    app_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The count was given back in the stream's generator, which never ran when the client went away
    before the stream began: connect, close at once, again and again, and the key's and project's
    streams stayed at their limit until the API restarted."""
    import anyio
    from starlette.requests import ClientDisconnect

    from api import streams

    owner = admin_key(app_client)
    job_id = app_client.post("/v1/jobs", json=parked_eval(), headers=owner).json()["id"]
    project_id = app_client.get(f"/v1/jobs/{job_id}", headers=owner).json()["project_id"]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": f"/v1/jobs/{job_id}/events/stream",
        "raw_path": f"/v1/jobs/{job_id}/events/stream".encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver"), (b"authorization", owner["Authorization"].encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            raise OSError("the client has gone")  # as a server's send raises on a closed connection

    async def gone() -> None:
        for _ in range(3):
            try:
                await app_client.app(scope, receive, send)
            except (OSError, ClientDisconnect):  # what the response raises when its first send fails
                pass

    with caplog.at_level(logging.INFO, logger="mathrl.api"):
        anyio.run(gone)
    assert streams.project_open_count(project_id) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text  # not an 'unhandled error'
    app_client.post(f"/v1/jobs/{job_id}/cancel", headers=owner)


def test_every_route_of_an_openai_router_answers_as_openai_does(app_client: Any) -> None:
    """Which routes answer a bad body with OpenAI's 400 and its error shape, in place of mathrl's
    422, was a hand-kept list of paths (issue 68.2): a router missing from it answered the wrong
    shape, silently. Now each route tagged 'openai: ...' is covered, read off the app's routes
    (api/problems.py `openai_paths`): every route of the api/routers/openai_*.py routers, and no
    route of mathrl's own routers; and a new router is covered by its tag alone."""
    import importlib
    import pkgutil

    from fastapi import APIRouter, FastAPI
    from fastapi.testclient import TestClient

    import api.routers
    from api import problems

    assert app_client.app is not None  # the app is built: its routes were read
    for info in pkgutil.iter_modules(api.routers.__path__):
        module = importlib.import_module(f"api.routers.{info.name}")
        paths = [getattr(r, "path", "") for r in module.router.routes]
        if info.name.startswith("openai_"):
            missed = [p for p in paths if not p.startswith(openai_paths())]
            assert not missed, f"api/routers/{info.name}.py: {missed} are not tagged 'openai: ...'"
        elif info.name not in ("health",):
            taken = [p for p in paths if p.startswith(openai_paths())]
            assert not taken, f"api/routers/{info.name}.py: {taken} would answer in OpenAI's shape"

    toy = APIRouter(prefix="/v1/toy_resources", tags=["openai: toy resources"])

    @toy.post("/{toy_id}/grow")
    def grow(toy_id: str, size: int) -> dict[str, int]:
        return {"size": size + 1}

    app = FastAPI()
    app.include_router(toy)
    problems.install(app)
    r = TestClient(app).post("/v1/toy_resources/t1/grow", params={"size": "big"})
    assert r.status_code == 400, r.text  # mathrl's routes answer this 422
    assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["param"] == "size", r.text
