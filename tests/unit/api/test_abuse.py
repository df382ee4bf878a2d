"""Abuse: one project cannot reach another's objects, the API survives fuzzing, limits hold,
sources are confined, no user code runs, keys stay secret. RELIABILITY.md lists each case.

In-process tests use the `app_client` app on real PostgreSQL and Redis; jobs they create go to
a worker pool no test worker serves ('abuse-parked'), so nothing runs them.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hsettings
from sqlalchemy import text

from api.routers import openai_graders
from config.settings import get_settings
from kinds import HOMES
from mathrl.specs import parse_spec
from tests.helpers.api import admin_key, db, make_objects, overridden, project_jobs
from tests.helpers.env import ADMIN_TOKEN
from tests.helpers.jobs import PARKED, parked_eval, parked_grpo

# --- 1. object-level authorization, enumerated from the OpenAPI document --------------------


@pytest.mark.quick
def test_every_route_with_an_id_is_404_to_another_project(app_client: Any) -> None:
    a, b = admin_key(app_client), admin_key(app_client)
    paths = app_client.app.openapi()["paths"]
    ids = make_objects(app_client, a)
    checked = []
    for path, item in paths.items():
        params = re.findall(r"{(\w+)}", path)
        if not params:
            continue
        for method in item:
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            unknown = [p for p in params if p not in ids]
            assert not unknown, (
                f"{method.upper()} {path} takes {unknown}: teach tests.helpers.api.make_objects to create one so the "
                "route is checked for cross-project access"
            )
            url = path.format(**ids)
            body = {} if method in ("post", "put", "patch") and "requestBody" in item[method] else None
            r = app_client.request(method.upper(), url, headers=b, json=body)
            assert r.status_code == 404, (method, path, r.status_code, r.text)
            assert r.headers["content-type"].startswith("application/problem+json")
            checked.append(f"{method.upper()} {path}")
    assert len(checked) >= 9, checked  # jobs (8 routes) + key revocation at least
    # the owner's objects are untouched by B's cancel / revoke attempts
    assert app_client.get(f"/v1/jobs/{ids['job_id']}", headers=a).json()["status"] == "queued"
    if "pipeline_id" in ids:
        assert app_client.get(f"/v1/pipelines/{ids['pipeline_id']}", headers=a).json()["status"] != "cancelled"
    with db(app_client).connect() as c:
        assert c.scalar(text("SELECT revoked_at FROM api_keys WHERE id = :i"), {"i": ids["key_id"]}) is None
    assert project_jobs(app_client, b) == []


# --- 2. fuzzing with schemathesis ----------------------------------------------------------

import schemathesis  # noqa: E402

FUZZ_POOL = "fuzz-parked"


@pytest.fixture(scope="module")
def fuzz_key(app_client: Any) -> Iterator[dict[str, str]]:
    headers = admin_key(app_client, f"fuzz-{uuid.uuid4().hex[:6]}")
    yield headers
    # cancel whatever the fuzzer managed to create; it was parked on a queue no worker serves
    for job in project_jobs(app_client, headers):
        app_client.post(f"/v1/jobs/{job['id']}/cancel", headers=headers)


def _park(body: Any) -> None:
    """Jobs the fuzzer creates go to a pool nobody serves (a test worker must not run them)."""
    if isinstance(body, dict):
        if isinstance(body.get("resources"), dict):
            body["resources"]["pool"] = FUZZ_POOL
        elif "kind" in body:
            body["resources"] = {"pool": FUZZ_POOL}
        for spec in (body.get("jobs") or {}).values() if isinstance(body.get("jobs"), dict) else []:
            _park(spec)


@pytest.mark.quick
def test_fuzz_openapi(app_client: Any, fuzz_key: dict[str, str]) -> None:
    """Every operation of the OpenAPI document, 25 derandomized examples each, with a valid key:
    no 5xx, and every response matches its documented status codes and schema."""
    from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

    ran = _fuzz(
        app_client,
        fuzz_key,
        schemathesis.GenerationMode.POSITIVE,
        [response_schema_conformance, status_code_conformance],
    )
    assert ran >= 10


def test_fuzz_openapi_with_input_the_schema_forbids(app_client: Any, fuzz_key: dict[str, str]) -> None:
    """The same operations with input their schema forbids (schemathesis' negative mode: a wrong
    type, a missing field, a value out of range), 25 derandomized examples each: never a 5xx."""
    ran = _fuzz(app_client, fuzz_key, schemathesis.GenerationMode.NEGATIVE, [])
    assert ran >= 10  # the operations with something to break: the others take no input


def _fuzz(app_client: Any, key: dict[str, str], mode: Any, checks: list[Any]) -> int:
    """Fuzz every operation in `mode` with `checks` and no 5xx: how many operations ran (an operation
    with no input to make invalid is not counted in the negative mode); every failure reported at once."""
    from hypothesis import given
    from hypothesis.errors import Unsatisfiable
    from schemathesis.checks import not_a_server_error

    def no_server_error(ctx: Any, response: Any, case: Any) -> None:
        """not_a_server_error, but for OpenAI's graders/run when a grading model's job did not finish
        in its (1 s) wait: the documented 504 of a service working as it should, when no worker is
        there to run the job. A python grader's deadline (the same problem type) stays an error."""
        if response.status_code == 504 and case.operation.path == "/v1/fine_tuning/alpha/graders/run":
            problem = response.json()
            if problem["type"].endswith("/problems/grader-timed-out") and "did not finish in" in problem["detail"]:
                return
        not_a_server_error(ctx, response, case)

    schema = schemathesis.openapi.from_asgi("/openapi.json", app_client.app)
    failures: list[str] = []
    ran = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path.endswith("/events/stream"):
            continue  # a stream stays open while its job lives; its 404 is checked above

        @given(case=operation.as_strategy(mode))
        @hsettings(
            max_examples=25,
            derandomize=True,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            _park(case.body)
            if case.operation.path == "/v1/graders:run":
                # a grader with a model waits up to `wait` (default 60 s) for its 'grade' job: at most 1 s, so
                # it answers its documented 202 whether or not a worker is there to fail the job (a wait the
                # fuzzer made invalid stays, for its 422)
                query = case.query if isinstance(case.query, dict) else {}
                wait = query.get("wait", 60)
                if isinstance(wait, int | float) and not isinstance(wait, bool) and 1 < wait <= 300:
                    case.query = {**query, "wait": 1}
            case.call_and_validate(headers=key, checks=[no_server_error, *checks])

        try:
            # a grading call may take its whole deadline (a python grader's loop, 1000 items): cut
            # it below the client's 10 s read timeout, so such a case answers its documented 504
            # OpenAI's graders/run waits MODEL_WAIT (300 s) for such a job: 1 s, so it answers its 504
            with (
                overridden(graders={"timeout_seconds": 4.0, "item_timeout_seconds": 2.0}),
                pytest.MonkeyPatch.context() as patch,
            ):
                patch.setattr(openai_graders, "MODEL_WAIT", 1.0)
                run()
        except Unsatisfiable:
            continue  # negative mode: nothing in this operation's input to make invalid
        except (Exception, BaseExceptionGroup) as exc:  # collect every operation's failure, then report them all
            failures.append(f"{operation.method.upper()} {operation.path}: {exc}")
        ran += 1
    assert not failures, "\n\n".join(failures)
    return ran


@pytest.mark.quick
def test_nul_characters_are_422_not_503(app_client: Any) -> None:
    """Found by fuzzing: PostgreSQL text cannot hold NUL; that was answered as a database outage."""
    h = admin_key(app_client)
    r = app_client.post("/v1/jobs", json=parked_eval(name="a\x00b"), headers=h)
    assert r.status_code == 422 and "NUL" in r.json()["detail"], r.text
    r = app_client.get("/v1/jobs", params={"kind": "a\x00b"}, headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "query:/kind", r.text
    assert app_client.post("/v1/keys", json={"name": "\x00"}, headers=h).status_code == 422
    deep: Any = 1
    for _ in range(300):  # free-form JSON past pydantic's serializer's 255 levels: a 500 where it was stored
        deep = {"a": deep}
    judge = {"type": "score_model", "model": "org/judge", "input": [{"role": "user", "content": "x"}]}
    grpo = parked_grpo(rewards=[{"name": "grader", "grader": {**judge, "sampling_params": deep}}])
    r = app_client.post("/v1/jobs", json=grpo, headers=h)
    assert r.status_code == 422 and "nests deeper than 32 levels" in r.text, r.text
    r = app_client.post("/v1/jobs", json=parked_eval(model="/models/m\x00"), headers=h)  # Path.resolve raised: a 500
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/model" and "NUL" in r.text, r.text
    assert project_jobs(app_client, h) == []


# --- 3. resource limits: size, quotas, rate ---------------------------------------------------


@pytest.mark.quick
def test_oversized_body_is_413(app_client: Any) -> None:
    h = admin_key(app_client)
    big = parked_eval(name="x", system_prompt="y" * 1_100_000)
    r = app_client.post("/v1/jobs", json=big, headers=h)
    assert r.status_code == 413 and "larger than this server accepts" in r.json()["detail"]
    assert project_jobs(app_client, h) == []


def _chunks(total: int, read: list[int], data: bytes = b"y") -> Iterator[bytes]:
    """A chunked body (no Content-Length) of `total` bytes; `read` counts the chunks taken."""
    for _ in range(0, total, 65536):
        read.append(1)
        yield data * 65536


@pytest.mark.quick
def test_chunked_body_over_the_limit_is_413_while_read(app_client: Any) -> None:
    """Issue 16.2: the limit read only Content-Length; a chunked body was read whole and parsed."""
    h = admin_key(app_client)
    read: list[int] = []
    body = (b'{"kind": "eval", "model": "org/m", "system_prompt": "', *_chunks(1_100_000, read), b'"}')
    r = app_client.post("/v1/jobs", content=iter(body), headers={**h, "Content-Type": "application/json"})
    assert r.status_code == 413 and "larger than this server accepts" in r.json()["detail"], r.text
    assert project_jobs(app_client, h) == []


@pytest.mark.quick
def test_body_without_a_valid_key_is_refused_before_it_is_read(app_client: Any) -> None:
    """Issue 16.2: a keyless 20 MB POST was read into memory and JSON-parsed before the key check."""
    for headers in ({}, {"Authorization": "Bearer mrl_not-a-key"}):
        read: list[int] = []
        r = app_client.post(
            "/v1/jobs", content=_chunks(20 * 2**20, read, b"{"), headers={**headers, "Content-Type": "application/json"}
        )
        assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json", r.text
        assert read == [], f"{len(read)} chunks of the body were read before the key was refused"
    # the Tinker SDK's calls too (their key in X-API-Key; its routes read the body after their key's check)
    for headers in ({}, {"X-API-Key": "tml-mrl_not-a-key"}, {"Authorization": "Bearer mrl_not-a-key"}):
        for op in ("forward_backward", "create_model"):
            read = []
            r = app_client.post(f"/api/v1/{op}", content=_chunks(20 * 2**20, read, b"{"), headers=headers)
            assert r.status_code == 401, (op, headers, r.text)
            assert read == [], f"{op}: {len(read)} chunks of the body were read before the key was refused"


@pytest.mark.quick
def test_quota_of_active_jobs(app_client: Any) -> None:
    h = admin_key(app_client)
    with overridden(limits={"max_active_jobs": 2}):
        first = app_client.post("/v1/jobs", json=parked_eval(), headers=h).json()["id"]
        assert app_client.post("/v1/jobs", json=parked_eval(), headers=h).status_code == 201
        r = app_client.post("/v1/jobs", json=parked_eval(), headers=h)
        assert r.status_code == 429 and r.json()["title"] == "Quota exceeded", r.text
        assert "2 active" in r.json()["detail"] and "cancel" in r.json()["detail"]
        assert len(project_jobs(app_client, h)) == 2
        other = admin_key(app_client)  # the quota is per project
        assert app_client.post("/v1/jobs", json=parked_eval(), headers=other).status_code == 201
        app_client.post(f"/v1/jobs/{first}/cancel", headers=h)  # a finished job frees its slot
        assert app_client.post("/v1/jobs", json=parked_eval(), headers=h).status_code == 201


@pytest.mark.quick
def test_a_resumed_job_takes_its_quota_again(app_client: Any) -> None:
    """A paused job holds no quota. Pausing queued jobs, submitting more and resuming them got past
    the project's quotas, as often as a tenant liked; a resume is now held to them as a submit is."""
    h = admin_key(app_client)
    with overridden(limits={"max_active_jobs": 2}):
        paused = [app_client.post("/v1/jobs", json=parked_eval(), headers=h).json()["id"] for _ in range(2)]
        for job_id in paused:
            r = app_client.post(f"/v1/jobs/{job_id}/pause", headers=h)
            assert r.status_code == 200 and r.json()["status"] == "paused", r.text
        fresh = [app_client.post("/v1/jobs", json=parked_eval(), headers=h) for _ in range(2)]
        assert [r.status_code for r in fresh] == [201, 201], [r.text for r in fresh]
        r = app_client.post(f"/v1/jobs/{paused[0]}/resume", headers=h)
        assert r.status_code == 429 and "2 active" in r.json()["detail"], r.text
        assert app_client.get(f"/v1/jobs/{paused[0]}", headers=h).json()["status"] == "paused"  # as it was
        assert len(project_jobs(app_client, h)) == 4
        app_client.post(f"/v1/jobs/{fresh[0].json()['id']}/cancel", headers=h)
        r = app_client.post(f"/v1/jobs/{paused[0]}/resume", headers=h)
        assert r.status_code == 200 and r.json()["status"] == "queued", r.text
    with overridden(limits={"max_active_jobs": 10, "max_active_gpus": 4}):
        gpu = parked_eval(resources={**PARKED, "gpus": 3})
        big = app_client.post("/v1/jobs", json=gpu, headers=h).json()["id"]
        app_client.post(f"/v1/jobs/{big}/pause", headers=h)
        assert app_client.post("/v1/jobs", json=gpu, headers=h).status_code == 201
        r = app_client.post(f"/v1/jobs/{big}/resume", headers=h)  # 6 GPUs, over 4
        assert r.status_code == 429 and r.json()["errors"][0]["pointer"] == "/resources/gpus", r.text


@pytest.mark.quick
def test_quota_of_gpus(app_client: Any) -> None:
    h = admin_key(app_client)
    with overridden(limits={"max_active_gpus": 4}):
        ok = app_client.post("/v1/jobs", json=parked_eval(resources={**PARKED, "gpus": 3}), headers=h)
        assert ok.status_code == 201, ok.text
        r = app_client.post("/v1/jobs", json=parked_eval(resources={**PARKED, "gpus": 2}), headers=h)
        assert r.status_code == 429 and r.json()["errors"][0]["pointer"] == "/resources/gpus", r.text
        assert "5 GPUs" in r.json()["detail"] and "quota is 4" in r.json()["detail"]
        assert (
            app_client.post("/v1/jobs", json=parked_eval(resources={**PARKED, "gpus": 1}), headers=h).status_code == 201
        )


@pytest.mark.quick
def test_a_pool_is_one_the_workers_consume_and_a_job_there_holds_a_slots_gpus(app_client: Any) -> None:
    """A named pool the operator does not run is refused (its job would wait forever; 'unacked', a
    list in kombu's own hash key, stopped delivery for every project); a job in a GPU pool holds
    at least a slot's GPUs against the quota, however few it asked for."""
    h = admin_key(app_client)
    for name in ("unacked", "gpu-8", "nobody-runs-this"):
        r = app_client.post("/v1/jobs", json=parked_eval(resources={"pool": name}), headers=h)
        assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/resources/pool", r.text
        assert f"resources.pool '{name}' is not a pool this server runs" in r.json()["detail"], r.text
        assert "abuse-parked" in r.json()["detail"], r.text  # the ones it runs
    # resources.gpu_type makes the queue 'gpu-N-<type>': one no pool takes waited for ever, holding its quota
    r = app_client.post("/v1/jobs", json=parked_eval(resources={"gpus": 2, "gpu_type": "b200"}), headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/resources/gpu_type", r.text
    assert "no worker pool here takes 'gpu-2-b200'" in r.json()["detail"], r.text
    pools = {**get_settings().worker.pools, "gpu-8-parked": 8}
    with overridden(worker={"pools": pools}, limits={"max_active_gpus": 10}):
        ok = app_client.post("/v1/jobs", json=parked_eval(resources={"pool": "gpu-8-parked"}), headers=h)
        assert ok.status_code == 201, ok.text
        r = app_client.post("/v1/jobs", json=parked_eval(resources={"pool": "gpu-8-parked", "gpus": 1}), headers=h)
        assert r.status_code == 429 and r.json()["errors"][0]["pointer"] == "/resources/gpus", r.text
        assert "holds 8 GPUs" in r.json()["detail"] and "to 16 GPUs" in r.json()["detail"], r.text
        app_client.post(f"/v1/jobs/{ok.json()['id']}/cancel", headers=h)
    with pytest.raises(ValueError, match="a key the broker keeps itself"):
        type(get_settings().worker)(pools={"unacked": 0})


@pytest.mark.quick
@pytest.mark.parametrize(
    ("limits", "spec", "pointer"),
    [
        ({"max_steps": 100}, parked_grpo(max_steps=101), "/max_steps"),
        ({"max_steps": 100}, {**parked_grpo(), "kind": "sft", "max_steps": 500}, "/max_steps"),
        # the preset fills global_batch_size=1024: the limit applies to the resolved config
        ({"max_generations_per_step": 512}, parked_grpo(preset="deepseekmath"), "/global_batch_size"),
        ({"max_generations_per_step": 4}, parked_eval(sampling={"temperature": 1, "n": 8}), "/sampling/n"),
        (
            {"max_generations_per_step": 4},
            {"kind": "reward_model", "model": "org/m", "dataset": {"name": "gsm8k"}, "resources": PARKED},
            "/samples_per_question",
        ),
        ({"max_tokens": 1000}, parked_grpo(preset="deepseekmath"), "/max_completion_length"),
        ({"max_tokens": 256}, parked_eval(), "/sampling/max_new_tokens"),
        ({"max_tokens": 256}, {**parked_grpo(), "kind": "sft", "max_steps": 1}, "/max_length"),
        # a checkpoint every step over 100,000 steps filled the artifact volume every project shares
        ({"max_checkpoints_per_job": 10}, parked_grpo(max_steps=100, save_steps=5), "/save_steps"),
        (
            {"max_checkpoints_per_job": 10},
            {**parked_grpo(), "kind": "sft", "max_steps": 11, "save_steps": 1},
            "/save_steps",
        ),
        # a chat's budget: the operator's limit did not reach generate jobs
        ({"max_tokens": 256}, {"kind": "generate", "model": "org/m", "prompt": "1", "max_tokens": 4096}, "/max_tokens"),
    ],
)
def test_per_job_limits(app_client: Any, limits: dict[str, int], spec: dict[str, Any], pointer: str) -> None:
    h = admin_key(app_client)
    with overridden(limits=limits):
        r = app_client.post("/v1/jobs", json=spec, headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == pointer, r.text
    fix = "save less often" if pointer == "/save_steps" else "lower it"
    assert "limit" in r.json()["detail"] and fix in r.json()["detail"], r.text
    assert project_jobs(app_client, h) == []
    assert app_client.post("/v1/jobs", json=spec, headers=h).status_code == 201  # fine under the default limits


@pytest.mark.quick
def test_rate_limit_per_key(app_client: Any) -> None:
    from api import ratelimit

    h, other = admin_key(app_client), admin_key(app_client)
    ratelimit.reset()
    with overridden(limits={"rate_per_second": 0.5, "burst": 3}):
        codes = [app_client.get("/v1/jobs", headers=h).status_code for _ in range(3)]
        assert codes == [200, 200, 200]
        r = app_client.get("/v1/jobs", headers=h)
        assert r.status_code == 429 and r.json()["title"] == "Too many requests", r.text
        assert 1 <= int(r.headers["Retry-After"]) <= 2
        assert app_client.get("/v1/jobs", headers=other).status_code == 200  # per key
        assert app_client.get("/livez").status_code == 200  # health is exempt
        assert app_client.get("/metrics").status_code == 200
    ratelimit.reset()


@pytest.mark.quick
def test_every_keyed_response_says_what_its_rate_leaves_as_openai_does(app_client: Any) -> None:
    """Issue 69.5: OpenAI's x-ratelimit-{limit,remaining,reset}-requests headers (none were sent), on an
    answer, on a body's route (checked before the body is read), and on the 429 itself, read through
    the openai SDK's raw responses."""
    from openai import OpenAI, RateLimitError

    from api import ratelimit

    h = admin_key(app_client)
    client = OpenAI(
        base_url=f"{app_client.base_url}/v1", api_key=h["Authorization"].removeprefix("Bearer "),
        http_client=app_client, max_retries=0,
    )  # fmt: skip
    ratelimit.reset()
    with overridden(limits={"rate_per_second": 0.01, "burst": 3, "rate_per_project_per_second": 100.0}):
        first = client.models.with_raw_response.list().headers
        assert first["x-ratelimit-limit-requests"] == "3" and first["x-ratelimit-remaining-requests"] == "2", first
        assert first["x-ratelimit-reset-requests"].endswith("s"), first  # ~100 s: "1m41s"
        posted = client.files.with_raw_response.create(file=("a.jsonl", b'{"a": 1}\n'), purpose="evals").headers
        assert posted["x-ratelimit-remaining-requests"] == "1", posted
        client.models.list()
        with pytest.raises(RateLimitError) as e:
            client.models.list()
        said = e.value.response.headers
        assert said["x-ratelimit-remaining-requests"] == "0" and int(said["Retry-After"]) >= 1, said
        assert "x-ratelimit-remaining-requests" not in app_client.get("/livez").headers  # no key, no bucket
    ratelimit.reset()
    assert [ratelimit.duration(s) for s in (0, 0.02, 1.5, 59.9, 360, 3723)] == [
        "0s",
        "20ms",
        "1.5s",
        "59.9s",
        "6m0s",
        "1h2m3s",
    ]


@pytest.mark.quick
def test_requests_from_many_addresses_do_not_reset_the_keys_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every bucket was cleared once 100,000 were held: bad-key requests from that many addresses (easy
    over IPv6) reset every key's and project's rate. Address buckets are held apart now, and past the
    cap the least recently used goes."""
    from api import ratelimit

    ratelimit.reset()
    for _ in range(3):
        ratelimit.take("key:spent", 0.001, 3)
    assert ratelimit.take("key:spent", 0.001, 3) > 0
    for i in range(100_001):  # more addresses than the table holds
        ratelimit.enforce_address(f"2001:db8::{i:x}", 10.0, 100)
    assert ratelimit.take("key:spent", 0.001, 3) > 0, "the key's bucket was emptied and stays so"
    monkeypatch.setattr(ratelimit, "MAX_BUCKETS", 50, raising=False)
    for i in range(60):  # keys past the cap: the least recently used goes, the one in use stays
        ratelimit.take(f"key:{i}", 1.0, 3)
        ratelimit.take("key:spent", 0.001, 3)
    assert ratelimit.take("key:spent", 0.001, 3) > 0 and len(ratelimit._buckets) <= 50
    ratelimit.reset()


@pytest.mark.quick
def test_a_projects_keys_share_one_rate_and_their_number_is_capped(app_client: Any) -> None:
    """Keys a project mints for itself bought it their number times the rate (and, past 10,000 of
    them, cleared every tenant's cached keys and buckets): they share one project bucket now, and a
    project holds at most limits.max_keys_per_project live keys."""
    from api import ratelimit

    h = admin_key(app_client)
    made = [app_client.post("/v1/keys", json={}, headers=h).json() for _ in range(3)]
    keys = [h, *({"Authorization": f"Bearer {m['key']}"} for m in made)]
    ratelimit.reset()
    with overridden(limits={"rate_per_project_per_second": 0.5, "burst_per_project": 4}):
        assert [app_client.get("/v1/jobs", headers=k).status_code for k in keys] == [200] * 4  # one each
        r = app_client.get("/v1/jobs", headers=keys[1])  # a key with its own bucket full
        assert r.status_code == 429 and "across your project's API keys" in r.json()["detail"], r.text
        assert app_client.get("/v1/jobs", headers=admin_key(app_client)).status_code == 200  # per project
    ratelimit.reset()
    with overridden(limits={"max_keys_per_project": 5}):
        assert app_client.post("/v1/keys", json={}, headers=h).status_code == 201  # the fifth live key
        r = app_client.post("/v1/keys", json={}, headers=h)
        assert r.status_code == 409 and "holds 5 live API keys" in r.json()["detail"], r.text
        assert app_client.delete(f"/v1/keys/{made[0]['id']}", headers=h).status_code == 204
        assert app_client.post("/v1/keys", json={}, headers=h).status_code == 201  # one revoked: room for one


# --- 4. sources ----------------------------------------------------------------------------

ALLOWED_URLS = [
    "http://127.0.0.1/",
    "http://169.254.169.254/",
    "http://10.0.0.1/",
    "http://[::1]/",
    "http://localhost/",
    "https://93.184.216.34/",
]


@pytest.mark.quick
@pytest.mark.parametrize(
    "path",
    [
        "{root}/../../etc/passwd",  # traversal out of an allowed root
        "/etc/passwd",
        "file:///etc/passwd",
        "file://{root}/../../etc/passwd",
        "http://127.0.0.1/data.jsonl",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://[::1]/x.jsonl",
        "http://localhost/x.jsonl",  # resolves to loopback
        "https://8.8.8.8/x.jsonl",  # public, but not an allow-listed prefix
        "ftp://93.184.216.34/x.jsonl",
    ],
)
def test_dataset_source_refused_before_storing(app_client: Any, tmp_path: Path, path: str) -> None:
    h = admin_key(app_client)
    spec = parked_eval(dataset={"path": path.format(root=tmp_path)})
    with overridden(sources={"allowed_url_prefixes": ALLOWED_URLS}):
        r = app_client.post("/v1/jobs", json=spec, headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/dataset/path", r.text
    assert project_jobs(app_client, h) == []


@pytest.mark.quick
@pytest.mark.parametrize("path", ["set.jsonl", "./set.jsonl", "sub/../set.jsonl", "~/set.jsonl"])
def test_relative_paths_are_refused_not_resolved_against_the_servers_cwd(
    app_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Issue 16.9: a relative path was resolved against the API process's working directory
    (and '~' against its home): here both are an allowed root, and the job was accepted."""
    (tmp_path / "set.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    h = admin_key(app_client)
    for spec, pointer in (
        (parked_eval(dataset={"path": path}), "/dataset/path"),
        (parked_eval(model=path if path.startswith(("./", "~")) else f"./{path}"), "/model"),
    ):
        r = app_client.post("/v1/jobs", json=spec, headers=h)
        assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == pointer, r.text
        assert "relative path" in r.json()["detail"] and "absolute path" in r.json()["detail"]
    assert project_jobs(app_client, h) == []


@pytest.mark.quick
def test_dataset_sources_accepted(app_client: Any, tmp_path: Path) -> None:
    h = admin_key(app_client)
    data = tmp_path / "set.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n')
    with overridden(sources={"allowed_url_prefixes": ALLOWED_URLS}):
        for path in (str(data), f"file://{data}", "https://93.184.216.34/sets/x.jsonl"):
            r = app_client.post("/v1/jobs", json=parked_eval(dataset={"path": path}), headers=h)
            assert r.status_code == 201, (path, r.text)


@pytest.mark.quick
def test_model_sources(app_client: Any, tmp_path: Path, tiny_model: str) -> None:
    h = admin_key(app_client)
    link = tmp_path / "escape"
    link.symlink_to("/etc")
    refused = [
        ({"model": "/etc"}, "/model"),
        ({"model": f"{tmp_path}/../../../etc"}, "/model"),
        ({"model": str(link)}, "/model"),  # a symlink inside a root that points outside it
        ({"model": "file:///etc/passwd"}, "/model"),
        ({"model": "http://169.254.169.254/m"}, "/model"),
    ]
    for over, pointer in refused:
        r = app_client.post("/v1/jobs", json=parked_eval(**over), headers=h)
        assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == pointer, (over, r.text)
    rm = parked_grpo(rewards=[{"name": "reward_model", "model": "/opt/rm"}])
    r = app_client.post("/v1/jobs", json=rm, headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/rewards/0/model", r.text
    policy = {
        "kind": "reward_model",
        "model": "org/m",
        "policy": "/root/policy",
        "dataset": {"name": "gsm8k"},
        "resources": PARKED,
    }
    r = app_client.post("/v1/jobs", json=policy, headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/policy", r.text
    assert project_jobs(app_client, h) == []
    for ok in (tiny_model, "Qwen/Qwen2.5-0.5B"):
        r = app_client.post("/v1/jobs", json=parked_eval(model=ok), headers=h)
        assert r.status_code == 201, (ok, r.text)
    # a job ref must name a job of the project that trains a model (tests/unit/api/test_hardening.py
    # checks the refusals)
    trained = app_client.post("/v1/jobs", json=parked_grpo(), headers=h).json()["id"]
    r = app_client.post("/v1/jobs", json=parked_eval(model=f"job:{trained}"), headers=h)
    assert r.status_code == 201, r.text


# --- 5. no code from users ----------------------------------------------------------------


@pytest.mark.quick
def test_unknown_reward_name_is_422(app_client: Any) -> None:
    h = admin_key(app_client)
    r = app_client.post("/v1/jobs", json=parked_grpo(rewards=[{"name": "os.system"}]), headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/rewards/0/name", r.text
    assert project_jobs(app_client, h) == []


@pytest.mark.quick
def test_yaml_python_tags_are_refused(tmp_path: Path) -> None:
    import typer

    from mathrl.cli import load_spec_file

    marker = tmp_path / "pwned"
    spec = tmp_path / "spec.yaml"
    spec.write_text(f'!!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(typer.BadParameter, match="not valid YAML"):
        load_spec_file(spec)
    nested = tmp_path / "nested.yaml"
    nested.write_text(f'kind: eval\nmodel: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(typer.BadParameter):
        load_spec_file(nested)
    assert not marker.exists()


@pytest.mark.quick
def test_trust_remote_code_only_for_operator_listed_models(tmp_path: Path) -> None:
    from evaluator.models import remote_code_kwargs

    allowed = ["org/custom-arch", str(tmp_path / "local-model")]
    assert remote_code_kwargs("org/custom-arch", allowed) == {"trust_remote_code": True}
    assert remote_code_kwargs(str(tmp_path / "local-model"), allowed) == {"trust_remote_code": True}
    assert remote_code_kwargs(f"{tmp_path}/x/../local-model", allowed) == {"trust_remote_code": True}
    assert remote_code_kwargs("org/other", allowed) == {}
    assert remote_code_kwargs("org/custom-arch", []) == {}
    # the job process passes the operator's list in; the evaluator reads no settings itself
    from evaluator.models import trust_remote_code_for

    assert remote_code_kwargs("org/custom-arch") == {}
    trust_remote_code_for(allowed)
    try:
        assert remote_code_kwargs("org/custom-arch") == {"trust_remote_code": True}
    finally:
        trust_remote_code_for([])
    # a spec cannot ask for it: there is no such field
    from pydantic import ValidationError

    from mathrl.specs import parse_spec

    with pytest.raises(ValidationError, match="trust_remote_code"):
        parse_spec({"kind": "eval", "model": "org/custom-arch", "trust_remote_code": True})


# --- 6. keys ------------------------------------------------------------------------------


def _new_key(app_client: Any, project: str | None = None) -> dict[str, Any]:
    r = app_client.post(
        "/v1/keys",
        json={"project": project or f"k-{uuid.uuid4().hex[:8]}"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert r.status_code == 201
    return dict(r.json())


@pytest.mark.quick
def test_expired_and_revoked_keys_are_refused(app_client: Any) -> None:
    expired = _new_key(app_client)
    with db(app_client).begin() as c:
        past = datetime.now(UTC) - timedelta(seconds=1)
        c.execute(text("UPDATE api_keys SET expires_at = :t WHERE id = :i"), {"t": past, "i": expired["id"]})
    r = app_client.get("/v1/jobs", headers={"Authorization": f"Bearer {expired['key']}"})
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", r.text
    assert r.headers["content-type"].startswith("application/problem+json")

    revoked = _new_key(app_client)
    h = {"Authorization": f"Bearer {revoked['key']}"}
    assert app_client.get("/v1/jobs", headers=h).status_code == 200
    assert app_client.delete(f"/v1/keys/{revoked['id']}", headers=h).status_code == 204
    assert app_client.get("/v1/jobs", headers=h).status_code == 401
    assert app_client.post("/v1/jobs", json=parked_eval(), headers=h).status_code == 401


@pytest.mark.quick
def test_key_scopes_limit_what_a_key_may_do(app_client: Any) -> None:
    """Issue 16.6: any key of a project could do everything, minting more keys included."""
    owner = _new_key(app_client)
    assert owner["scopes"] == ["read", "submit", "keys"]
    h = {"Authorization": f"Bearer {owner['key']}"}
    reader = app_client.post("/v1/keys", json={"name": "dashboard", "scopes": ["read"]}, headers=h).json()
    submitter = app_client.post("/v1/keys", json={"name": "ci", "scopes": ["read", "submit"]}, headers=h).json()
    assert reader["scopes"] == ["read"] and submitter["scopes"] == ["read", "submit"]
    hr, hs = ({"Authorization": f"Bearer {k['key']}"} for k in (reader, submitter))

    job = app_client.post("/v1/jobs", json=parked_eval(), headers=hs)
    assert job.status_code == 201
    assert app_client.get(f"/v1/jobs/{job.json()['id']}", headers=hr).status_code == 200
    for r in (
        app_client.post("/v1/jobs", json=parked_eval(), headers=hr),
        app_client.post(f"/v1/jobs/{job.json()['id']}/cancel", headers=hr),
    ):
        assert r.status_code == 403 and "'submit' scope" in r.json()["detail"], r.text
    for headers in (hr, hs):  # neither can mint, list or revoke keys
        for r in (
            app_client.post("/v1/keys", json={"name": "more"}, headers=headers),
            app_client.get("/v1/keys", headers=headers),
            app_client.delete(f"/v1/keys/{owner['id']}", headers=headers),
        ):
            assert r.status_code == 403 and "'keys' scope" in r.json()["detail"], r.text
    # behind a proxy's prefix (a root path) the route is the same route: the URL's path began with it,
    # and a read key listed and minted keys
    from fastapi.testclient import TestClient

    prefixed = TestClient(app_client.app, root_path="/mathrl")
    for r in (prefixed.get("/mathrl/v1/keys", headers=hr), prefixed.post("/mathrl/v1/keys", json={}, headers=hs)):
        assert r.status_code == 403 and "'keys' scope" in r.json()["detail"], r.text
    assert prefixed.get("/mathrl/v1/keys", headers=h).status_code == 200
    # a key with 'keys' cannot grant more than it holds
    keeper = app_client.post("/v1/keys", json={"scopes": ["read", "keys"]}, headers=h).json()
    r = app_client.post("/v1/keys", json={"scopes": ["submit"]}, headers={"Authorization": f"Bearer {keeper['key']}"})
    assert r.status_code == 403 and r.json()["errors"][0]["pointer"] == "/scopes", r.text
    assert app_client.get("/v1/jobs", headers=h).status_code == 200  # the owner is unaffected


@pytest.mark.quick
def test_keys_expire_by_default_and_a_project_lists_its_own(app_client: Any) -> None:
    """Issue 16.6: keys never expired unless the creator asked; a project could not list its keys."""
    from datetime import UTC, datetime, timedelta

    owner = _new_key(app_client)
    h = {"Authorization": f"Bearer {owner['key']}"}
    expires = datetime.fromisoformat(owner["expires_at"])
    assert abs(expires - (datetime.now(UTC) + timedelta(days=90))) < timedelta(minutes=5)
    with overridden(auth={"default_key_days": 7}):
        week = app_client.post("/v1/keys", json={"name": "week"}, headers=h).json()
    assert abs(datetime.fromisoformat(week["expires_at"]) - (datetime.now(UTC) + timedelta(days=7))) < timedelta(
        minutes=5
    )
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with overridden(auth={"default_key_days": 0}):
        # by the admin token: a key that expires cannot make one that does not (test_hardening.py)
        forever = app_client.post("/v1/keys", json={"name": "forever", "project": owner["project"]}, headers=admin)
    forever = forever.json()
    assert forever["expires_at"] is None
    asked = app_client.post("/v1/keys", json={"name": "asked", "expires_in_days": 2}, headers=h).json()
    assert app_client.delete(f"/v1/keys/{asked['id']}", headers=h).status_code == 204

    other = _new_key(app_client)  # another project's key is not listed
    listed = app_client.get("/v1/keys", headers=h)
    assert listed.status_code == 200, listed.text
    rows = listed.json()["data"]
    assert [k["id"] for k in rows] == [asked["id"], forever["id"], week["id"], owner["id"]]
    assert other["id"] not in {k["id"] for k in rows} and all("key" not in k for k in rows)
    assert next(k for k in rows if k["id"] == asked["id"])["revoked_at"] is not None
    assert owner["key"] not in listed.text


@pytest.mark.quick
def test_keys_stored_hashed_and_echoed_only_once(app_client: Any) -> None:
    created = _new_key(app_client)
    secret = created["key"]
    with db(app_client).connect() as c:
        row = c.execute(text("SELECT * FROM api_keys WHERE id = :i"), {"i": created["id"]}).mappings().one()
    assert row["hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert all(secret not in str(v) for v in row.values())
    assert len(row["prefix"]) < len(secret) // 3  # only a short prefix to recognise it by
    h = {"Authorization": f"Bearer {secret}"}
    job = app_client.post("/v1/jobs", json=parked_eval(), headers=h).json()
    responses = [
        app_client.get("/v1/jobs", headers=h),
        app_client.get(f"/v1/jobs/{job['id']}", headers=h),
        app_client.get(f"/v1/jobs/{job['id']}/events", headers=h),
        app_client.post("/v1/jobs", json={"kind": "eval"}, headers=h),  # a 422
        app_client.post("/v1/keys", json={"name": "another"}, headers=h),  # another key's creation
        app_client.get("/v1/jobs", headers={"Authorization": f"Bearer {secret}x"}),  # a 401
        app_client.get("/v1/jobs/nope", headers=h),
    ]
    for r in responses:
        assert secret not in r.text and secret not in str(r.headers), r.request.url


@pytest.mark.quick
def test_a_pipeline_is_admitted_as_one_submission(app_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20.2: the jobs and pipelines routes had submit paths of their own, a spec was
    resolved twice per job, and a pipeline read the project's active jobs once per step. Now
    one path (api/submit.py): each spec resolved once, its config stored as resolved, one
    quota read per submission, and a quota crossed mid-pipeline points at that step."""
    import api.admission as admission
    import api.submit as submit

    resolved: list[str] = []
    quota_reads: list[int] = []
    real_resolve, real_quota = admission.resolve_config, submit.check_project_quota
    monkeypatch.setattr(admission, "resolve_config", lambda spec: resolved.append(spec.kind) or real_resolve(spec))
    monkeypatch.setattr(
        submit,
        "check_project_quota",
        lambda s, p, specs, st: quota_reads.append(len(specs)) or real_quota(s, p, specs, st),
    )
    h = admin_key(app_client)
    gpu = {**PARKED, "gpus": 2}
    steps = {"a": parked_eval(resources=gpu), "b": parked_eval(resources=gpu), "c": parked_eval(resources=gpu)}
    with overridden(limits={"max_active_gpus": 5}):
        r = app_client.post("/v1/pipelines", json={"jobs": steps}, headers=h)
        assert r.status_code == 429 and r.json()["errors"][0]["pointer"] == "/jobs/c/resources/gpus", r.text
        assert "step 'c'" in r.json()["detail"] and "6 GPUs" in r.json()["detail"]
        assert resolved == ["eval"] * 3 and quota_reads == [3]
        assert project_jobs(app_client, h) == []  # nothing stored
        resolved.clear()
        quota_reads.clear()
        r = app_client.post("/v1/pipelines", json={"jobs": {"a": steps["a"], "b": steps["b"]}}, headers=h)
        assert r.status_code == 201, r.text
        assert resolved == ["eval"] * 2 and quota_reads == [2]
    job = app_client.get(f"/v1/jobs/{r.json()['jobs'][0]['job_id']}", headers=h).json()
    # resolved once, at submit: the presets' values and, for an eval, its prompt recipe
    expected = real_resolve(parse_spec(job["spec"]))
    HOMES["eval"].admit(parse_spec(job["spec"]), expected, get_settings())
    assert job["resolved_config"] == expected.record()


@pytest.mark.quick
def test_concurrent_submits_at_the_last_free_slot_admit_one(pg_url: str) -> None:
    """Issue 18.4: eight submissions race for the project's last active-job slot on PostgreSQL.
    A job's insert raises the project's counters (a trigger) and holds the project's row until
    the submission commits; the quota is read after it, so exactly one is admitted and stored
    and the others see it and are refused (no over-admission). The steps of
    api.submit.commit_and_dispatch, with a pause where a racer would slip in."""
    import threading

    from api.admission import check_project_quota
    from api.problems import Problem
    from api.submit import admit, job_row
    from config.settings import Settings
    from mathrl.specs import parse_spec
    from store.db import session_scope
    from store.keys import get_or_create_project
    from store.models import Job

    settings = Settings(limits={"max_active_jobs": 3}, worker={"pools": {"abuse-parked": 0}})  # type: ignore[arg-type]
    with session_scope(pg_url) as s:
        project_id = get_or_create_project(s, f"race-{uuid.uuid4().hex[:8]}").id
        for _ in range(2):  # two of the three slots taken
            s.add(Job(project_id=project_id, kind="eval", spec={}, tags=[], queue="abuse-parked", status="queued"))
    spec = parse_spec(parked_eval())
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def submit() -> None:
        barrier.wait()
        try:
            with session_scope(pg_url) as s:
                config = admit({"": spec}, settings)[""]
                job = job_row(project_id, spec, config, settings)
                s.add(job)
                s.flush()
                time.sleep(0.2)  # between the insert and the quota read: a racer would slip in now
                check_project_quota(s, project_id, [("", job.gpus)], settings)
            outcomes.append("admitted")
        except Problem as exc:
            outcomes.append(f"{exc.status}")

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["429"] * 7 + ["admitted"], outcomes
    with session_scope(pg_url) as s:
        assert s.query(Job).filter_by(project_id=project_id).count() == 3
