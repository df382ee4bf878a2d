"""OpenAI's Evals API through the real `openai` package, in process on an app of the module's own
(tests.helpers.api.private_app: no worker, runs stay queued): evals created, listed, updated and
deleted; each bad field a 400 naming it, before anything is stored (api/routers/openai_evals.py).
tests/system/test_openai_evals.py runs them on a worker."""

from __future__ import annotations

import io
import json
import uuid
from typing import Any

import pytest

from tests.helpers.api import admin_key, db, private_app_client

pytestmark = pytest.mark.quick


# the session's `app_client` shares its database and broker with the suite's workers: in CI
# (2026-11-29) one took a run here, which then read in_progress after its cancel
app_client = private_app_client()


SCHEMA = {"type": "custom", "item_schema": {"type": "object"}, "include_sample_schema": True}
EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.answer}}",
    "operation": "eq",
}
TEMPLATE = {"type": "template", "template": [{"role": "user", "content": "{{item.question}}"}]}


def _client(app_client: Any) -> Any:
    from openai import OpenAI

    key = admin_key(app_client)["Authorization"].removeprefix("Bearer ")
    return OpenAI(base_url=f"{app_client.base_url}/v1", api_key=key, http_client=app_client, max_retries=0)


def _items(client: Any, rows: list[dict[str, Any]]) -> Any:
    data = "".join(json.dumps({"item": r}) + "\n" for r in rows).encode()
    return client.files.create(file=("items.jsonl", io.BytesIO(data)), purpose="evals")


def test_evals_are_created_listed_updated_and_deleted(app_client: Any) -> None:
    import openai

    client = _client(app_client)
    made = [client.evals.create(name=f"e{i}", data_source_config=SCHEMA, testing_criteria=[EXACT]) for i in range(3)]
    assert [e.name for e in client.evals.list()] == ["e0", "e1", "e2"]  # oldest first, as OpenAI lists them
    page = client.evals.list(limit=2, order="desc")
    assert [e.name for e in page.data] == ["e2", "e1"] and page.has_more
    assert [e.name for e in client.evals.list(order="desc")] == ["e2", "e1", "e0"]  # the SDK pages on by `after`
    got = client.evals.retrieve(made[0].id)
    assert got.testing_criteria[0].name == "exact" and got.data_source_config.type == "custom"
    updated = client.evals.update(made[0].id, name="renamed", metadata={"team": "math"})
    assert (updated.name, updated.metadata) == ("renamed", {"team": "math"})
    assert client.evals.retrieve(made[0].id).name == "renamed"
    assert client.evals.delete(made[1].id).deleted
    with pytest.raises(openai.NotFoundError):
        client.evals.retrieve(made[1].id)
    other = _client(app_client)  # another project
    for call in (lambda: other.evals.retrieve(made[0].id), lambda: other.evals.delete(made[0].id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert list(other.evals.list()) == []


@pytest.mark.parametrize(
    ("config", "criteria", "pointer"),
    [
        ({"type": "stored_completions"}, [EXACT], "/data_source_config/type"),
        ({"type": "logs"}, [EXACT], "/data_source_config/type"),
        ({"type": "custom"}, [EXACT], "/data_source_config/item_schema"),
        (SCHEMA, [{**EXACT, "type": "cosine_check"}], "/testing_criteria/0/type"),
        (SCHEMA, [{**EXACT, "name": ""}], "/testing_criteria/0/name"),
        (SCHEMA, [EXACT, {**EXACT, "operation": "like_sql"}], "/testing_criteria/1/operation"),
        (
            SCHEMA,
            [
                {
                    "type": "text_similarity",
                    "name": "t",
                    "input": "{{sample.output_text}}",
                    "reference": "x",
                    "evaluation_metric": "bleu",
                }
            ],
            "/testing_criteria/0/pass_threshold",
        ),  # fmt: skip
        (SCHEMA, [{"type": "python", "name": "p", "source": "def grade(:"}], "/testing_criteria/0/source"),
        (SCHEMA, [{**EXACT, "pass_threshold": 0.5}], "/testing_criteria/0/pass_threshold"),
        (
            SCHEMA,
            [
                {
                    "type": "score_model",
                    "name": "judge",
                    "model": "gpt-4o-2024-08-06",
                    "input": [{"role": "user", "content": "{{sample.output_text}}"}],
                }
            ],
            "/testing_criteria/0/model",
        ),  # fmt: skip
        (SCHEMA, [{**EXACT, "name": f"c{i}"} for i in range(17)], "/testing_criteria"),
    ],
)
def test_a_bad_eval_is_a_400_naming_the_field_and_nothing_is_stored(
    app_client: Any, config: dict[str, Any], criteria: list[dict[str, Any]], pointer: str
) -> None:
    import openai

    client = _client(app_client)
    with pytest.raises(openai.BadRequestError) as e:
        client.evals.create(data_source_config=config, testing_criteria=criteria)
    assert e.value.body["param"] == pointer or pointer in str(e.value), (pointer, e.value)
    assert list(client.evals.list()) == []


def test_a_bad_run_is_a_400_naming_the_field_and_leaves_nothing_behind(app_client: Any) -> None:
    import openai

    client = _client(app_client)
    ev = client.evals.create(data_source_config=SCHEMA, testing_criteria=[EXACT])
    items = _items(client, [{"question": "1 + 1?", "answer": "2"}])
    source = {"type": "file_id", "id": items.id}
    inline = {"type": "file_content", "content": [{"item": {"question": "1 + 1?", "answer": "2"}}]}
    base = {"type": "completions", "model": "org/model", "input_messages": TEMPLATE, "source": source}
    sample_template = {"type": "template", "template": [{"role": "user", "content": "{{sample.output_text}}"}]}
    cases = [
        ({"type": "chat", "source": source}, "/data_source/type"),
        ({**base, "type": "responses", "source": {"type": "responses"}}, "/data_source/source/type"),
        (
            {**base, "type": "responses", "sampling_params": {"tools": [{"type": "web_search"}]}},
            "/data_source/sampling_params/tools",
        ),
        (
            {**base, "type": "responses", "sampling_params": {"text": {"format": {"type": "json_object"}}}},
            "/data_source/sampling_params/text/format",
        ),
        ({**base, "model": "gpt-4o-mini"}, "/data_source/model"),
        ({**base, "model": "ft:model:x:ftjob-0123456789abcdef0123456789abcdef"}, "/data_source/model"),
        (
            {**base, "input_messages": {"type": "item_reference", "item_reference": "question"}},
            "/data_source/input_messages",
        ),
        ({**base, "source": {"type": "file_id", "id": "file-" + "0" * 32}}, "/data_source/source/id"),
        ({**base, "sampling_params": {"logit_bias": {}}}, "/data_source/sampling_params/logit_bias"),
        # refused after its inline items were stored as a file: the file goes with it
        ({**base, "source": inline, "input_messages": sample_template}, "/data_source/input_messages/template"),
        ({"type": "jsonl", "source": inline}, "/data_source/source/content/0/sample"),
    ]
    for data_source, pointer in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.evals.runs.create(ev.id, data_source=data_source)
        assert pointer in str(e.value), (pointer, e.value)
    assert list(client.evals.runs.list(ev.id)) == []
    assert [f.id for f in client.files.list()] == [items.id]  # no inline items left behind
    other = _client(app_client)
    other_ev = other.evals.create(data_source_config=SCHEMA, testing_criteria=[EXACT])
    with pytest.raises(openai.BadRequestError, match="/data_source/source/id"):  # another project's file
        other.evals.runs.create(other_ev.id, data_source=base)
    with pytest.raises(openai.NotFoundError):  # another project's eval
        other.evals.runs.create(ev.id, data_source=base)


def test_a_responses_run_as_the_guide_writes_it_is_the_same_eval_job_as_a_completions_run(app_client: Any) -> None:
    """Issue 69.3: the current Evals guide's `responses` data source was a 400 ("use 'completions'")."""
    client = _client(app_client)
    headers = {"Authorization": f"Bearer {client.api_key}"}
    ev = client.evals.create(data_source_config=SCHEMA, testing_criteria=[EXACT])
    items = _items(client, [{"question": "1 + 1?", "answer": "2"}])
    template = [
        {"type": "message", "role": "developer", "content": "Answer with the number only."},
        {"type": "message", "role": "user", "content": {"type": "input_text", "text": "{{item.question}}"}},
    ]
    common = {"model": "org/model", "source": {"type": "file_id", "id": items.id}}
    sampling = {"temperature": 0.0, "max_completion_tokens": 16, "seed": 3}
    run = client.evals.runs.create(
        ev.id,
        data_source={
            **common,
            "type": "responses",
            "input_messages": {"type": "template", "template": template},
            "sampling_params": {**sampling, "text": {"format": {"type": "text"}}},
        },
    )
    assert run.data_source.type == "responses" and run.model == "org/model" and run.status == "queued", run
    twin = client.evals.runs.create(
        ev.id,
        data_source={
            **common,
            "type": "completions",
            "input_messages": {"type": "template", "template": template},
            "sampling_params": sampling,
        },
    )
    specs = {j["id"]: j["spec"] for j in app_client.get("/v1/jobs?tag=openai:eval_run", headers=headers).json()["data"]}
    got, want = (specs[str(uuid.UUID(r.id.removeprefix("evalrun_")))] for r in (run, twin))
    assert {k: v for k, v in got.items() if k != "tags"} == {k: v for k, v in want.items() if k != "tags"}
    assert [m["role"] for m in got["dataset"]["template"]] == ["developer", "user"]  # the system prompt when rendered
    assert got["sampling"]["max_new_tokens"] == 16 and got["sampling"]["temperature"] == 0.0
    assert client.evals.runs.retrieve(run.id, eval_id=ev.id).data_source.type == "responses"
    for made in (run, twin):
        client.evals.runs.cancel(made.id, eval_id=ev.id)


def test_a_run_is_an_eval_job_of_the_project_and_the_eval_waits_for_it(app_client: Any) -> None:
    """A completions run is an eval job over the items, its prompt the template; deleting the eval
    while it has not ended is a 409; cancelling the run cancels the job."""
    import openai

    client = _client(app_client)
    headers = {"Authorization": f"Bearer {client.api_key}"}
    ev = client.evals.create(data_source_config=SCHEMA, testing_criteria=[EXACT])
    items = _items(client, [{"question": "1 + 1?", "answer": "2"}])
    run = client.evals.runs.create(
        ev.id,
        name="base",
        data_source={
            "type": "completions",
            "model": "org/model",
            "input_messages": TEMPLATE,
            "source": {"type": "file_id", "id": items.id},
            "sampling_params": {"temperature": 0.5, "max_completion_tokens": 32, "seed": 4},
        },
    )
    assert (run.status, run.name, run.model, run.eval_id) == ("queued", "base", "org/model", ev.id)
    assert run.result_counts.total == 0
    jobs = app_client.get("/v1/jobs?tag=openai:eval_run", headers=headers).json()["data"]
    assert len(jobs) == 1
    job = app_client.get(f"/v1/jobs/{jobs[0]['id']}", headers=headers).json()
    spec = job["spec"]
    dataset = spec["dataset"]
    assert spec["kind"] == "eval" and (dataset["file"], dataset["format"]) == (items.id, "items")
    assert [(m["role"], m["content"]) for m in dataset["template"]] == [("user", "{{item.question}}")]
    assert spec["sampling"]["max_new_tokens"] == 32 and spec["sampling"]["temperature"] == 0.5
    assert spec["grader"]["type"] == "multi" and list(spec["grader"]["graders"]) == ["c0"]
    # content as OpenAI's eval items hold it (input_text parts); the graders' spelling of the length
    parts = {
        "type": "template",
        "template": [{"role": "user", "content": {"type": "input_text", "text": "{{item.question}}"}}],
    }
    second = client.evals.runs.create(
        ev.id,
        data_source={
            "type": "completions",
            "model": "org/model",
            "input_messages": parts,
            "source": {"type": "file_id", "id": items.id},
            "sampling_params": {"max_completions_tokens": 12},
        },
    )
    effort = client.evals.runs.create(
        ev.id,
        data_source={
            "type": "completions",
            "model": "org/model",
            "input_messages": TEMPLATE,
            "source": {"type": "file_id", "id": items.id},
            "sampling_params": {"reasoning_effort": "medium"},
        },
    )
    specs = {j["id"]: j["spec"] for j in app_client.get("/v1/jobs?tag=openai:eval_run", headers=headers).json()["data"]}
    made = specs[str(uuid.UUID(second.id.removeprefix("evalrun_")))]
    assert made["dataset"]["template"][0]["content"] == "{{item.question}}" and made["sampling"]["max_new_tokens"] == 12
    assert specs[str(uuid.UUID(effort.id.removeprefix("evalrun_")))]["sampling"]["max_new_tokens"] == 1024
    for bad_params, pointer in (
        ({"reasoning_effort": "extreme"}, "/reasoning_effort"),
        ({"response_format": {"type": "json_object"}}, "/response_format"),
    ):
        with pytest.raises(openai.BadRequestError, match=pointer):
            client.evals.runs.create(
                ev.id,
                data_source={
                    "type": "completions",
                    "model": "org/model",
                    "input_messages": TEMPLATE,
                    "source": {"type": "file_id", "id": items.id},
                    "sampling_params": bad_params,
                },
            )
    image = {"type": "template", "template": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}
    with pytest.raises(openai.BadRequestError, match="/data_source/input_messages/template/0/content"):
        client.evals.runs.create(
            ev.id,
            data_source={
                "type": "completions",
                "model": "org/model",
                "input_messages": image,
                "source": {"type": "file_id", "id": items.id},
            },
        )
    for extra in (second, effort):
        client.evals.runs.cancel(extra.id, eval_id=ev.id)
    with pytest.raises(openai.ConflictError):
        client.evals.delete(ev.id)
    assert client.evals.runs.cancel(run.id, eval_id=ev.id).status == "canceled"
    assert client.evals.delete(ev.id).deleted


def test_a_retried_eval_create_returns_the_first_eval(app_client: Any) -> None:
    """evals.create made a second eval on a retry (the SDK retries a create that timed out): the
    same Idempotency-Key, or the SDK's own retry of the same request, returns the first one."""
    client = _client(app_client)
    h = {"Authorization": f"Bearer {client.api_key}"}
    body = {"name": "once", "data_source_config": SCHEMA, "testing_criteria": [EXACT]}
    first = app_client.post("/v1/evals", json=body, headers={**h, "Idempotency-Key": "k1"})
    again = app_client.post("/v1/evals", json=body, headers={**h, "Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert first.json()["id"] == again.json()["id"]
    other = app_client.post("/v1/evals", json={**body, "name": "twice"}, headers={**h, "Idempotency-Key": "k1"})
    assert other.status_code == 409, other.text
    keyless = {"data_source_config": SCHEMA, "testing_criteria": [EXACT], "name": "sdk"}
    made = app_client.post("/v1/evals", json=keyless, headers=h).json()
    retried = app_client.post("/v1/evals", json=keyless, headers={**h, "x-stainless-retry-count": "1"})
    assert retried.json()["id"] == made["id"] and retried.headers["idempotent-replayed"] == "true"
    assert [e.name for e in client.evals.list()] == ["once", "sdk"]
    another = admin_key(app_client)  # keys are per project: the same key elsewhere is a new eval
    theirs = app_client.post("/v1/evals", json=body, headers={**another, "Idempotency-Key": "k1"})
    assert theirs.status_code == 200 and theirs.json()["id"] != first.json()["id"]


def test_a_large_runs_output_items_are_paged_from_the_database(app_client: Any) -> None:
    """Output items were all loaded and paged in Python (issue 68.2): each page now reads its
    samples a batch at a time after the cursor's, in either order, with or without a status."""
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    from store.models import Job, Sample

    client = _client(app_client)
    ev = client.evals.create(data_source_config=SCHEMA, testing_criteria=[EXACT])
    items = _items(client, [{"question": "1 + 1?", "answer": "2"}])
    source = {"type": "file_id", "id": items.id}
    data_source = {"type": "completions", "model": "org/model", "input_messages": TEMPLATE, "source": source}
    run = client.evals.runs.create(ev.id, data_source=data_source)
    job_id = str(uuid.UUID(run.id.removeprefix("evalrun_")))
    n = 450  # over two of the scan's batches (SCAN_BATCH 200)
    with Session(db(app_client)) as s:
        s.add_all(
            Sample(
                job_id=job_id, step=0, index=i, prompt="p", completion=str(i), data={"grader_sub": {"c0": i % 3 == 0}}
            )
            for i in range(n)
        )
        s.execute(update(Job).where(Job.id == job_id).values(status="succeeded"))
        s.commit()
    pages = client.evals.runs.output_items.list(run.id, eval_id=ev.id, limit=100)
    assert [x.sample.output[0].content for x in pages] == [str(i) for i in range(n)]  # the SDK pages on by `after`
    newest = client.evals.runs.output_items.list(run.id, eval_id=ev.id, limit=7, order="desc")
    assert [x.datasource_item_id for x in newest.data] == list(range(n - 1, n - 8, -1)) and newest.has_more
    passed = list(client.evals.runs.output_items.list(run.id, eval_id=ev.id, limit=60, status="pass"))
    assert [x.datasource_item_id for x in passed] == list(range(0, n, 3))
    assert all(x.status == "pass" for x in passed)
    failed = client.evals.runs.output_items.list(run.id, eval_id=ev.id, limit=5, status="fail", after=passed[-1].id)
    assert [x.datasource_item_id for x in failed.data] == [448, 449] and not failed.has_more
    assert client.evals.runs.retrieve(run.id, eval_id=ev.id).result_counts.total == n
    import openai

    with pytest.raises(openai.BadRequestError, match="an output item id from a previous page"):
        client.evals.runs.output_items.list(run.id, eval_id=ev.id, after="outputitem_" + "0" * 32)


def test_run_counts_are_computed_in_the_database_and_load_no_sample(app_client: Any) -> None:
    """A run's result counts were a read of every one of its samples, and a page of runs read every
    run's (issue 68.2): now the database groups them (api/openai/eval_run_counts.py). Scores stored as
    booleans and as numbers, a grading error, a pass threshold and token usage are counted as before,
    and neither retrieving a run nor listing runs loads a single sample."""
    from sqlalchemy import event, update
    from sqlalchemy.orm import Session

    from store.models import Job, Sample

    client = _client(app_client)
    similar = {
        "type": "text_similarity",
        "name": "close",
        "input": "{{sample.output_text}}",
        "reference": "{{item.answer}}",
        "evaluation_metric": "fuzzy_match",
        "pass_threshold": 0.6,
    }
    ev = client.evals.create(data_source_config=SCHEMA, testing_criteria=[EXACT, similar])
    items = _items(client, [{"question": "1 + 1?", "answer": "2"}])
    data_source = {
        "type": "completions",
        "model": "org/model",
        "input_messages": TEMPLATE,
        "source": {"type": "file_id", "id": items.id},
    }
    runs = [client.evals.runs.create(ev.id, data_source=data_source) for _ in range(2)]
    rows = [  # (exact, close, error): 7 pass both, 5 fail close, 3 fail exact, 2 errored
        *[(True, 0.9, None)] * 4,
        *[(1.0, 0.6, None)] * 3,
        *[(1, 0.59, None)] * 5,
        *[(False, 1.0, None)] * 3,
        *[(True, 1.0, "the grader timed out")] * 2,
    ]
    with Session(db(app_client)) as s:
        for run in runs:
            job_id = str(uuid.UUID(run.id.removeprefix("evalrun_")))
            s.add_all(
                Sample(
                    job_id=job_id,
                    step=0,
                    index=i,
                    prompt="p",
                    completion="c",
                    data={"grader_sub": {"c0": a, "c1": b}, "grader_error": e, "prompt_tokens": 10, "tokens": 3},
                )
                for i, (a, b, e) in enumerate(rows)
            )
            s.execute(update(Job).where(Job.id == job_id).values(status="succeeded"))
        s.commit()
    loaded: list[object] = []

    def count(_session: Any, instance: object) -> None:
        if isinstance(instance, Sample):
            loaded.append(instance)

    event.listen(Session, "loaded_as_persistent", count)
    try:
        one = client.evals.runs.retrieve(runs[0].id, eval_id=ev.id)
        listed = list(client.evals.runs.list(ev.id))
    finally:
        event.remove(Session, "loaded_as_persistent", count)
    assert loaded == []
    for run in [one, *listed]:
        assert run.result_counts.model_dump() == {"total": 17, "passed": 7, "failed": 8, "errored": 2}
        per = {p.testing_criteria: (p.passed, p.failed) for p in run.per_testing_criteria_results}
        assert per == {"exact": (14, 3), "close": (12, 5)}  # the errored samples' scores count per criterion
        (usage,) = run.per_model_usage
        assert (usage.invocation_count, usage.prompt_tokens, usage.completion_tokens) == (17, 170, 51)
    assert len(listed) == 2
