"""OpenAI's Batch API through the real `openai` package, in process on an app of the module's own
(tests.helpers.api.private_app: no worker, batches stay queued): each bad line a 400 naming it,
before anything is stored; the output and error files written from the job's samples once it
ended (api/routers/openai_batches.py). tests/system/test_openai_fine_tuning.py runs one on a worker."""

from __future__ import annotations

import io
import json
import uuid
from typing import Any

import pytest
from sqlalchemy import text, update
from sqlalchemy.orm import Session

from tests.helpers.api import admin_key, db, make_objects, overridden, private_app_client

pytestmark = pytest.mark.quick
app_client = private_app_client()  # a suite worker would answer (or fail) a batch here


def _client(app_client: Any, headers: dict[str, str]) -> Any:
    from openai import OpenAI

    key = headers["Authorization"].removeprefix("Bearer ")
    return OpenAI(base_url=f"{app_client.base_url}/v1", api_key=key, http_client=app_client, max_retries=0)


def _line(custom_id: str, model: str, **body: Any) -> dict[str, Any]:
    chat = {"messages": [{"role": "user", "content": f"{custom_id}?"}]}
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, **chat, **body},
    }


def _upload(client: Any, lines: list[dict[str, Any]]) -> Any:
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    return client.files.create(file=("batch.jsonl", io.BytesIO(data)), purpose="batch")


def test_a_bad_line_is_a_400_naming_it_at_upload_or_create(app_client: Any) -> None:
    import openai

    h = admin_key(app_client)
    client, model = _client(app_client, h), make_objects(app_client, h)["model"]
    for lines, pointer in (
        ([_line("a", model), _line("a", model)], "line 2: custom_id"),
        ([{**_line("a", model), "url": "/v1/embeddings"}], "line 1: url"),
        ([{**_line("a", model), "method": "GET"}], "line 1: method"),
        ([{k: v for k, v in _line("a", model).items() if k != "body"}], "line 1: body"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            _upload(client, lines)
        assert pointer in str(e.value), (pointer, e.value)
    before = len(app_client.get("/v1/jobs", headers=h).json()["data"])
    good = _upload(client, [_line("a", model)])
    for lines, endpoint, pointer in (
        ([_line("a", model), _line("b", model, temperature=3)], None, "/input_file_id/line/2/body/temperature"),
        ([_line("a", model), _line("b", "ft:other")], None, "/input_file_id/line/2/body/model"),
        ([_line("a", model, stream=True)], None, "/input_file_id/line/1/body/stream"),
        ([_line("a", model, logprobs=True, top_logprobs=20, n=64, max_tokens=4096)], None, "/line/1/body/logprobs"),
        ([_line("a", model)], "/v1/completions", "/input_file_id/line/1/url"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            client.batches.create(
                input_file_id=_upload(client, lines).id,
                endpoint=endpoint or "/v1/chat/completions",
                completion_window="24h",
            )
        assert pointer in str(e.value), (pointer, e.value)
    with overridden(limits={"max_tokens": 50}):  # the operator's per-job limits hold for each line
        with pytest.raises(openai.BadRequestError) as e:
            client.batches.create(
                input_file_id=_upload(client, [_line("a", model, max_tokens=100)]).id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
        assert "/input_file_id/line/1/body/max_tokens" in str(e.value), e.value
    fine_tune = client.files.create(
        file=("t.jsonl", io.BytesIO(b'{"messages": [{"role": "user", "content": "1?"}]}\n')), purpose="fine-tune"
    )
    for file_id in (fine_tune.id, "file-" + "0" * 32):
        with pytest.raises(openai.BadRequestError) as e:
            client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
        assert e.value.param == "input_file_id", e.value.body
    with pytest.raises(openai.BadRequestError):  # the file of another project
        other = _client(app_client, admin_key(app_client))
        other.batches.create(input_file_id=good.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert len(app_client.get("/v1/jobs", headers=h).json()["data"]) == before  # nothing stored


def test_a_batch_is_a_generate_job_of_its_file_and_only_its_projects(app_client: Any) -> None:
    import openai

    h = admin_key(app_client)
    client, model = _client(app_client, h), make_objects(app_client, h)["model"]
    requests = _upload(client, [_line("a", model, max_tokens=7), _line("b", model, temperature=0)])
    made = client.batches.create(
        input_file_id=requests.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"run": "1"}
    )
    assert (made.status, made.endpoint, made.input_file_id, made.metadata) == (
        "validating",
        "/v1/chat/completions",
        requests.id,
        {"run": "1"},
    )
    assert (made.request_counts.total, made.request_counts.completed, made.output_file_id) == (2, 0, None)
    job = app_client.get(f"/v1/jobs/{uuid.UUID(made.id.removeprefix('batch_'))}", headers=h).json()
    assert job["spec"]["batch"] == {"file": requests.id, "endpoint": "/v1/chat/completions"}
    assert job["spec"]["model"].startswith("job:") and "openai:batches" in job["tags"]
    assert client.batches.list().data[0].id == made.id  # newest first
    assert client.batches.retrieve(made.id).id == made.id
    with pytest.raises(openai.ConflictError):  # the file a queued batch reads stays
        client.files.delete(requests.id)
    other = _client(app_client, admin_key(app_client))
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        other.batches.cancel(made.id)
    gone = client.batches.cancel(made.id)
    assert (gone.status, gone.output_file_id, gone.error_file_id) == ("cancelled", None, None)
    assert gone.cancelled_at is not None


def test_an_ended_batchs_answers_and_failures_are_its_files(app_client: Any) -> None:
    """The job's samples, a step per line (as evaluator/chat.py run_batch stores them), become the
    output file (a chat.completion per answered line) and the error file (a failed line's error),
    written once at the first look after the job ended."""
    from store.models import Event, Job, Sample

    h = admin_key(app_client)
    client, model = _client(app_client, h), make_objects(app_client, h)["model"]
    requests = _upload(client, [_line("a", model), _line("b", model), _line("c", model)])
    made = client.batches.create(input_file_id=requests.id, endpoint="/v1/chat/completions", completion_window="24h")
    job_id = str(uuid.UUID(made.id.removeprefix("batch_")))
    answer = {"index": 0, "finish_reason": "stop", "prompt_tokens": 5, "completion_tokens": 1}
    with Session(db(app_client)) as s:
        s.add_all(
            [
                Sample(job_id=job_id, step=0, index=0, prompt="p", completion="2", data={**answer, "custom_id": "a"}),
                Sample(job_id=job_id, step=2, index=0, prompt="p", completion="6", data={**answer, "custom_id": "c"}),
                Sample(
                    job_id=job_id,
                    step=1,
                    index=0,
                    prompt="",
                    completion="",
                    data={"custom_id": "b", "index": 0, "error": {"code": "ValueError", "message": "too long"}},
                ),
            ]
        )
        s.add(Event(job_id=job_id, type="generated", message="", data={"failed": 1, "answered": 2}))
        s.execute(update(Job).where(Job.id == job_id).values(status="succeeded"))
        s.commit()
    done = client.batches.retrieve(made.id)
    assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    out = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert [(x["custom_id"], x["response"]["status_code"]) for x in out] == [("a", 200), ("c", 200)]
    body = out[1]["response"]["body"]
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == "6"
    assert body["usage"]["completion_tokens"] == 1 and body["model"] == model
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert errors == [
        {
            "id": errors[0]["id"],
            "custom_id": "b",
            "response": None,
            "error": {"code": "ValueError", "message": "too long"},
        }
    ]
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    again = client.batches.retrieve(made.id)  # written once: the same files
    assert (again.output_file_id, again.error_file_id) == (done.output_file_id, done.error_file_id)
    with db(app_client).connect() as c:
        files = c.execute(text("SELECT count(*) FROM files WHERE purpose = 'batch_output'")).scalar_one()
    assert files == 2
