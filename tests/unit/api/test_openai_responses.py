"""OpenAI's Responses API through the real `openai` package, in process (no worker answers here: an
app of the module's own, tests.helpers.api.private_app):
what is not served is a 400 naming the field, before any job is stored; another project's responses
are a 404 (api/routers/openai_responses.py). tests/system/test_openai_fine_tuning.py samples a
fine-tuned model through it on a worker, streamed and not, over two turns."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import text

from tests.helpers.api import admin_key, db, make_objects, private_app_client

pytestmark = pytest.mark.quick
app_client = private_app_client()  # a suite worker would answer (or fail) a response here


def _client(app_client: Any, headers: dict[str, str]) -> Any:
    from openai import OpenAI

    key = headers["Authorization"].removeprefix("Bearer ")
    return OpenAI(base_url=f"{app_client.base_url}/v1", api_key=key, http_client=app_client, max_retries=0)


@pytest.mark.parametrize(
    ("over", "pointer"),
    [
        ({"tools": [{"type": "web_search"}]}, "/tools"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, "/input"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}, "/input"),
        # a schema feature not served (json_object and json_schema are: tests/unit/api/test_structured_outputs.py)
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"not": {}}}}}, "/text/format/schema"),
        ({"max_output_tokens": 10**9}, "/max_output_tokens"),
        ({"background": True, "store": False}, "/store"),
        ({"background": True, "stream": True}, "/stream"),
        ({"include": ["reasoning.encrypted_content"]}, "/include"),
        ({"include": ["message.output_text.logprobs"], "top_logprobs": 21}, "/top_logprobs"),
        ({"previous_response_id": "resp_" + "0" * 32}, "/previous_response_id"),
    ],
)
def test_what_is_not_served_is_a_400_naming_the_field(app_client: Any, over: dict[str, Any], pointer: str) -> None:
    import openai

    h = admin_key(app_client)
    client = _client(app_client, h)
    model = make_objects(app_client, h)["model"]
    before = _jobs(app_client)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**{"model": model, "input": "1 + 1?", **over})
    assert pointer in str(e.value), (pointer, e.value)
    assert _jobs(app_client) == before  # nothing stored


def test_a_response_is_a_generate_job_of_the_project_and_only_its_own(app_client: Any) -> None:
    """The stored job answers as the response (queued here: no worker); its conversation is kept,
    without the instructions; another project's key gets a 404 for it."""
    import openai

    h = admin_key(app_client)
    client = _client(app_client, h).with_options(timeout=4.0)
    model = make_objects(app_client, h)["model"]
    with pytest.raises(openai.APIStatusError) as e:  # no worker answers in the call's 4 s: 504, job cancelled
        client.responses.create(model=model, instructions="Be brief.", input="1 + 1?", max_output_tokens=5)
    assert e.value.status_code == 504, e.value.body
    with db(app_client).connect() as c:
        job_id, tags, config = c.execute(
            text("SELECT id, tags, resolved_config FROM jobs WHERE kind = 'generate' ORDER BY id DESC LIMIT 1")
        ).one()
    tags = tags if isinstance(tags, list) else json.loads(tags)
    config = config if isinstance(config, dict) else json.loads(config)
    assert "openai:responses" in tags and config["openai"]["turns"] == [{"role": "user", "content": "1 + 1?"}]
    resp_id = "resp_" + str(job_id).replace("-", "")
    got = client.responses.retrieve(resp_id)
    assert (got.id, got.status, got.model, got.instructions) == (resp_id, "cancelled", model, "Be brief.")
    assert got.max_output_tokens == 5 and got.output == []
    other = _client(app_client, admin_key(app_client))
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(resp_id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(resp_id)
    with pytest.raises(openai.BadRequestError, match="cancelled"):  # only a completed one is gone on from
        client.responses.create(model=model, previous_response_id=resp_id, input="and?")
    client.responses.delete(resp_id)  # (the SDK reads no body)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp_id)


def _jobs(app_client: Any) -> int:
    with db(app_client).connect() as c:
        return int(c.execute(text("SELECT count(*) FROM jobs")).scalar_one())


def test_an_unstored_response_is_not_retrievable_nor_gone_on_from(app_client: Any) -> None:
    """store: false was accepted and ignored: the response stayed retrievable. Now it is answered and
    then not a response of the project (its job stays among the project's jobs, as every job does)."""
    import openai

    h = admin_key(app_client)
    client = _client(app_client, h).with_options(timeout=4.0)
    model = make_objects(app_client, h)["model"]
    with pytest.raises(openai.APIStatusError) as e:  # no worker answers in the call's 4 s: 504, job cancelled
        client.responses.create(model=model, input="1 + 1?", max_output_tokens=5, store=False)
    assert e.value.status_code == 504, e.value.body
    with db(app_client).connect() as c:
        job_id, tags = c.execute(
            text("SELECT id, tags FROM jobs WHERE kind = 'generate' ORDER BY id DESC LIMIT 1")
        ).one()
    tags = tags if isinstance(tags, list) else json.loads(tags)
    assert "openai:responses-unstored" in tags and "openai:responses" not in tags, tags
    resp_id = "resp_" + str(job_id).replace("-", "")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp_id)
    with pytest.raises(openai.BadRequestError, match="no response with this id"):
        client.responses.create(model=model, previous_response_id=resp_id, input="and?")


def test_a_background_response_is_answered_at_once_and_cancelled_on_request(app_client: Any) -> None:
    """background: true was a 400: a script that polls a long answer could not move. The call returns
    the queued response at once; retrieve follows its job; cancel cancels it (only a background one's)."""
    import openai

    h = admin_key(app_client)
    client = _client(app_client, h).with_options(timeout=4.0)
    model = make_objects(app_client, h)["model"]
    made = client.responses.create(model=model, input="1 + 1?", max_output_tokens=5, background=True)
    assert (made.status, made.background, made.output) == ("queued", True, []), made
    assert client.responses.retrieve(made.id).status == "queued"  # no worker here: it waits
    with pytest.raises(openai.ConflictError):
        client.responses.delete(made.id)
    gone = client.responses.cancel(made.id)
    assert (gone.id, gone.status) == (made.id, "cancelled"), gone
    assert client.responses.cancel(made.id).status == "cancelled"  # again: as it is
    with pytest.raises(openai.APIStatusError):  # a waited one: 504 here, and its job cancelled
        client.responses.create(model=model, input="1 + 1?", max_output_tokens=5)
    with db(app_client).connect() as c:
        (job_id,) = c.execute(text("SELECT id FROM jobs WHERE kind = 'generate' ORDER BY id DESC LIMIT 1")).one()
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.cancel("resp_" + str(job_id).replace("-", ""))
    other = _client(app_client, admin_key(app_client))
    with pytest.raises(openai.NotFoundError):
        other.responses.cancel(made.id)


def test_usage_has_every_field_the_sdk_requires() -> None:
    """Issue 69.5: input_tokens_details.cache_write_tokens was missing; the SDK's ResponseUsage requires it."""
    from openai.types.responses import ResponseUsage

    from api.openai.responses_views import _usage

    usage = ResponseUsage.model_validate(_usage({"prompt_tokens": 7, "completion_tokens": 2, "cached_tokens": 3}))
    assert usage.input_tokens_details.cache_write_tokens == 0 and usage.input_tokens_details.cached_tokens == 3
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (7, 2, 9)
