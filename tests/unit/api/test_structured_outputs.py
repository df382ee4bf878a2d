"""Structured outputs at the API (issue 69.2): a chat's `response_format`, a response's `text.format` and a
batch line's, through the real `openai` package. What is served becomes the generate job's
response_format; a schema feature not served is OpenAI's 400, naming where it stands; nothing is stored
for it. (The answers themselves: tests/unit/evaluator/test_chat.py on transformers,
tests/system/test_openai_fine_tuning.py on a worker, tests/system/test_vllm.py on the warm engine.)"""

from __future__ import annotations

import io
import json
from typing import Any, Literal

import pytest

from tests.helpers.api import admin_key, overridden, private_app_client

pytestmark = pytest.mark.quick

app_client = private_app_client()  # no worker: a call's job stays queued, and its wait times out

ALIAS = {"model_aliases": {"gpt-4o-2024-08-06": "org/base-model"}}


def _client(app_client: Any, headers: dict[str, str]) -> Any:
    from openai import OpenAI

    key = headers["Authorization"].removeprefix("Bearer ")
    return OpenAI(base_url=f"{app_client.base_url}/v1", api_key=key, http_client=app_client, max_retries=0)


def _generate_specs(app_client: Any, h: dict[str, str]) -> list[dict[str, Any]]:
    return [j["spec"] for j in app_client.get("/v1/jobs", params={"kind": "generate"}, headers=h).json()["data"]]


def test_a_served_format_is_the_jobs_and_an_unserved_schema_is_openais_400(app_client: Any) -> None:
    import openai
    from pydantic import BaseModel, Field

    class Verdict(BaseModel):
        verdict: Literal["yes", "no"]
        sure: bool

    class Loose(BaseModel):
        word: str = Field(min_length=2)  # minLength: not in OpenAI's strict schemas

    h = admin_key(app_client)
    client = _client(app_client, h).with_options(timeout=6.0)  # no worker: each served call ends in a 504
    chat = [{"role": "user", "content": "Is 2 + 2 = 4?"}]
    with overridden(fine_tuning=ALIAS):
        with pytest.raises(openai.APIStatusError) as waited:
            client.chat.completions.parse(model="gpt-4o-2024-08-06", messages=chat, response_format=Verdict)
        assert waited.value.status_code == 504, waited.value.body
        (spec,) = _generate_specs(app_client, h)
        held = spec["response_format"]["json_schema"]
        assert held["name"] == "Verdict" and held["strict"] is True, held
        assert held["schema"]["properties"]["verdict"]["enum"] == ["yes", "no"], held
        with pytest.raises(openai.BadRequestError, match="'minLength' is not permitted") as refused:
            client.chat.completions.parse(model="gpt-4o-2024-08-06", messages=chat, response_format=Loose)
        assert refused.value.param == "response_format.json_schema.schema.properties.word", refused.value.body
        not_closed = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
        with pytest.raises(openai.BadRequestError, match="'additionalProperties' is required") as refused:
            client.responses.create(
                model="gpt-4o-2024-08-06",
                input="hi",
                text={"format": {"type": "json_schema", "name": "a", "schema": not_closed, "strict": True}},
            )
        assert refused.value.param == "text.format.schema", refused.value.body
        with pytest.raises(openai.BadRequestError, match="uniqueItems"):  # not served, strict or not
            client.chat.completions.create(
                model="gpt-4o-2024-08-06",
                messages=chat,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "u", "schema": {"type": "array", "uniqueItems": True}},
                },
            )
        with pytest.raises(openai.BadRequestError, match="json_schema"):
            client.chat.completions.create(
                model="gpt-4o-2024-08-06", messages=chat, response_format={"type": "json_schema"}
            )
        assert len(_generate_specs(app_client, h)) == 1  # the refused calls stored no job
        with pytest.raises(openai.APIStatusError) as waited:  # the Responses API's flattened format
            client.responses.parse(model="gpt-4o-2024-08-06", input="Is 2 + 2 = 4?", text_format=Verdict)
        assert waited.value.status_code == 504, waited.value.body
        with pytest.raises(openai.APIStatusError):
            client.chat.completions.create(
                model="gpt-4o-2024-08-06", messages=chat, response_format={"type": "json_object"}
            )
    responses_spec, object_spec = _generate_specs(app_client, h)[:2][::-1]
    assert responses_spec["response_format"]["json_schema"]["schema"] == held["schema"], responses_spec
    assert object_spec["response_format"] == {"type": "json_object", "json_schema": None}, object_spec


def test_a_batch_line_with_a_schema_not_served_is_refused_naming_the_line(app_client: Any) -> None:
    import openai

    h = admin_key(app_client)
    client = _client(app_client, h)
    bad = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "object", "not": {}}}}
    good = {"type": "json_schema", "json_schema": {"name": "g", "schema": {"type": "object"}}}
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt-4o-2024-08-06",
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": f,
            },
        }
        for i, f in enumerate((good, bad))
    ]
    data = io.BytesIO("".join(json.dumps(x) + "\n" for x in lines).encode())
    requests = client.files.create(file=("b.jsonl", data), purpose="batch")
    with overridden(fine_tuning=ALIAS), pytest.raises(openai.BadRequestError, match="'not' is not permitted") as e:
        client.batches.create(input_file_id=requests.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert "/input_file_id/line/2/body/response_format/json_schema/schema" in str(e.value.body), e.value.body
    assert _generate_specs(app_client, h) == []


def test_a_chat_with_tools_is_the_jobs_functions_and_what_is_not_served_is_a_400_naming_tools(app_client: Any) -> None:
    """Issue 69.2: chat completions with OpenAI's function `tools`, and the turns a script sends back (the
    assistant's tool_calls, the tool message), become the generate job's functions and messages. (The model's
    calls and its answer after the result: tests/unit/trainer/test_tool_chat_template.py.)"""
    import openai

    h = admin_key(app_client)
    client = _client(app_client, h).with_options(timeout=6.0)
    tool = {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    }
    call = {"id": "call_1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(2)"}'}}
    chat = [
        {"role": "user", "content": "What is 1 + 1?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "2"},
    ]
    with overridden(fine_tuning=ALIAS):
        with pytest.raises(openai.APIStatusError) as waited:  # no worker here
            client.chat.completions.create(model="gpt-4o-2024-08-06", messages=chat, tools=[tool], tool_choice="auto")
        assert waited.value.status_code == 504, waited.value.body
        for bad, where in (
            ({"stream": True}, "tools"),
            ({"tool_choice": "required"}, "tool_choice"),
            ({"response_format": {"type": "json_object"}}, "tools"),
        ):
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(model="gpt-4o-2024-08-06", messages=chat, tools=[tool], **bad)
            assert refused.value.param == where, (bad, refused.value.body)
    with overridden(fine_tuning={"model_aliases": {"gpt-4o-mini": "tiny:2x64"}}):  # ChatML: no tools in it
        with pytest.raises(openai.BadRequestError, match="renders no tools") as refused:
            client.chat.completions.create(model="gpt-4o-mini", messages=chat, tools=[tool])
        assert refused.value.param == "tools", refused.value.body
    with overridden(fine_tuning=ALIAS):
        with pytest.raises(openai.BadRequestError) as refused:  # a tool message answers a call
            client.chat.completions.create(model="gpt-4o-2024-08-06", messages=[{"role": "tool", "content": "2"}])
        assert refused.value.param is not None and "tool_call_id" in refused.value.param, refused.value.body
    (spec,) = _generate_specs(app_client, h)
    assert spec["function_tools"][0]["function"]["name"] == "python" and spec["tool_choice"] == "auto", spec
    assert spec["messages"][1]["tool_calls"] == [call] and spec["messages"][2]["tool_call_id"] == "call_1", spec
