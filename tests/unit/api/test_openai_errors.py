"""What a script migrating from OpenAI meets (issue 46), through the real `openai` package on the
in-process app: invalid parameters are 400 (BadRequestError) with OpenAI's error type and code,
OpenAI model names are refused at create unless the operator maps them, and models.list lists
what OpenAI would (succeeded jobs' models and their checkpoints)."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from tests.helpers.api import admin_key, db, make_objects, overridden

pytestmark = pytest.mark.quick


def _client(app_client: Any, headers: dict[str, str]) -> Any:
    from openai import OpenAI

    key = headers["Authorization"].removeprefix("Bearer ")
    return OpenAI(base_url=f"{app_client.base_url}/v1", api_key=key, http_client=app_client, max_retries=0)


def test_errors_carry_openais_status_type_and_code(app_client: Any) -> None:
    """Before: invalid parameters were 422 (UnprocessableEntityError, which `except BadRequestError`
    misses), error.type always invalid_request_error and error.code always null."""
    import openai

    h = admin_key(app_client)
    ids = make_objects(app_client, h)
    client = _client(app_client, h)
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(model="org/model", training_file="file-nope")
    assert e.value.status_code == 400 and e.value.type == "invalid_request_error" and e.value.param == "training_file"
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(model="org/model", training_file=ids["file_id"], method={"type": "dpo"})
    assert e.value.param == "method.type", e.value.body
    with pytest.raises(openai.BadRequestError):  # a body that fails the schema (pydantic), too
        client.fine_tuning.jobs.create(model="org/model", training_file=ids["file_id"], seed=-1)
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("bad.jsonl", b"{not json}\n"), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError):
        grader = {"type": "text_similarity", "name": "c", "input": "a", "reference": "b", "evaluation_metric": "cosine"}
        client.fine_tuning.alpha.graders.validate(grader=grader)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=ids["model"], messages=[{"role": "user", "content": "1+1?"}], frequency_penalty=0.5
        )
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve(f"ft:org/model:x:ftjob-{uuid.uuid4().hex}")
    assert e.value.code == "model_not_found" and e.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as e:
        client.fine_tuning.jobs.retrieve(f"ftjob-{uuid.uuid4().hex}")
    assert e.value.code is None
    with pytest.raises(openai.AuthenticationError) as e:
        _client(app_client, {"Authorization": "Bearer wrong"}).models.list()
    assert e.value.code == "invalid_api_key" and e.value.type == "invalid_request_error"
    # mathrl's own routes keep their 422s
    r = app_client.post("/v1/jobs", json={"kind": "eval", "model": "org/m", "limit": -1}, headers=h)
    assert r.status_code == 422 and "error" not in r.json()
    # and the OpenAPI document says 400 on OpenAI's routes
    doc = app_client.get("/openapi.json").json()["paths"]
    assert "400" in doc["/v1/fine_tuning/jobs"]["post"]["responses"]
    assert "422" not in doc["/v1/fine_tuning/jobs"]["post"]["responses"]


def test_an_openai_model_name_is_refused_at_create_unless_the_operator_maps_it(app_client: Any) -> None:
    """Before: jobs.create(model="o4-mini-2025-04-16") was queued and failed a second later with a hub error."""
    import openai

    h = admin_key(app_client)
    ids = make_objects(app_client, h)
    client = _client(app_client, h)
    before = len(client.fine_tuning.jobs.list().data)
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(model="o4-mini-2025-04-16", training_file=ids["file_id"])
    assert e.value.param == "model" and "OpenAI model" in e.value.message and "hub id" in e.value.message
    assert len(client.fine_tuning.jobs.list().data) == before  # nothing stored
    with overridden(fine_tuning={"model_aliases": {"gpt-4o-mini-2024-07-18": "Qwen/Qwen2.5-0.5B-Instruct"}}):
        with pytest.raises(openai.BadRequestError) as e:  # the refusal lists the aliases there are
            client.fine_tuning.jobs.create(model="o4-mini-2025-04-16", training_file=ids["file_id"])
        assert "'gpt-4o-mini-2024-07-18' (-> Qwen/Qwen2.5-0.5B-Instruct)" in e.value.message
        job = client.fine_tuning.jobs.create(model="gpt-4o-mini-2024-07-18", training_file=ids["file_id"])
    assert job.model == "gpt-4o-mini-2024-07-18" and job.status in ("validating_files", "queued")
    stored = app_client.get(f"/v1/jobs/{uuid.UUID(job.id.removeprefix('ftjob-'))}", headers=h).json()
    assert stored["spec"]["model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    client.fine_tuning.jobs.cancel(job.id)


def test_models_list_shows_succeeded_jobs_models_and_their_checkpoints_only(app_client: Any) -> None:
    """Before: a cancelled (or running) job's checkpoints were listed."""
    h = admin_key(app_client)
    ids = make_objects(app_client, h)  # a queued fine-tuning job with a checkpoint at step 1
    client = _client(app_client, h)
    assert [m.id for m in client.models.list().data] == []
    client.fine_tuning.jobs.cancel(ids["fine_tuning_job_id"])
    assert [m.id for m in client.models.list().data] == []
    job_id = str(uuid.UUID(ids["fine_tuning_job_id"].removeprefix("ftjob-")))
    with db(app_client).begin() as c:
        c.execute(text("UPDATE jobs SET status = 'succeeded' WHERE id = :i"), {"i": job_id})
    listed = [m.id for m in client.models.list().data]
    assert len(listed) == 2 and ids["model"] in listed and ids["fine_tuning_job_id"] in listed[0], listed
    # fine-tuning on from a fine-tuned model: named after the first one's base (it was
    # 'ft:job:<id>@final:...', a name that no route could read back)
    more = client.fine_tuning.jobs.create(model=ids["model"], training_file=ids["file_id"], suffix="more")
    assert more.fine_tuned_model is None
    import openai

    with pytest.raises(openai.ConflictError, match="read by 1 job"):  # the new job trains from it
        client.models.delete(ids["model"])
    with db(app_client).begin() as c:
        c.execute(text("UPDATE jobs SET status = 'succeeded' WHERE id = :i"), {"i": str(uuid.UUID(more.id[6:]))})
    name = client.fine_tuning.jobs.retrieve(more.id).fine_tuned_model
    assert name == f"ft:model:more:{more.id}", name
    assert client.models.retrieve(name).id == name
    # models.delete: a bare 405 before; now the model is gone from every route, its weights too
    for gone in (ids["model"], name):
        deleted = client.models.delete(gone)
        assert deleted.deleted and deleted.id == gone
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve(gone)
        assert gone not in [m.id for m in client.models.list().data]
    with pytest.raises(openai.NotFoundError):
        client.models.delete(name)
    with pytest.raises(openai.BadRequestError, match="final model was deleted") as e:  # not a 201 the worker fails
        client.fine_tuning.jobs.create(model=name, training_file=ids["file_id"])
    assert e.value.param == "model", e.value.body


def test_a_retried_create_with_the_same_idempotency_key_returns_the_first_object(app_client: Any) -> None:
    """Before: /v1/fine_tuning/jobs, /v1/files and /v1/pipelines ignored the SDK's Idempotency-Key,
    so a retried create made a second object."""
    import openai

    h = admin_key(app_client)
    ids = make_objects(app_client, h)
    client = _client(app_client, h)
    key = {"Idempotency-Key": f"retry-{uuid.uuid4()}"}
    rows = b'{"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]}\n'
    first = client.files.create(file=("t.jsonl", rows), purpose="fine-tune", extra_headers=key)
    again = client.files.create(file=("t.jsonl", rows), purpose="fine-tune", extra_headers=key)
    assert again.id == first.id and len(client.files.list(purpose="fine-tune").data) == 2  # make_objects' and this
    with pytest.raises(openai.ConflictError):
        client.files.create(file=("t.jsonl", rows + rows), purpose="fine-tune", extra_headers=key)
    key = {"Idempotency-Key": f"retry-{uuid.uuid4()}"}
    job = client.fine_tuning.jobs.create(model="org/model", training_file=first.id, extra_headers=key)
    same = client.fine_tuning.jobs.create(model="org/model", training_file=first.id, extra_headers=key)
    assert same.id == job.id and len(client.fine_tuning.jobs.list().data) == 2
    with pytest.raises(openai.ConflictError):
        client.fine_tuning.jobs.create(model="org/model", training_file=first.id, seed=3, extra_headers=key)
    client.fine_tuning.jobs.cancel(job.id)
    spec = {"jobs": {"only": {"kind": "eval", "model": "org/m", "limit": 5, "resources": {"pool": "objects-parked"}}}}
    key = {**h, "Idempotency-Key": f"retry-{uuid.uuid4()}"}
    p1 = app_client.post("/v1/pipelines", json=spec, headers=key)
    p2 = app_client.post("/v1/pipelines", json=spec, headers=key)
    assert p1.status_code == 201 and p2.status_code == 200 and p2.json()["id"] == p1.json()["id"], p2.text
    assert p2.headers["Idempotent-Replayed"] == "true" and p2.json()["jobs"] == p1.json()["jobs"]
    assert app_client.post("/v1/pipelines", json={**spec, "name": "other"}, headers=key).status_code == 409
    assert len(app_client.get("/v1/pipelines", headers=h).json()["data"]) == 2  # make_objects' and this one
    assert ids  # the other project's objects are not touched by the same key
    other = admin_key(app_client)
    assert (
        app_client.post(
            "/v1/pipelines", json=spec, headers={**other, "Idempotency-Key": key["Idempotency-Key"]}
        ).status_code
        == 201
    )


def test_the_sdks_own_retry_of_a_create_returns_the_first_object(app_client: Any) -> None:
    """The openai SDK sends no Idempotency-Key: a create whose answer it did not get (a timeout, a
    dropped connection) it sends again, saying x-stainless-retry-count: 1, and that made a second
    file or a second training job."""
    h = admin_key(app_client)
    client = _client(app_client, h)
    rows = b'{"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]}\n'
    retry = {"x-stainless-retry-count": "1"}
    keyed_h = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    first = client.files.create(file=("t.jsonl", rows), purpose="fine-tune")
    assert client.files.create(file=("t.jsonl", rows), purpose="fine-tune", extra_headers=retry).id == first.id
    again = client.files.create(file=("t.jsonl", rows), purpose="fine-tune")  # a new call (count 0): a new file
    assert again.id != first.id and len(client.files.list(purpose="fine-tune").data) == 2
    job = client.fine_tuning.jobs.create(model="org/model", training_file=first.id)
    same = client.fine_tuning.jobs.create(model="org/model", training_file=first.id, extra_headers=retry)
    other = client.fine_tuning.jobs.create(model="org/model", training_file=first.id, seed=3, extra_headers=retry)
    assert same.id == job.id and other.id != job.id and len(client.fine_tuning.jobs.list().data) == 2
    # a keyed create is replayed by its key only; a count that is no ASCII number is no retry (not a 500)
    keyed = client.fine_tuning.jobs.create(model="org/model", training_file=first.id, seed=4, extra_headers=keyed_h)
    again = client.fine_tuning.jobs.create(model="org/model", training_file=first.id, seed=4, extra_headers=retry)
    assert again.id != keyed.id
    from api.idempotency import earlier
    from store.models import Job

    assert earlier(None, Job, "p", None, "d", "\u00b2") is None  # type: ignore[arg-type]  # isdigit, not int()
    for made in (job, other, keyed, again):
        client.fine_tuning.jobs.cancel(made.id)


def test_each_rft_hyperparameter_is_honoured_or_refused_by_name(app_client: Any) -> None:
    """Issue 46.9: each of OpenAI's RFT hyperparameters, as the job runs it (docs/openai-rft.md)."""
    import openai

    h = admin_key(app_client)
    client = _client(app_client, h)
    rows = b"".join(
        f'{{"messages": [{{"role": "user", "content": "{a} + 1?"}}], "reference_answer": "{a + 1}"}}\n'.encode()
        for a in range(10)
    )
    train = client.files.create(file=("rft.jsonl", rows), purpose="fine-tune")
    valid = client.files.create(file=("valid.jsonl", rows), purpose="fine-tune")
    grader = {
        "type": "string_check",
        "name": "x",
        "input": "{{sample.output_text}}",
        "reference": "{{item.reference_answer}}",
        "operation": "eq",
    }
    hp = {
        "n_epochs": 3,
        "batch_size": 5,
        "learning_rate_multiplier": 2.0,
        "compute_multiplier": 0.5,
        "reasoning_effort": "medium",
        "eval_interval": 2,
        "eval_samples": 7,
    }
    method = {"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": hp}}
    job = client.fine_tuning.jobs.create(
        model="org/model", training_file=train.id, validation_file=valid.id, method=method
    )
    stored = app_client.get(f"/v1/jobs/{uuid.UUID(job.id.removeprefix('ftjob-'))}", headers=h).json()
    spec, config = stored["spec"], stored["resolved_config"]
    assert spec["max_steps"] == 6  # ceil(3 epochs x 10 lines / 5 prompts a step)
    assert spec["num_generations"] == 4 and spec["global_batch_size"] == 20  # G = round(8 x 0.5), 5 prompts x G
    assert spec["learning_rate"] == pytest.approx(2e-6) and config["max_completion_length"] == 1024
    assert spec["save_steps"] == 2 and spec["eval"]["every"] == 2 and spec["eval"]["limit"] == 7
    assert spec["eval"]["max_new_tokens"] == 1024  # the validation file is scored at the trained length
    assert config["openai"]["mapping"]["reasoning_effort"] == "medium"
    client.fine_tuning.jobs.cancel(job.id)
    plain = {"type": "reinforcement", "reinforcement": {"grader": grader}}
    job = client.fine_tuning.jobs.create(
        model="org/model", training_file=train.id, validation_file=valid.id, method=plain
    )
    stored = app_client.get(f"/v1/jobs/{uuid.UUID(job.id.removeprefix('ftjob-'))}", headers=h).json()
    assert stored["spec"]["eval"]["max_new_tokens"] == stored["resolved_config"]["max_completion_length"] == 512
    client.fine_tuning.jobs.cancel(job.id)
    bad = {**method, "reinforcement": {"grader": grader, "hyperparameters": {**hp, "beta": 0.1}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(model="org/model", training_file=train.id, method=bad)
    assert "beta" in str(e.value.param) + e.value.message, e.value.body
    # structured outputs: taken and dropped before, so every sample failed a JSON grader and scored 0
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    shaped = {**method, "reinforcement": {"grader": grader, "response_format": schema}}
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(model="org/model", training_file=train.id, method=shaped)
    assert e.value.param == "method.reinforcement.response_format" and "free text" in e.value.message, e.value.body
    asks = [{"role": "user", "content": "x"}]
    judge = {"type": "score_model", "name": "j", "model": "gpt-4o-2024-08-06", "input": asks}
    judged = {**method, "reinforcement": {"grader": judge}}
    with pytest.raises(openai.BadRequestError, match="cannot grade with") as e:
        client.fine_tuning.jobs.create(model="org/model", training_file=train.id, method=judged)
    assert e.value.param == "method.reinforcement.grader.model", e.value.body


def test_a_multi_turn_script_sends_back_the_message_the_sdk_returned(app_client: Any) -> None:
    """`messages.append(response.choices[0].message)`: the SDK sends the assistant message back with
    refusal: null (and tool fields where a server set them); they were unknown fields, a 400. The
    request now reaches the model lookup (a 404 for a model that does not exist), with a request id."""
    import openai
    from openai.types.chat import ChatCompletionMessage

    client = _client(app_client, admin_key(app_client))
    said = ChatCompletionMessage.model_validate({"role": "assistant", "content": "4", "refusal": None})
    nothing = ChatCompletionMessage.model_validate({"role": "assistant", "content": None, "tool_calls": []})
    model = f"ft:org/m:s:ftjob-{uuid.uuid4().hex}"
    for message in (said, nothing):
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "2 + 2?"}, message, {"role": "user", "content": "and 3 + 3?"}],
                reasoning_effort="low",
            )
        assert e.value.code == "model_not_found" and (e.value.request_id or "").startswith("req_"), e.value.body
    # a function call the model made and its result, sent back (issue 69.2: they were a 400 while no tools
    # were served) reach the lookup too
    tool = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    called = {"role": "assistant", "content": None, "tool_calls": [tool]}
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model=model, messages=[called, {"role": "tool", "tool_call_id": "c", "content": "1"}]
        )
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{**called, "tool_calls": [{**tool, "type": "custom"}]}])
    assert e.value.param == "messages.0.tool_calls.0.type", e.value.body
    with pytest.raises(openai.BadRequestError, match="a user message needs content"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": None}])


def test_answers_a_retry_cannot_change_say_so_to_the_sdk(app_client: Any) -> None:
    """The openai SDK retries 409, 429 and 5xx twice by default with no Idempotency-Key: a conflict or
    a quota said again, a failed or timed-out completion submitted again as a new job."""
    h = admin_key(app_client)
    made = app_client.post("/v1/keys", json={}, headers=h).json()
    with overridden(limits={"max_keys_per_project": 1}):
        r = app_client.post("/v1/keys", json={}, headers=h)
    assert r.status_code == 409 and r.headers["x-should-retry"] == "false", r.text
    assert "x-should-retry" not in app_client.get("/v1/jobs", headers=h).headers
    assert app_client.get("/v1/jobs", headers={**h, "X-Request-ID": "trace-1"}).headers["x-request-id"] == "trace-1"
    assert made["id"]


def test_a_completion_call_waits_under_the_clients_read_timeout() -> None:
    from starlette.requests import Request

    from api.openai.generation_calls import wait_limit
    from config.settings import Settings

    settings = Settings(fine_tuning={"inference_timeout_seconds": 570})  # type: ignore[arg-type]

    def asked(*headers: tuple[bytes, bytes]) -> float:
        return wait_limit(settings, Request({"type": "http", "headers": list(headers)}))

    assert asked() == 570.0 and asked((b"x-stainless-read-timeout", b"600")) == 570.0
    assert asked((b"x-stainless-read-timeout", b"30")) == 25.0  # the SDK's timeout=30: it reads the 504
    assert asked((b"x-stainless-read-timeout", b"nonsense")) == 570.0


def test_jobs_list_filters_by_metadata_as_the_sdk_sends_it(app_client: Any) -> None:
    """`jobs.list(metadata={...})` sends metadata[key]=value, which was ignored: every job came back."""
    h = admin_key(app_client)
    client = _client(app_client, h)
    rows = b'{"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]}\n'
    f = client.files.create(file=("t.jsonl", rows), purpose="fine-tune")
    a = client.fine_tuning.jobs.create(model="org/model", training_file=f.id, metadata={"team": "a", "run": "1"})
    b = client.fine_tuning.jobs.create(model="org/model", training_file=f.id, metadata={"team": "b"})
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"team": "a"})] == [a.id]
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"team": "a", "run": "2"})] == []
    assert [j.id for j in client.fine_tuning.jobs.list()] == [b.id, a.id]
    r = app_client.get("/v1/fine_tuning/jobs?metadata=team", headers=h)
    assert r.status_code == 400 and "metadata[key]=value" in r.text, r.text
    for job in (a, b):
        client.fine_tuning.jobs.cancel(job.id)


def test_a_metadata_filter_finds_a_job_behind_many_newer_ones(app_client: Any) -> None:
    """The filter read the stored configs in the API, METADATA_SCAN (10,000) jobs a request: behind that
    many newer jobs without the metadata, the first page came back empty with has_more, and the SDK's
    iteration stops at an empty page: the script saw no job. The database filters by it now."""
    from api.routers.openai_fine_tuning import METADATA_SCAN
    from config.settings import get_settings
    from mathrl.modelref import job_uuid
    from store.db import session_scope
    from store.models import Job

    client = _client(app_client, admin_key(app_client))
    rows = b'{"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]}\n'
    train = client.files.create(file=("t.jsonl", rows), purpose="fine-tune")
    f = client.fine_tuning.jobs.create
    a = f(model="org/model", training_file=train.id, metadata={"team": "a", "null": "n"})
    b = f(model="org/model", training_file=train.id, metadata={"team": "b"})
    # a key PostgreSQL's path array would read as NULL is left to the scan (here, before the jobs below)
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"null": "n"})] == [a.id]
    with session_scope(get_settings().database.url) as s:  # METADATA_SCAN more of team b's, newer than a
        row = s.get(Job, job_uuid(b.id))
        assert row is not None
        copied = {c.key: getattr(row, c.key) for c in Job.__table__.columns if c.key not in ("id", "idempotency_key")}
        s.add_all([Job(**{**copied, "status": "cancelled"}) for _ in range(METADATA_SCAN)])
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"team": "a"})] == [a.id]
    for job in (a, b):
        client.fine_tuning.jobs.cancel(job.id)


def test_a_succeeded_fine_tuning_job_has_its_step_metrics_as_a_results_file(
    app_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenAI's analysis pattern, `client.files.content(job.result_files[0])`: result_files was always
    empty (an IndexError). The worker writes the file when the job succeeds (worker/record.py), within
    the project's storage quota as an upload is (store/files.py)."""
    from config.settings import get_settings
    from worker.record import write_results_file

    h = admin_key(app_client)
    client = _client(app_client, h)
    rows = b'{"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]}\n'
    f = client.files.create(file=("t.jsonl", rows), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model="org/model", training_file=f.id)
    job_id = str(uuid.UUID(job.id.removeprefix("ftjob-")))
    assert job.result_files == []
    write_results_file(get_settings(), job_id)  # a stale worker's end: the job has not succeeded
    assert client.files.list().data == [f]
    with db(app_client).begin() as c:
        c.execute(text("UPDATE jobs SET status = 'succeeded' WHERE id = :i"), {"i": job_id})
        for step, name, value in [(1, "loss", 0.5), (2, "loss", 0.25), (2, "reward", 1.0), (2, "kl", 0.125)]:
            c.execute(
                text("INSERT INTO metrics (job_id, name, step, value, time) VALUES (:j, :n, :s, :v, :t)"),
                {"j": job_id, "n": name, "s": step, "v": value, "t": datetime.now(UTC).replace(tzinfo=None)},
            )
    monkeypatch.setattr(get_settings().files, "max_project_files", 1)  # the upload fills the project's storage
    write_results_file(get_settings(), job_id)
    assert client.fine_tuning.jobs.retrieve(job.id).result_files == [] and client.files.list().data == [f]
    events = client.fine_tuning.jobs.list_events(job.id).data
    assert any("no results file: the project stores 1 files" in e.message for e in events), events
    stored = (Path(get_settings().artifact_dir) / "files").glob("*/*")
    assert not [p for p in stored if p.suffix in (".csv", ".part")]  # no bytes left behind
    monkeypatch.setattr(get_settings().files, "max_project_files", 10)
    write_results_file(get_settings(), job_id)
    write_results_file(get_settings(), job_id)  # once: a second end (a stale finish) adds nothing
    (results,) = client.fine_tuning.jobs.retrieve(job.id).result_files
    assert client.files.retrieve(results).purpose == "fine-tune-results"
    # base64, as OpenAI's: its cookbook reads `base64.b64decode(client.files.content(id).read())`
    csv = base64.b64decode(client.files.content(results).read()).decode()
    assert csv == "step,train_loss,train_reward_mean,kl\n1,0.5,,\n2,0.25,1.0,0.125\n"
    assert [x.purpose for x in client.files.list().data].count("fine-tune-results") == 1


def test_a_chat_without_max_tokens_may_write_what_its_model_was_trained_to(app_client: Any) -> None:
    """OpenAI sets no cap of its own; a fixed 256 cut a fine-tuned model's answers short. A chat that
    names none gets its job's completion budget (max_completion_length), else the spec's default."""
    import openai
    from sqlalchemy.orm import Session

    from store.models import Job

    h = admin_key(app_client)
    ids = make_objects(app_client, h)  # a supervised fine-tuning job with a checkpoint at step 1
    job_id = str(uuid.UUID(ids["fine_tuning_job_id"].removeprefix("ftjob-")))
    # waits 1 s: a 504 and the job cancelled, or a 502 where the suite's worker took the job and failed it
    # (the checkpoint is not on disk); the stored spec is what is asked
    client = _client(app_client, h).with_options(timeout=6.0)

    def asked(budget: int | None, **over: Any) -> Any:
        with Session(db(app_client)) as s:
            job = s.get(Job, job_id)
            assert job is not None
            job.resolved_config = {**(job.resolved_config or {}), "max_completion_length": budget}
            s.commit()
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model=ids["model"], messages=[{"role": "user", "content": "1 + 1?"}], **over)
        assert e.value.status_code in (502, 504), e.value.body
        with Session(db(app_client)) as s:
            project = select(Job.project_id).where(Job.id == job_id).scalar_subquery()
            newest = select(Job.spec).where(Job.project_id == project, Job.kind == "generate").order_by(Job.id.desc())
            return s.scalars(newest).first()["max_tokens"]

    assert asked(1024) == 1024
    assert asked(None) == 256  # (a supervised job names none: the generate spec's default)
    assert asked(1024, max_completion_tokens=7) == 7


def test_what_a_retry_can_change_is_retried_and_what_is_not_served_says_so(app_client: Any) -> None:
    """A burst of chats meets the active-jobs quota: it was a final 'insufficient_quota' (no retry), though
    a completion job's slot frees in seconds; a full file quota was retried twice as a rate limit; an
    OpenAI route not served here was a bare 404 the SDK showed as 'Error code: 404'."""
    import openai

    h = admin_key(app_client)
    ids = make_objects(app_client, h)
    client = _client(app_client, h)
    with overridden(limits={"max_active_jobs": 1}):  # the fine-tuning job holds the one slot
        r = app_client.post(
            "/v1/chat/completions",
            json={"model": ids["model"], "messages": [{"role": "user", "content": "1?"}]},
            headers=h,
        )
        assert r.status_code == 429 and r.headers["retry-after"] == "2", r.text
        assert "x-should-retry" not in r.headers and r.json()["error"]["code"] == "rate_limit_exceeded", r.text
    with overridden(files={"max_project_files": 1}):
        rows = b'{"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]}\n'
        with pytest.raises(openai.RateLimitError) as e:
            client.files.create(file=("t.jsonl", rows), purpose="fine-tune")
        assert e.value.response.headers["x-should-retry"] == "false" and e.value.code == "insufficient_quota"
    for call in (
        lambda: client.embeddings.create(model=ids["model"], input="1 + 1?"),
        lambda: client.moderations.create(model=ids["model"], input="1 + 1?"),
    ):
        with pytest.raises(openai.NotFoundError, match="is not served here; OpenAI's routes here: files") as nf:
            call()
        assert nf.value.body["message"].startswith("POST /v1/"), nf.value.body  # type: ignore[index]


def test_a_chat_asks_for_up_to_128_choices_as_openais(app_client: Any) -> None:
    """`n` was capped at 16: a pass@k script asking OpenAI's most (128) got a 400."""
    import openai
    from sqlalchemy.orm import Session

    from store.models import Job

    h = admin_key(app_client)
    ids = make_objects(app_client, h)
    client = _client(app_client, h).with_options(timeout=6.0)
    chat = {"model": ids["model"], "messages": [{"role": "user", "content": "1 + 1?"}]}
    with pytest.raises(openai.APIStatusError) as e:  # stored, then a 504 (or 502 from the suite's worker)
        client.chat.completions.create(**chat, n=128)
    assert e.value.status_code in (502, 504), e.value.body
    with Session(db(app_client)) as s:
        project = select(Job.project_id).where(
            Job.id == str(uuid.UUID(ids["fine_tuning_job_id"].removeprefix("ftjob-")))
        )
        newest = select(Job.spec).where(Job.project_id == project.scalar_subquery(), Job.kind == "generate")
        assert s.scalars(newest.order_by(Job.id.desc())).first()["n"] == 128
    with pytest.raises(openai.BadRequestError, match="/n"):
        client.chat.completions.create(**chat, n=129)


def test_a_jobs_method_carries_the_hyperparameters_it_runs_with(app_client: Any) -> None:
    """job.method echoed the request: with OpenAI's older top-level `hyperparameters`, method.supervised was
    None (reading its hyperparameters raised AttributeError), and 'auto' stayed 'auto'."""
    h = admin_key(app_client)
    client = _client(app_client, h)
    rows = b'{"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]}\n' * 10
    f = client.files.create(file=("t.jsonl", rows), purpose="fine-tune")
    older = client.fine_tuning.jobs.create(model="org/model", training_file=f.id, hyperparameters={"n_epochs": 2})
    auto = {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": "auto", "n_epochs": "auto"}}}
    newer = client.fine_tuning.jobs.create(model="org/model", training_file=f.id, method=auto)
    for job, epochs in ((older, 2), (newer, None)):
        got = client.fine_tuning.jobs.retrieve(job.id).method
        assert got.type == "supervised" and got.supervised is not None, got
        hp = got.supervised.hyperparameters
        assert isinstance(hp.batch_size, int) and isinstance(hp.n_epochs, int), hp  # what 'auto' became
        assert epochs is None or hp.n_epochs == epochs, hp
        client.fine_tuning.jobs.cancel(job.id)


def test_a_stream_that_waits_sends_keep_alives_the_sdk_skips(app_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed call sent nothing while its job waited for a worker (or an engine start, minutes): a
    client's read timeout (the SDK's timeout=60 is per read) broke it. Comment lines now; the SDK skips them."""
    import openai

    from api.openai import generation_calls

    monkeypatch.setattr(generation_calls, "KEEPALIVE_SECONDS", 0.2)
    h = admin_key(app_client)
    ids = make_objects(app_client, h)
    body = {"model": ids["model"], "prompt": "1 + 1 =", "max_tokens": 2, "stream": True}
    # no worker: it times out; where the suite's worker takes the job, it fails (the checkpoint is not on
    # disk) after its process starts, seconds in which the stream has nothing else to send
    with overridden(fine_tuning={"inference_timeout_seconds": 1.5}):
        with app_client.stream("POST", "/v1/completions", json=body, headers=h) as r:
            lines = [line for line in r.iter_lines() if line]
        assert ": keep-alive" in lines and '"error"' in lines[-1], lines
        stream = _client(app_client, h).completions.create(
            model=ids["model"], prompt="1 + 1 =", max_tokens=2, stream=True
        )
        with pytest.raises(openai.APIError, match="did not answer in time|failed"):
            list(stream)


def test_an_operators_alias_samples_its_base_model(app_client: Any) -> None:
    """A script's baseline before fine-tuning calls the model it fine-tunes from, by the name the operator
    maps (fine_tuning.model_aliases): it was a 404, the alias serving only training."""
    import openai

    h = admin_key(app_client)
    client = _client(app_client, h).with_options(timeout=6.0)  # a 504 (no worker), or a 502 (a worker failed it)
    aliases = {"o4-mini-2025-04-16": "org/base-model", "openai/gpt-oss-20b": "org/base-model"}
    with overridden(fine_tuning={"model_aliases": aliases}):
        assert client.models.retrieve("o4-mini-2025-04-16").owned_by == "system"
        # a name with a slash: the SDK sends openai%2Fgpt-oss-20b, which the server decodes (a 404 before)
        assert client.models.retrieve("openai/gpt-oss-20b").id == "openai/gpt-oss-20b"
        listed_models = {m.id: m.owned_by for m in client.models.list()}  # a script checks names here first
        assert listed_models["o4-mini-2025-04-16"] == listed_models["openai/gpt-oss-20b"] == "system"
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="o4-mini-2025-04-16", messages=[{"role": "user", "content": "1?"}])
        assert e.value.status_code in (502, 504), e.value.body
    with pytest.raises(openai.NotFoundError):  # unmapped, it is not a model here
        client.chat.completions.create(model="o4-mini-2025-04-16", messages=[{"role": "user", "content": "1?"}])
    listed = app_client.get("/v1/jobs", params={"kind": "generate"}, headers=h).json()["data"]
    assert [j["spec"]["model"] for j in listed] == ["org/base-model"], listed


def test_a_wait_on_a_paused_job_ends_at_once(app_client: Any) -> None:
    """A completion, a grader run or a session's start waited on its job until it ended. Pausing a queued
    job frees its quota, so chat -> pause, repeated, held an unbounded number of waits, each polling the
    database from the API's thread pool for up to 570 s, outside every quota. A paused job ends the wait."""
    import asyncio
    import time

    from starlette.requests import Request

    from api.grading import grade_result
    from api.openai.generation_calls import wait_answer
    from api.problems import Problem
    from api.routers import openai_inference
    from api.tinker.futures import create_status
    from config.settings import get_settings

    h = admin_key(app_client)
    spec = {"kind": "eval", "model": "org/model", "limit": 5, "resources": {"pool": "objects-parked"}}
    job = app_client.post("/v1/jobs", json=spec, headers=h).json()
    assert app_client.post(f"/v1/jobs/{job['id']}/pause", headers=h).json()["status"] == "paused"

    async def never() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {}

    request = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, never)
    settings = get_settings()
    with overridden(fine_tuning={"inference_timeout_seconds": 5.0}):
        t0 = time.monotonic()
        with pytest.raises(Problem) as waited:
            asyncio.run(wait_answer(settings, job["id"], request))
        assert waited.value.status == 409 and "paused" in waited.value.detail, waited.value.detail

        async def streamed() -> list[str]:
            return [c async for c in openai_inference._stream(settings, job["id"], "m", True, 1, False)]

        chunks = asyncio.run(streamed())
        assert '"job_paused"' in chunks[-1], chunks
        assert time.monotonic() - t0 < 3.0  # before: each waited out its 5 s and answered 504
    from store.db import session_scope
    from store.models import Job

    with session_scope(settings.database.url) as s:
        project = str(s.get(Job, job["id"]).project_id)
        grading = Job(project_id=project, kind="grade", spec={}, tags=[], status="paused")  # a grader run's job
        s.add(grading)
        s.flush()
        grade_id = grading.id
    with pytest.raises(Problem) as graded:
        grade_result(settings, project, grade_id)
    assert graded.value.status == 409
    started = create_status(settings, project, job["id"])
    assert started is not None and "paused" in started["error"], started


def test_paging_checkpoints_while_deleting_them_lists_every_one(app_client: Any, tmp_path: Path) -> None:
    """`for ck in client.fine_tuning.jobs.checkpoints.list(id): client.models.delete(...)`: the next page's
    cursor is the page's last checkpoint, which the loop deleted; that page came back empty and the SDK's
    iterator stopped, so every checkpoint past the first page was skipped."""
    from config.settings import get_settings
    from store.db import session_scope
    from store.models import Checkpoint

    h = admin_key(app_client)
    ids = make_objects(app_client, h)  # a fine-tuning job with a checkpoint at step 1
    job_uuid = str(uuid.UUID(ids["fine_tuning_job_id"].removeprefix("ftjob-")))
    with session_scope(get_settings().database.url) as s:
        for step in range(2, 13):
            (tmp_path / f"checkpoint-{step}").mkdir()
            s.add(Checkpoint(job_id=job_uuid, step=step, kind="checkpoint", uri=str(tmp_path / f"checkpoint-{step}")))
    client = _client(app_client, h)
    seen = []
    for ck in client.fine_tuning.jobs.checkpoints.list(ids["fine_tuning_job_id"], limit=5):
        seen.append(ck.step_number)
        if ck.step_number in (8, 3):  # each page's last: the next page's cursor
            client.models.delete(ck.fine_tuned_model_checkpoint)
    assert seen == list(range(12, 0, -1)), seen
    left = [ck.step_number for ck in client.fine_tuning.jobs.checkpoints.list(ids["fine_tuning_job_id"], limit=5)]
    assert left == [12, 11, 10, 9, 7, 6, 5, 4, 2, 1], left


def test_a_model_graders_run_answers_within_the_clients_timeout(app_client: Any) -> None:
    """graders.run with a model waited a fixed 300 s for its grade job: a client with timeout=8 timed out
    first, and the SDK's retries each started another job. It now answers (a 504 it does not retry, or the
    job's failure where a worker took it) under the client's read timeout (x-stainless-read-timeout)."""
    import time

    import openai

    client = _client(app_client, admin_key(app_client)).with_options(timeout=8.0, max_retries=0)
    judge = {
        "type": "score_model",
        "name": "j",
        "model": "o4-mini-2025-04-16",
        "input": [{"role": "user", "content": "x"}],
    }
    with overridden(fine_tuning={"model_aliases": {"o4-mini-2025-04-16": "org/judge"}}):
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as e:  # before: openai.APITimeoutError after 8 s
            client.fine_tuning.alpha.graders.run(grader=judge, model_sample="4", item={"answer": "4"})
    assert e.value.status_code in (504, 400, 422), e.value.body
    assert time.monotonic() - t0 < 8.0


def test_top_p_zero_is_greedy(app_client: Any) -> None:
    """OpenAI takes top_p=0 (the most likely token alone); it was a 400 here, where the engines take
    top_p in (0, 1]. It samples greedily now."""
    import openai

    h = admin_key(app_client)
    client = _client(app_client, h).with_options(timeout=6.0, max_retries=0)
    with overridden(fine_tuning={"model_aliases": {"o4-mini-2025-04-16": "org/base-model"}}):
        with pytest.raises(openai.APIStatusError) as e:  # a 504 (no worker), or a 502 (a worker failed it)
            client.chat.completions.create(
                model="o4-mini-2025-04-16", messages=[{"role": "user", "content": "1?"}], top_p=0, temperature=0.7
            )
    assert e.value.status_code in (502, 504), e.value.body
    (job,) = app_client.get("/v1/jobs", params={"kind": "generate"}, headers=h).json()["data"]
    assert (job["spec"]["temperature"], job["spec"]["top_p"]) == (0.0, 1.0), job["spec"]


def test_logprobs_asked_for_go_to_the_job_and_bad_ones_are_named(app_client: Any) -> None:
    """logprobs were a 400 ('not returned here'): an eval script's confidence scores could not move.
    The call's job is asked for them (chat: logprobs and top_logprobs; completions: logprobs, at
    most 5 as OpenAI's); what OpenAI refuses, or what would store too many, is a 400 naming the
    field, before any job is stored."""
    import openai

    h = admin_key(app_client)
    ids = make_objects(app_client, h)
    client = _client(app_client, h).with_options(timeout=6.0, max_retries=0)
    chat = {"model": ids["model"], "messages": [{"role": "user", "content": "1 + 1?"}]}

    def generate_jobs() -> list[dict[str, Any]]:  # the calls' (make_objects made a response's)
        got = app_client.get("/v1/jobs", params={"kind": "generate", "tag": "openai:inference"}, headers=h)
        return got.json()["data"]  # type: ignore[no-any-return]

    for call, param in (
        (lambda: client.chat.completions.create(**chat, top_logprobs=2), "top_logprobs"),
        (lambda: client.chat.completions.create(**chat, logprobs=True, top_logprobs=21), "top_logprobs"),
        (lambda: client.completions.create(model=ids["model"], prompt="1 + 1 =", logprobs=6), "logprobs"),
        (
            lambda: client.chat.completions.create(**chat, logprobs=True, top_logprobs=20, n=64, max_tokens=4096),
            "logprobs",
        ),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.param == param, e.value.body
    assert generate_jobs() == []
    with pytest.raises(openai.APIStatusError) as e:  # stored, then a 504 (or a 502 from the suite's worker)
        client.chat.completions.create(**chat, logprobs=True, top_logprobs=3)
    assert e.value.status_code in (502, 504), e.value.body
    with pytest.raises(openai.APIStatusError):
        client.chat.completions.create(**chat, logprobs=True)
    with pytest.raises(openai.APIStatusError):
        client.completions.create(model=ids["model"], prompt="1 + 1 =", logprobs=2)
    with pytest.raises(openai.APIStatusError):
        client.chat.completions.create(**chat, logprobs=False)
    asked = [j["spec"].get("logprobs") for j in reversed(generate_jobs())]  # oldest first
    assert asked == [3, 0, 2, None], asked


NON_FINITE_BODIES = [  # (route, body with NaN or an infinity somewhere, the field the 400 names)
    (
        "/v1/evals",
        '{"data_source_config": {"type": "custom", "item_schema": {"type": "object"}}, "testing_criteria": '
        '[{"type": "text_similarity", "name": "t", "input": "{{sample.output_text}}", "reference": "x", '
        '"evaluation_metric": "bleu", "pass_threshold": NaN}]}',
        "testing_criteria.0.pass_threshold",
    ),
    ("/v1/chat/completions", '{"model": "org/m", "messages": [], "temperature": Infinity}', "temperature"),
    (
        "/v1/fine_tuning/jobs",
        '{"model": "org/m", "training_file": "file-x", "hyperparameters": {"learning_rate_multiplier": -Infinity}}',
        "hyperparameters.learning_rate_multiplier",
    ),
    (
        "/v1/fine_tuning/alpha/graders/run",
        '{"grader": {"type": "string_check", "name": "s", "input": "a", "reference": "a", "operation": "eq"}, '
        '"model_sample": "a", "item": {"weights": [1, NaN]}}',
        "item.weights.1",
    ),
]


@pytest.mark.parametrize(("route", "body", "param"), NON_FINITE_BODIES, ids=[b[0] for b in NON_FINITE_BODIES])
def test_nan_and_infinity_are_refused_at_every_field_of_the_openai_routes(
    app_client: Any, route: str, body: str, param: str
) -> None:
    """Issue 66.4: `"pass_threshold": NaN` in an eval's criteria was accepted and stored as null, and
    every later run of that eval refused; free-form objects (an item, hyperparameters) took NaN too."""
    h = {**admin_key(app_client), "Content-Type": "application/json"}
    r = app_client.post(route, content=body, headers=h)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "finite number" in r.json()["error"]["message"], r.text
    assert app_client.get("/v1/evals", headers=h).json()["data"] == []  # nothing stored


def test_an_out_of_bounds_hyperparameter_names_its_field_and_bounds(app_client: Any) -> None:
    """Issue 69.5: n_epochs=0 answered param "...n_epochs.literal['auto']", "Input should be 'auto'
    (and 1 more)": pydantic's error of the union's first member, with neither the field nor its bounds."""
    import openai

    h = admin_key(app_client)
    ids = make_objects(app_client, h)
    client = _client(app_client, h)
    method = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 0}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(model="org/model", training_file=ids["file_id"], method=method)
    assert e.value.param == "method.supervised.hyperparameters.n_epochs", e.value.body
    assert "use 'auto' or an integer from 1 to 50" in e.value.message and "literal" not in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(
            model="org/model", training_file=ids["file_id"], hyperparameters={"learning_rate_multiplier": -1}
        )
    assert e.value.param == "hyperparameters.learning_rate_multiplier", e.value.body
    assert "use 'auto' or a number above 0 and at most 100" in e.value.message, e.value.message
