"""OpenAI's Evals API through the real `openai` package against the running service (an API and a
worker process), as a script migrating from OpenAI runs it: upload the items (purpose 'evals'),
create an eval with testing criteria, run it on a model (`completions`: an eval job samples the
model on each item's prompt, filled from the run's template) and on given samples (`jsonl`: a
grade job), poll the run, read its counts and output items (api/routers/openai_evals.py)."""

from __future__ import annotations

import io
import json
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.helpers.openai_sdk import openai_client
from tests.helpers.service import Service

pytestmark = pytest.mark.slow

ITEMS = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in ((12, 30), (7, 8), (21, 21))]
EXACT = {
    "type": "string_check",
    "name": "exact answer",
    "input": "{{sample.output_text}}",
    "reference": "{{item.answer}}",
    "operation": "eq",
}
# reads the item and the sample in the sandbox: passes where the item reached the grader
SEEN = {
    "type": "python",
    "name": "item seen",
    "source": "def grade(sample, item):\n    return float(item['answer'].isdigit() and 'output_text' in sample)",
    "pass_threshold": 1.0,
}
SCHEMA = {
    "type": "custom",
    "item_schema": {"type": "object", "properties": {"question": {"type": "string"}, "answer": {"type": "string"}}},
    "include_sample_schema": True,
}


def _wait(client: Any, eval_id: str, run_id: str, timeout: float = 300) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.evals.runs.retrieve(run_id, eval_id=eval_id)
        if run.status in ("completed", "failed", "canceled"):
            return run
        time.sleep(0.5)
    raise TimeoutError(f"{run_id} still {run.status}")


def test_an_eval_runs_on_a_model_and_on_given_samples_with_the_openai_sdk(service: Service, tiny_model: str) -> None:
    import openai

    client = openai_client(service)
    lines = "".join(json.dumps({"item": i}) + "\n" for i in ITEMS).encode()
    items = client.files.create(file=("items.jsonl", io.BytesIO(lines)), purpose="evals")
    assert items.purpose == "evals"
    ev = client.evals.create(name="adder", data_source_config=SCHEMA, testing_criteria=[EXACT, SEEN])
    assert ev.id.startswith("eval_") and ev.name == "adder"
    assert ev.data_source_config.schema_["required"] == ["item", "sample"]
    assert [c.name for c in ev.testing_criteria] == ["exact answer", "item seen"]

    # on a model: each item's prompt is the template filled from it
    template = [
        {"role": "developer", "content": "Answer with a number only."},
        {"role": "user", "content": "{{item.question}}"},
    ]
    run = client.evals.runs.create(
        ev.id,
        name="tiny",
        data_source={
            "type": "completions",
            "model": tiny_model,
            "input_messages": {"type": "template", "template": template},
            "source": {"type": "file_id", "id": items.id},
            "sampling_params": {"temperature": 0, "max_completion_tokens": 6, "seed": 3},
        },
        metadata={"team": "math"},
    )
    assert run.id.startswith("evalrun_") and run.status in ("queued", "in_progress"), run
    done = _wait(client, ev.id, run.id)
    assert done.status == "completed", done
    assert done.result_counts.total == 3 and done.result_counts.errored == 0, done.result_counts
    by_name = {r.testing_criteria: r for r in done.per_testing_criteria_results}
    assert by_name["item seen"].passed == 3, by_name  # the python grader read each item and sample
    assert by_name["exact answer"].passed + by_name["exact answer"].failed == 3
    assert done.per_model_usage[0].invocation_count == 3 and done.per_model_usage[0].completion_tokens > 0
    assert done.metadata == {"team": "math"} and done.model == tiny_model
    out = list(client.evals.runs.output_items.list(run.id, eval_id=ev.id))
    assert [o.datasource_item_id for o in out] == [0, 1, 2]
    first = out[0]
    assert first.datasource_item == ITEMS[0]
    assert first.sample.input[-1].content == ITEMS[0]["question"]  # the template, filled from the item
    assert first.sample.input[0].content == "Answer with a number only."
    assert first.sample.usage.prompt_tokens > 0 and first.sample.max_completion_tokens == 6
    assert [r.name for r in first.results] == ["exact answer", "item seen"]
    # the prompt the model was given is the filled template through its chat template, not a recipe's
    job_id = str(uuid.UUID(run.id.removeprefix("evalrun_")))
    headers = {"Authorization": f"Bearer {client.api_key}"}
    prompts = [
        r["prompt"] for r in httpx.get(f"{service.url}/v1/jobs/{job_id}/samples", headers=headers).json()["data"]
    ]
    assert "Answer with a number only." in prompts[0] and "What is 12 + 30?" in prompts[0], prompts[0]
    assert "boxed" not in prompts[0]  # (the math recipe's instruction)
    again = client.evals.runs.output_items.retrieve(first.id, eval_id=ev.id, run_id=run.id)
    assert again.id == first.id and again.sample.output[0].content == first.sample.output[0].content

    # on given samples: each scored as it is (two right, one wrong), inline
    content = [{"item": i, "sample": {"output_text": i["answer"]}} for i in ITEMS[:2]]
    content.append({"item": ITEMS[2], "sample": {"output_text": "41"}})
    graded = client.evals.runs.create(
        ev.id, data_source={"type": "jsonl", "source": {"type": "file_content", "content": content}}
    )
    done = _wait(client, ev.id, graded.id)
    assert done.status == "completed", done
    counts = done.result_counts
    assert (counts.total, counts.passed, counts.failed, counts.errored) == (3, 2, 1, 0), counts
    failed = list(client.evals.runs.output_items.list(graded.id, eval_id=ev.id, status="fail"))
    assert [(o.datasource_item_id, o.datasource_item) for o in failed] == [(2, ITEMS[2])]
    assert failed[0].sample.output[0].content == "41"
    assert [(r.name, r.passed) for r in failed[0].results] == [("exact answer", False), ("item seen", True)]
    assert [r.id for r in client.evals.runs.list(ev.id)] == [run.id, graded.id]

    # another project sees none of it
    other = openai_client(service)
    with pytest.raises(openai.NotFoundError):
        other.evals.retrieve(ev.id)
    with pytest.raises(openai.NotFoundError):
        other.evals.runs.retrieve(run.id, eval_id=ev.id)
    with pytest.raises(openai.BadRequestError, match="/data_source/source/id"):  # nor reads its file
        other_ev = other.evals.create(data_source_config=SCHEMA, testing_criteria=[EXACT])
        other.evals.runs.create(
            other_ev.id,
            data_source={
                "type": "completions",
                "model": tiny_model,
                "input_messages": {"type": "template", "template": template},
                "source": {"type": "file_id", "id": items.id},
            },
        )

    assert client.evals.runs.delete(graded.id, eval_id=ev.id).deleted
    assert [r.id for r in client.evals.runs.list(ev.id)] == [run.id]
    assert client.evals.delete(ev.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.evals.retrieve(ev.id)
