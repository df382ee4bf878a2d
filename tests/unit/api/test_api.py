"""The REST API in-process on real PostgreSQL and Redis: validation, idempotency, pagination,
isolation between projects, keys. Jobs here go to the 'gpu-1' queue, which no test worker
consumes, so they stay queued."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.helpers.api import admin_key
from tests.helpers.env import ADMIN_TOKEN

pytestmark = pytest.mark.quick

PARKED = {"resources": {"gpus": 1}}  # a queue no worker serves in these tests


def eval_spec(**over: Any) -> dict[str, Any]:
    return {"kind": "eval", "model": "org/model", "limit": 5, **PARKED, **over}


GRPO = {"kind": "grpo", "model": "org/m", "dataset": {"name": "gsm8k-train"}}

MALFORMED: list[tuple[dict[str, Any], str]] = [
    ({"model": "org/m"}, "/kind"),
    ({"kind": "train", "model": "org/m"}, "/kind"),
    ({"kind": "eval"}, "/model"),
    ({"kind": "eval", "model": ""}, "/model"),
    ({"kind": "eval", "model": "https://x.example/m"}, "/model"),
    ({"kind": "eval", "model": "org/m", "limit": 0}, "/limit"),
    ({"kind": "eval", "model": "org/m", "limit": "ten"}, "/limit"),
    ({"kind": "eval", "model": "org/m", "backend": "tgi"}, "/backend"),
    ({"kind": "eval", "model": "org/m", "sampling": {"temperature": -1}}, "/sampling/temperature"),
    ({"kind": "eval", "model": "org/m", "sampling": {"top_p": 0}}, "/sampling/top_p"),
    ({"kind": "eval", "model": "org/m", "sampling": {"n": 4}}, "/sampling/n"),
    ({"kind": "eval", "model": "org/m", "k": [4]}, "/k"),
    ({"kind": "eval", "model": "org/m", "tempurature": 0.5}, "/tempurature"),
    ({"kind": "eval", "model": "org/m", "tags": ["has space"]}, "/tags"),
    ({"kind": "eval", "model": "org/m", "resources": {"gpus": -1}}, "/resources/gpus"),
    ({"kind": "eval", "model": "org/m", "max_attempts": 0}, "/max_attempts"),
    # issue 16.9: unknown registered names were accepted (201) and failed the job later
    ({"kind": "eval", "model": "org/m", "benchmark": "gsm9k"}, "/benchmark"),
    ({**GRPO, "dataset": {"name": "gsm8k-trian"}}, "/dataset/name"),
    ({**GRPO, "eval": {"benchmark": "add2-wrods"}}, "/eval/benchmark"),
    ({**GRPO, "eval": {"benchmark": "add2-words", "every": 0}}, "/eval/every"),
    ({**GRPO, "dynamic_sampling": {"max_rounds": 0}}, "/dynamic_sampling/max_rounds"),
    ({**GRPO, "rewards": [{"name": "format"}], "curriculum": True}, "/curriculum"),
    ({**GRPO, "num_generations": 1}, "/num_generations"),
    ({**GRPO, "beta": -0.5}, "/beta"),
    ({**GRPO, "num_generations": 3}, "/num_generations"),
    ({**GRPO, "loss_type": "ppo"}, "/loss_type"),
    ({**GRPO, "lora": {"enabled": False, "r": 4}}, "/lora/r"),
    ({**GRPO, "vllm_mode": "colocate"}, "/vllm_mode"),
    (
        {**GRPO, "resources": {"gpus": 1}, "generation": {"gpu_memory_utilization": 0}},
        "/generation/gpu_memory_utilization",
    ),
    ({**GRPO, "generation": {"backend": "vllm", "tensor_parallel_size": 2}}, "/generation/tensor_parallel_size"),
    ({**GRPO, "rewards": [{"name": "reward_model"}]}, "/rewards/0/model"),
    ({**GRPO, "rewards": []}, "/rewards"),
    ({"kind": "grpo", "model": "org/m"}, "/dataset"),
    ({**GRPO, "dataset": {"name": "gsm8k", "path": "/x.jsonl"}}, "/dataset/name"),
    (
        {"kind": "reward_model", "model": "org/m", "dataset": {"name": "gsm8k"}, "samples_per_question": 1},
        "/samples_per_question",
    ),
    (
        {"kind": "reward_model", "model": "org/m", "dataset": {"name": "gsm8k"}, "completions_per_step": 2},
        "/completions_per_step",
    ),
]


@pytest.mark.parametrize(("body", "pointer"), MALFORMED)
def test_malformed_specs_are_422_problems_naming_the_field(app_client: Any, body: dict, pointer: str) -> None:
    r = app_client.post("/v1/jobs", json=body, headers=admin_key(app_client))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert {"type", "title", "status", "detail"} <= problem.keys() and problem["status"] == 422
    pointers = [e["pointer"] for e in problem["errors"]]
    assert pointer in pointers, pointers
    assert all(e["detail"] for e in problem["errors"])
    assert "Traceback" not in r.text


def test_a_nul_character_anywhere_in_a_spec_is_a_422_naming_the_field(app_client: Any) -> None:
    """PostgreSQL keeps a NUL escape in a JSON column, then fails every operator that reads it as
    text: a fuzzer's spec with one broke migration 0007 for the whole database. Refused at the
    door instead, for a job, a pipeline's step and a grade job's items."""
    h = admin_key(app_client)
    cases = [
        (
            "/v1/jobs",
            {"kind": "eval", "model": "org/m", "recipe": {"question": "Q: {question}\u0000"}},
            "/recipe/question",
        ),
        (
            "/v1/pipelines",
            {
                "name": "p",
                "jobs": {"a": {"kind": "eval", "model": "org/m", "recipe": {"question": "{question}\u0000"}}},
            },
            "/jobs/a/recipe/question",
        ),
    ]
    for path, body, pointer in cases:
        r = app_client.post(path, json=body, headers=h)
        assert r.status_code == 422, r.text
        assert [e["pointer"] for e in r.json()["errors"]] == [pointer], r.text
        assert "NUL" in r.json()["detail"]
    assert app_client.get("/v1/jobs", headers=h).status_code == 200  # nothing broke


def test_non_json_body_is_a_problem(app_client: Any) -> None:
    r = app_client.post(
        "/v1/jobs", content=b"{not json", headers={**admin_key(app_client), "content-type": "application/json"}
    )
    assert r.status_code == 422 and r.json()["title"] == "Invalid request"


def test_submit_stores_spec_and_resolved_config(app_client: Any) -> None:
    h = admin_key(app_client)
    r = app_client.post("/v1/jobs", json={**GRPO, "preset": "deepseekmath", "beta": 0.0, **PARKED}, headers=h)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["status"] == "queued" and job["queue"] == "gpu-1"
    assert job["resolved_config"]["beta"] == 0.0 and job["resolved_config"]["num_generations"] == 64
    assert job["resolved_config"]["learning_rate"] == 1e-6
    events = app_client.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["data"]
    assert events[0]["type"] == "queued"


def test_idempotent_submit(app_client: Any) -> None:
    h = {**admin_key(app_client), "Idempotency-Key": str(uuid.uuid4())}
    a = app_client.post("/v1/jobs", json=eval_spec(), headers=h)
    b = app_client.post("/v1/jobs", json=eval_spec(), headers=h)
    assert a.status_code == 201 and b.status_code == 200
    assert a.json()["id"] == b.json()["id"] and b.headers["Idempotent-Replayed"] == "true"
    c = app_client.post("/v1/jobs", json=eval_spec(limit=6), headers=h)
    assert c.status_code == 409 and "Idempotency-Key" in c.json()["detail"]
    listed = app_client.get("/v1/jobs", headers=h).json()["data"]
    assert len(listed) == 1


@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/pipelines", "/v1/fine_tuning/jobs", "/v1/files"])
def test_an_empty_idempotency_key_is_refused_naming_the_header(app_client: Any, route: str) -> None:
    """An empty key was stored as a key: the second create with one hit the unique index, and the
    database error answered 503 'unreachable' (found by test_fuzz_openapi)."""
    h = {**admin_key(app_client), "Idempotency-Key": ""}
    body: dict[str, Any] = {"jobs": {"e": eval_spec()}} if route == "/v1/pipelines" else eval_spec()
    if route == "/v1/fine_tuning/jobs":
        body = {"model": "tiny", "training_file": "file-none"}
    rows = b'{"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]}\n'
    for _ in range(2):
        if route == "/v1/files":
            files = {"file": ("t.jsonl", rows)}
            r = app_client.post(route, data={"purpose": "fine-tune"}, files=files, headers=h)
        else:
            r = app_client.post(route, json=body, headers=h)
        openai = route.startswith(("/v1/fine_tuning", "/v1/files"))
        assert r.status_code == (400 if openai else 422), r.text  # OpenAI's routes answer 400
        assert r.json()["errors"][0]["pointer"] == "header:/idempotency-key"
        assert "leave the header out" in r.json()["detail"]
        if openai:
            assert r.json()["error"]["param"] == "idempotency-key"
    assert app_client.get("/v1/jobs", headers=h).json()["data"] == []
    assert app_client.get("/v1/files", headers=h).json()["data"] == []


def test_pagination_walks_every_job_once(app_client: Any) -> None:
    h = admin_key(app_client)
    ids = [
        app_client.post("/v1/jobs", json=eval_spec(tags=["page"] if i % 2 else []), headers=h).json()["id"]
        for i in range(7)
    ]
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = app_client.get("/v1/jobs", params=params, headers=h).json()
        seen += [j["id"] for j in page["data"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == list(reversed(ids))
    tagged = app_client.get("/v1/jobs", params={"tag": "page"}, headers=h).json()["data"]
    assert [j["id"] for j in tagged] == [i for n, i in enumerate(reversed(ids)) if (6 - n) % 2]
    assert app_client.get("/v1/jobs", params={"kind": "grpo"}, headers=h).json()["data"] == []
    bad = app_client.get("/v1/jobs", params={"cursor": "'; drop table jobs"}, headers=h)
    assert bad.status_code == 400 and bad.json()["errors"][0]["pointer"] == "query:/cursor"


def test_metrics_come_in_pages_of_whole_steps(app_client: Any, db_url: str) -> None:
    """Issue 16.9: the metrics route returned every point of a job in one response."""
    from store.db import session_scope
    from store.models import Metric, utcnow

    h = admin_key(app_client)
    job_id = app_client.post("/v1/jobs", json=eval_spec(), headers=h).json()["id"]
    with session_scope(db_url) as s:
        s.add_all(
            [
                Metric(job_id=job_id, name=n, step=step, value=float(step), time=utcnow())
                for step in range(10)
                for n in ("loss", "reward", "kl")
            ]
        )
    pages, after = [], None
    while True:
        params = {"limit": 7, **({"after_step": after} if after is not None else {})}
        page = app_client.get(f"/v1/jobs/{job_id}/metrics", params=params, headers=h).json()
        pages.append({s["name"]: [p["step"] for p in s["points"]] for s in page["data"]})
        if not (after := page["next_cursor"]):
            break
    assert pages[0] == {"kl": [0, 1], "loss": [0, 1], "reward": [0, 1]}  # 6 points: step 2 would split
    assert len(pages) == 5 and all(sum(map(len, p.values())) <= 7 for p in pages)
    walked = {n: [step for p in pages for step in p.get(n, [])] for n in ("kl", "loss", "reward")}
    assert walked == {n: list(range(10)) for n in ("kl", "loss", "reward")}
    one = app_client.get(f"/v1/jobs/{job_id}/metrics", params={"limit": 2}, headers=h).json()
    assert sum(len(s["points"]) for s in one["data"]) == 3 and one["next_cursor"] == "0"  # a step is never split


def test_tag_filter_finds_a_match_behind_many_newer_jobs(app_client: Any) -> None:
    """Issue 16.9: the tag filter scanned 20 pages' worth of rows in Python and stopped there:
    one tagged job behind 21 newer untagged ones was not listed."""
    h = admin_key(app_client)
    tagged = app_client.post("/v1/jobs", json=eval_spec(tags=["needle"]), headers=h).json()["id"]
    for _ in range(21):
        app_client.post("/v1/jobs", json=eval_spec(), headers=h)
    page = app_client.get("/v1/jobs", params={"tag": "needle", "limit": 1}, headers=h).json()
    assert [j["id"] for j in page["data"]] == [tagged] and page["next_cursor"] is None


def test_another_projects_job_is_404_everywhere(app_client: Any) -> None:
    a, b = admin_key(app_client), admin_key(app_client)
    job_id = app_client.post("/v1/jobs", json=eval_spec(), headers=a).json()["id"]
    for method, path in [
        ("GET", f"/v1/jobs/{job_id}"),
        ("POST", f"/v1/jobs/{job_id}/cancel"),
        ("GET", f"/v1/jobs/{job_id}/events"),
        ("GET", f"/v1/jobs/{job_id}/events/stream"),
        ("GET", f"/v1/jobs/{job_id}/metrics"),
        ("GET", f"/v1/jobs/{job_id}/samples"),
        ("GET", f"/v1/jobs/{job_id}/checkpoints"),
    ]:
        r = app_client.request(method, path, headers=b)
        assert r.status_code == 404, (path, r.status_code)
        assert r.json()["detail"] == "No job with this id in your project."
    assert app_client.get("/v1/jobs", headers=b).json()["data"] == []
    assert app_client.get(f"/v1/jobs/{job_id}", headers=a).json()["status"] == "queued"  # B's cancel did nothing


def test_cancel_queued_job(app_client: Any) -> None:
    h = admin_key(app_client)
    job_id = app_client.post("/v1/jobs", json=eval_spec(), headers=h).json()["id"]
    r = app_client.post(f"/v1/jobs/{job_id}/cancel", headers=h)
    assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["finished_at"]
    again = app_client.post(f"/v1/jobs/{job_id}/cancel", headers=h)
    assert again.json()["status"] == "cancelled"


def test_auth_errors(app_client: Any) -> None:
    assert app_client.get("/v1/jobs").status_code == 401
    r = app_client.get("/v1/jobs", headers={"Authorization": "Bearer mrl_nope"})
    assert r.status_code == 401 and "mathrl keys create" in r.json()["detail"]
    assert app_client.get("/v1/jobs", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 403


def test_keys_create_and_revoke(app_client: Any) -> None:
    h = admin_key(app_client, "keys-proj")
    created = app_client.post("/v1/keys", json={"name": "second"}, headers=h)
    assert created.status_code == 201
    body = created.json()
    assert body["project"] == "keys-proj" and body["key"].startswith("mrl_") and body["prefix"] in body["key"]
    h2 = {"Authorization": f"Bearer {body['key']}"}
    assert app_client.get("/v1/jobs", headers=h2).status_code == 200
    forbidden = app_client.post("/v1/keys", json={"project": "someone-else"}, headers=h)
    assert forbidden.status_code == 403
    assert app_client.delete(f"/v1/keys/{body['id']}", headers=h).status_code == 204
    assert app_client.get("/v1/jobs", headers=h2).status_code == 401
    assert app_client.delete(f"/v1/keys/{body['id']}", headers=h).status_code == 404


def test_health_docs_metrics_and_limits(app_client: Any) -> None:
    assert app_client.get("/livez").json() == {"status": "ok"}
    ready = app_client.get("/readyz").json()
    assert ready["checks"] == {"database": "ok", "broker": "ok"}
    assert app_client.get("/docs").status_code == 200
    assert "/v1/jobs" in app_client.get("/openapi.json").json()["paths"]
    assert "mathrl_http_requests_total" in app_client.get("/metrics").text
    big = app_client.post(
        "/v1/jobs", content=b"x" * 2_000_000, headers={**admin_key(app_client), "content-type": "application/json"}
    )
    assert big.status_code == 413 and big.json()["status"] == 413
    assert app_client.get("/v1/nothing-here").json()["status"] == 404


@pytest.mark.parametrize(
    ("over", "pointer", "says"),
    [
        ({"recipe": "lm-eval-gsm8"}, "/recipe", "Did you mean 'lm-eval-gsm8k'"),
        ({"recipe": "lm-eval-gsm8k-cot", "few_shot": 9}, "/few_shot", "more than the 8 shots"),
        ({"recipe": {"few_shot": 2}}, "/recipe/few_shot", "needs 'shots' or 'shots_from'"),
        ({"recipe": {"answer_pattern": "(unclosed"}}, "/recipe/answer_pattern", "not a regular expression"),
        ({"recipe": {"few_shot": 1, "shots_from": "gsm9k-train"}}, "/recipe/shots_from", "Did you mean"),
        ({"benchmark": "arith", "few_shot": 2}, "/few_shot", "needs 'shots' or 'shots_from'"),
    ],
)
def test_bad_recipes_are_refused_with_the_field_named(
    app_client: Any, over: dict[str, Any], pointer: str, says: str
) -> None:
    headers = admin_key(app_client)
    before = app_client.get("/v1/jobs", headers=headers).json()["data"]
    r = app_client.post("/v1/jobs", json=eval_spec(**over), headers=headers)
    assert r.status_code == 422, r.text
    body = r.json()
    assert [e["pointer"] for e in body["errors"]] == [pointer], body
    assert says in body["errors"][0]["detail"], body
    assert app_client.get("/v1/jobs", headers=headers).json()["data"] == before  # nothing stored


def test_an_eval_stores_its_resolved_recipe(app_client: Any) -> None:
    headers = admin_key(app_client)
    r = app_client.post("/v1/jobs", json=eval_spec(recipe="lm-eval-gsm8k", few_shot=3), headers=headers)
    assert r.status_code == 201, r.text
    config = app_client.get(f"/v1/jobs/{r.json()['id']}", headers=headers).json()["resolved_config"]
    assert config["recipe"]["name"] == "lm-eval-gsm8k" and config["recipe"]["few_shot"] == 3
    assert config["recipe"]["stop"][0] == "Question:" and config["sampling"]["max_new_tokens"] == 256


def test_unknown_benchmark_names_the_close_ones(app_client: Any) -> None:
    r = app_client.post("/v1/jobs", json=eval_spec(benchmark="gsm9k"), headers=admin_key(app_client))
    assert r.status_code == 422 and r.json()["title"] == "Unknown benchmark", r.text
    assert "Did you mean 'gsm8k'?" in r.json()["detail"] and "dataset.path" in r.json()["detail"]
