"""OpenAI's fine-tuning jobs through the real `openai` package against the running service (an
API and a worker process): upload a file, create a reinforcement job with a string_check grader
(a GRPO job underneath) and a supervised one (SFT), follow their events, list checkpoints with
their metrics, list and cancel jobs, and the 422s for what is not supported
(api/routers/openai_fine_tuning.py, docs/openai-rft.md)."""

from __future__ import annotations

import io
import json
import time
import uuid
from typing import Any, Literal

import httpx
import pytest

from tests.helpers.openai_sdk import VERDICT_FORMAT, openai_client, wait_fine_tuning
from tests.helpers.processes import wait_for
from tests.helpers.service import Service

pytestmark = pytest.mark.slow


def _jsonl(rows: list[dict[str, Any]]) -> io.BytesIO:
    return io.BytesIO("".join(json.dumps(r) + "\n" for r in rows).encode())


QUESTIONS = [(a, b) for a, b in ((12, 30), (7, 8), (21, 21), (40, 2))]
RFT_ROWS = [
    {"messages": [{"role": "user", "content": f"What is {a} + {b}?"}], "reference_answer": str(a + b)}
    for a, b in QUESTIONS
]
SFT_ROWS = [
    {"messages": [{"role": "user", "content": f"What is {a} + {b}?"}, {"role": "assistant", "content": str(a + b)}]}
    for a, b in QUESTIONS
]
EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference_answer}}",
    "operation": "like",
}
# the untrained model never answers, so a python grader that reads the item shows that the item
# reaches the grader in a GRPO step, through the sandbox
SEEN = {
    "type": "python",
    "name": "seen",
    "source": "def grade(sample, item):\n    return float('reference_answer' in item)",
}
GRADER = {"type": "multi", "name": "mix", "graders": {"exact": EXACT, "seen": SEEN}, "calculate_output": "exact + seen"}


def _mathrl(service: Service, client: Any, ftjob: str, what: str = "") -> Any:
    """mathrl's own view of a fine-tuning job (GET /v1/jobs/{id}[/what]), with the client's key."""
    job_id = str(uuid.UUID(ftjob.removeprefix("ftjob-")))
    r = httpx.get(f"{service.url}/v1/jobs/{job_id}{what}", headers={"Authorization": f"Bearer {client.api_key}"})
    assert r.status_code == 200, r.text
    return r.json()


def _last_step(service: Service, client: Any, ftjob: str) -> int:
    series = _mathrl(service, client, ftjob, "/metrics?limit=50000")["data"]
    return max((p["step"] for s in series for p in s["points"]), default=0)


def test_reinforcement_and_supervised_jobs_with_the_openai_sdk(service: Service, tiny_model: str) -> None:
    import openai

    client = openai_client(service)
    train = client.files.create(file=("train.jsonl", _jsonl(RFT_ROWS)), purpose="fine-tune")
    valid = client.files.create(file=("valid.jsonl", _jsonl(RFT_ROWS[:3])), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=tiny_model,
        training_file=train.id,
        validation_file=valid.id,
        suffix="adder",
        seed=7,
        metadata={"team": "math"},
        method={
            "type": "reinforcement",
            "reinforcement": {
                "grader": GRADER,
                "hyperparameters": {
                    "n_epochs": 1,
                    "batch_size": 2,
                    "compute_multiplier": 0.25,
                    "reasoning_effort": "low",
                    "eval_interval": 1,
                },
            },
        },
    )
    assert job.object == "fine_tuning.job" and job.id.startswith("ftjob-") and job.status in ("queued", "running")
    assert job.training_file == train.id and job.metadata == {"team": "math"} and job.seed == 7
    assert job.method.type == "reinforcement" and job.method.reinforcement.grader.type == "multi"
    assert job.hyperparameters.batch_size == 2 and job.hyperparameters.n_epochs == 1
    done = wait_fine_tuning(client, job.id)
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model == f"ft:{tiny_model.rsplit('/', 1)[-1]}:adder:{job.id}"
    assert done.trained_tokens and done.trained_tokens > 0 and done.finished_at
    # the events, newest first, paged with `after`
    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    assert events[0].message and {e.level for e in events} <= {"info", "warn", "error"}
    assert any("succeeded" == (e.data or {}).get("type") for e in events), [e.data for e in events]
    page = client.fine_tuning.jobs.list_events(job.id, limit=2)
    older = client.fine_tuning.jobs.list_events(job.id, limit=2, after=page.data[-1].id)
    assert page.has_more and older.data[0].id not in {e.id for e in page.data}
    # a step's metrics as OpenAI's `metrics` events, from which scripts plot the loss (none came before)
    steps = [e.data for e in events if e.type == "metrics"]
    assert [d["step"] for d in steps] == [2, 1] and steps[0]["total_steps"] == 2, steps
    assert {"train_loss", "train_reward_mean"} <= set(steps[0]), steps
    # the checkpoints (every step: eval_interval 1) with their step's metrics; 4 lines / 2 a step = 2 steps
    ckpts = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in ckpts] == [2, 1], ckpts
    assert ckpts[0].fine_tuned_model_checkpoint == f"{done.fine_tuned_model}:ckpt-step-2"
    assert ckpts[0].metrics.step == 2.0 and ckpts[0].metrics.train_loss is not None
    # the validation file, scored by the job's own grader at every checkpoint (seen = 1 on each item)
    assert [c.metrics.valid_reward_mean for c in ckpts] == [1.0, 1.0], ckpts
    # the same job, as mathrl's: a GRPO job on the file with the grader as its reward
    mathrl_id = job.id.removeprefix("ftjob-")
    mathrl_id = f"{mathrl_id[:8]}-{mathrl_id[8:12]}-{mathrl_id[12:16]}-{mathrl_id[16:20]}-{mathrl_id[20:]}"
    mine = httpx.get(f"{service.url}/v1/jobs/{mathrl_id}", headers={"Authorization": f"Bearer {client.api_key}"})
    spec = mine.json()["spec"]
    assert spec["kind"] == "grpo" and spec["dataset"] == {**spec["dataset"], "file": train.id, "format": "messages"}
    assert spec["rewards"][0]["grader"]["graders"]["exact"]["reference"] == "{{item.reference_answer}}"
    assert spec["num_generations"] == 2 and spec["max_completion_length"] == 256
    assert spec["eval"] == {"file": valid.id, "every": 1, "limit": 3, "max_new_tokens": 256, "benchmark": None}
    metrics = httpx.get(
        f"{service.url}/v1/jobs/{mathrl_id}/metrics", headers={"Authorization": f"Bearer {client.api_key}"}
    ).json()["data"]
    rewards = {m["name"]: [p["value"] for p in m["points"]] for m in metrics if m["name"].startswith("rewards/")}
    print(f"\nreinforcement job's reward series: {rewards}")
    assert rewards["rewards/grader_multi/mean"] == [1.0, 1.0]  # seen = 1 on every item, exact = 0
    _sample_the_fine_tuned_model(service, client, done.fine_tuned_model, ckpts[-1].fine_tuned_model_checkpoint)
    # supervised: an SFT job on a file of chats that end with the assistant's answer
    sft_file = client.files.create(file=("sft.jsonl", _jsonl(SFT_ROWS)), purpose="fine-tune")
    sft = client.fine_tuning.jobs.create(
        model=tiny_model,
        training_file=sft_file.id,
        validation_file=sft_file.id,
        method={"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 4, "n_epochs": 2}}},
    )
    sft_done = wait_fine_tuning(client, sft.id)
    assert sft_done.status == "succeeded", sft_done.error
    sft_ckpts = client.fine_tuning.jobs.checkpoints.list(sft.id).data
    assert [c.step_number for c in sft_ckpts] == [2, 1]
    # the validation file's loss at each checkpoint (it was None: a script picking the checkpoint of least
    # full_valid_loss failed comparing None), as OpenAI's full_valid_loss and valid_loss
    losses = [c.metrics.full_valid_loss for c in sft_ckpts]
    assert all(isinstance(x, float) and x > 0 for x in losses), sft_ckpts
    assert [c.metrics.valid_loss for c in sft_ckpts] == losses
    accuracies = [c.metrics.full_valid_mean_token_accuracy for c in sft_ckpts]
    assert all(x is not None and 0 <= x <= 1 for x in accuracies), sft_ckpts
    import base64

    results = base64.b64decode(client.files.content(sft_done.result_files[0]).read()).decode()
    assert "valid_loss" in results.splitlines()[0].split(","), results
    sft_steps = [e.data for e in client.fine_tuning.jobs.list_events(sft.id, limit=100).data if e.type == "metrics"]
    assert any({"train_loss", "train_mean_token_accuracy"} <= set(s) for s in sft_steps), sft_steps
    assert any({"full_valid_loss", "full_valid_mean_token_accuracy"} <= set(s) for s in sft_steps), sft_steps
    # list (newest first) and cancel
    assert [j.id for j in client.fine_tuning.jobs.list().data][:2] == [sft.id, job.id]
    third = client.fine_tuning.jobs.create(model=tiny_model, training_file=sft_file.id)
    client.fine_tuning.jobs.cancel(third.id)
    assert wait_fine_tuning(client, third.id, 120).status == "cancelled"
    # another project sees none of it
    other = openai_client(service)
    with pytest.raises(openai.NotFoundError):
        other.fine_tuning.jobs.retrieve(job.id)
    assert other.fine_tuning.jobs.list().data == []
    # what is refused, naming the field
    with pytest.raises(openai.BadRequestError, match="no file with this id"):
        other.fine_tuning.jobs.create(model=tiny_model, training_file=train.id)
    with pytest.raises(openai.BadRequestError, match="do not end with a user message"):
        client.fine_tuning.jobs.create(
            model=tiny_model,
            training_file=sft_file.id,
            method={"type": "reinforcement", "reinforcement": {"grader": GRADER}},
        )
    with pytest.raises(openai.BadRequestError, match="do not end with a user message and the assistant.s answer"):
        client.fine_tuning.jobs.create(model=tiny_model, training_file=train.id)
    with pytest.raises(openai.BadRequestError, match="'dpo' is not trained here"):
        client.fine_tuning.jobs.create(model=tiny_model, training_file=train.id, method={"type": "dpo"})


def _sample_the_fine_tuned_model(service: Service, client: Any, model: str, checkpoint: str) -> None:
    """GET /v1/models, chat and text completions (streamed and not) and model graders, on the
    job's `ft:` model and its checkpoint: each a 'generate' or 'grade' job on the service's worker."""
    import openai

    names = [m.id for m in client.models.list().data]
    assert model in names and checkpoint in names, names
    assert client.models.retrieve(checkpoint).owned_by
    # chat: two sampled choices, with their usage
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 12 + 30?"}], max_tokens=6, n=2, seed=3
    )
    assert chat.object == "chat.completion" and [c.index for c in chat.choices] == [0, 1]
    assert all(c.message.role == "assistant" and c.finish_reason in ("stop", "length") for c in chat.choices)
    assert chat.usage.prompt_tokens > 0 and 0 < chat.usage.completion_tokens <= 12
    assert chat.usage.completion_tokens_details.reasoning_tokens == 0  # before: None, an AttributeError
    assert chat.usage.prompt_tokens_details.cached_tokens == 0
    # streamed from a checkpoint: the chunks add up to the text the job stored
    chunks = list(
        client.chat.completions.create(
            model=checkpoint,
            messages=[{"role": "system", "content": "Answer."}, {"role": "user", "content": "7 + 8?"}],
            max_completion_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
            top_logprobs=2,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.completion_tokens > 0
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish in (["stop"], ["length"]), finish
    hexid = chunks[0].id.removeprefix("chatcmpl-")
    job_id = f"{hexid[:8]}-{hexid[8:12]}-{hexid[12:16]}-{hexid[16:20]}-{hexid[20:]}"
    auth = {"Authorization": f"Bearer {client.api_key}"}
    stored = httpx.get(f"{service.url}/v1/jobs/{job_id}/samples", headers=auth).json()["data"]
    assert text == stored[0]["completion"], (text, stored)
    # its log-probabilities come whole with its last chunk (greedy: each token the likelier of two)
    (last,) = [c.choices[0].logprobs.content for c in chunks if c.choices and c.choices[0].logprobs]
    tokens = stored[0]["data"]["completion_tokens"]  # counts the end-of-sequence token, which has none
    assert len(last) == (tokens - 1 if finish == ["stop"] else tokens), (len(last), tokens, finish)
    assert all(len(t.top_logprobs) == 2 and t.logprob == t.top_logprobs[0].logprob for t in last), last
    deltas = [
        e
        for e in httpx.get(f"{service.url}/v1/jobs/{job_id}/events", headers=auth).json()["data"]
        if e["type"] == "delta"
    ]
    print(f"\nstreamed {len(chunks)} chunks ({len(deltas)} delta events): {text!r}")
    # structured outputs (issue 69.2): the answer decoded under the schema, which the SDK parses; the tiny
    # model's free text is never this JSON
    from pydantic import BaseModel

    class Verdict(BaseModel):
        verdict: Literal["yes", "no"]
        sure: bool

    ask = [{"role": "user", "content": "Is 12 + 30 = 42?"}]
    parsed = client.chat.completions.parse(model=model, messages=ask, response_format=Verdict, max_tokens=64, seed=3)
    assert isinstance(parsed.choices[0].message.parsed, Verdict), parsed
    answered = client.responses.parse(model=model, input=ask[0]["content"], text_format=Verdict, max_output_tokens=64)
    assert isinstance(answered.output_parsed, Verdict) and answered.text.format.type == "json_schema", answered
    # a plain prompt, no chat template
    done = client.completions.create(model=model, prompt="12 + 30 =", max_tokens=4, temperature=0, logprobs=1)
    assert done.object == "text_completion" and done.choices[0].finish_reason in ("stop", "length")
    got = done.choices[0].logprobs  # the legacy shape
    assert got is not None and len(got.tokens) == len(got.token_logprobs) == len(got.top_logprobs) > 0, got
    assert got.text_offset[0] == 0 and all(len(t) == 1 for t in got.top_logprobs), got
    # the Responses API, as newer scripts sample: the same generate job; a second turn goes on from the first
    first = client.responses.create(
        model=model,
        instructions="Answer.",
        input="What is 12 + 30?",
        max_output_tokens=6,
        temperature=0,
        include=["message.output_text.logprobs"],
        top_logprobs=1,
    )
    assert first.object == "response" and first.status in ("completed", "incomplete"), first
    scored = first.output[0].content[0].logprobs
    assert scored and all(len(t.top_logprobs) == 1 and t.logprob <= 0 for t in scored), scored
    assert first.output_text == first.output[0].content[0].text and 0 < first.usage.output_tokens <= 6
    assert first.usage.input_tokens > 0 and first.instructions == "Answer."
    assert first.usage.input_tokens_details.cache_write_tokens == 0  # before: missing, an AttributeError
    second = client.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"role": "user", "content": "And 7 + 8?"}],
        max_output_tokens=6,
    )
    items = [(i.role, i.content[0].text) for i in client.responses.input_items.list(second.id, order="asc")]
    assert items == [("user", "What is 12 + 30?"), ("assistant", first.output_text), ("user", "And 7 + 8?")], items
    events = list(
        client.responses.create(
            model=model, input="7 + 8?", max_output_tokens=6, temperature=0, stream=True, store=False
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete"), kinds
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == events[-1].response.output_text, (streamed, events[-1])
    assert events[-1].response.store is False  # answered, and not kept as a response
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(events[-1].response.id)
    # in the background: queued at once, retrieved until its job ends
    bg = client.responses.create(model=model, input="7 + 8?", max_output_tokens=6, temperature=0, background=True)
    assert bg.status in ("queued", "in_progress") and bg.background, bg
    ended = wait_for(
        lambda: next(
            (r for r in [client.responses.retrieve(bg.id)] if r.status not in ("queued", "in_progress")), None
        ),
        120,
        0.5,
        "the background response to end",
    )
    assert ended.status in ("completed", "incomplete") and ended.output_text == events[-1].response.output_text, ended
    # a batch of chats (OpenAI's Batch API), answered off-line: its output file holds each line's answer,
    # as the same call would have it
    asks = ("7 + 8?", "12 + 30?")
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": q}], "max_tokens": 4, "temperature": 0},
        }
        for i, q in enumerate(asks)
    ]
    held = VERDICT_FORMAT
    lines.append(
        {**lines[0], "custom_id": "q2", "body": {**lines[0]["body"], "max_tokens": 64, "response_format": held}}
    )
    requests = client.files.create(file=("batch.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=requests.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait_for(
        lambda: next((b for b in [client.batches.retrieve(batch.id)] if b.status in ("completed", "failed")), None),
        180,
        0.5,
        "the batch to end",
    )
    assert batch.status == "completed" and batch.request_counts.completed == 3 and not batch.error_file_id, batch
    answers = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert [a["custom_id"] for a in answers] == ["q0", "q1", "q2"], answers
    Verdict.model_validate_json(answers[2]["response"]["body"]["choices"][0]["message"]["content"])
    alone = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": asks[0]}], max_tokens=4, temperature=0
    )
    assert answers[0]["response"]["body"]["choices"][0]["message"]["content"] == alone.choices[0].message.content
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(second.id)  # (the SDK reads no body)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)
    # the fine-tuned model as the grading model of score_model and label_model graders
    judge = [{"role": "user", "content": "Score 0-1: {{sample.output_text}} for {{item.reference_answer}}"}]
    grader = {
        "type": "multi",
        "name": "judged",
        "graders": {
            "score": {"type": "score_model", "name": "score", "model": model, "input": judge, "range": [0, 1]},
            "label": {
                "type": "label_model",
                "name": "label",
                "model": model,
                "input": judge,
                "labels": ["right", "wrong"],
                "passing_labels": ["right"],
            },
        },
        "calculate_output": "score + label",
    }
    graded = client.fine_tuning.alpha.graders.run(grader=grader, model_sample="42", item={"reference_answer": "42"})
    assert set(graded.sub_rewards) == {"score", "label"} and 0 <= graded.reward <= 2, graded
    print(f"model graders on the fine-tuned model: {graded.sub_rewards}, errors {graded.metadata.errors}")
    # why a grading model's score is what it is, where the SDK shows it (issue 46.7: only other_error was set)
    alone = client.fine_tuning.alpha.graders.run(
        grader=grader["graders"]["label"], model_sample="42", item={"reference_answer": "42"}
    )
    errors = alone.metadata.errors
    print(f"label_model alone: reward {alone.reward}, errors {errors}")
    assert not errors.other_error
    if alone.reward == 0.0:
        assert errors.model_grader_parse_error and "none of the labels" in (
            errors.model_grader_server_error_details or ""
        )
    # another project sees none of it
    other = openai_client(service)
    assert other.models.list().data == []
    with pytest.raises(openai.NotFoundError, match="does not exist or you do not have access"):
        other.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        other.responses.create(model=model, previous_response_id=first.id, input="hi")
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model=model, messages=[])


def test_pause_drains_to_a_checkpoint_and_resume_goes_on_from_it(service: Service, tiny_model: str) -> None:
    import openai

    client = openai_client(service)
    train = client.files.create(file=("train.jsonl", _jsonl(RFT_ROWS)), purpose="fine-tune")
    hp = {"n_epochs": 10, "batch_size": 2, "compute_multiplier": 0.25, "reasoning_effort": "low", "eval_interval": 5}
    job = client.fine_tuning.jobs.create(
        model=tiny_model,
        training_file=train.id,
        method={"type": "reinforcement", "reinforcement": {"grader": EXACT, "hyperparameters": hp}},
    )
    deadline = time.monotonic() + 120
    while client.fine_tuning.jobs.retrieve(job.id).status != "running":
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    time.sleep(2.0)  # a step or two in
    at_pause = _last_step(service, client, job.id)
    # the state asked for, at once, as OpenAI answers (issue 46.3: it was 'running' for 4.5-51 s)
    assert client.fine_tuning.jobs.pause(job.id).status == "paused"
    assert client.fine_tuning.jobs.retrieve(job.id).status == "paused"
    deadline = time.monotonic() + 120
    while _mathrl(service, client, job.id)["status"] != "paused":  # the worker has drained it
        assert time.monotonic() < deadline, "the job never drained"
        time.sleep(0.3)
    steps = [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id).data]
    assert steps and max(steps) < 20, steps  # it stopped at a checkpoint before the end
    # and it held: the step under way ended, no other started (+1: metrics stored behind by the sink's writer)
    assert max(steps) <= at_pause + 2, (at_pause, steps)
    kinds = [(e.data or {}).get("type") for e in client.fine_tuning.jobs.list_events(job.id, limit=100).data]
    # the job drains at the step's end, whether it read the pause from its row first or its
    # supervisor did (then a drain_requested event too)
    assert kinds[0] == "paused" and "pause_requested" in kinds, kinds
    assert client.fine_tuning.jobs.resume(job.id).status == "queued"
    done = wait_fine_tuning(client, job.id)
    assert done.status == "succeeded", done.error
    events = client.fine_tuning.jobs.list_events(job.id, limit=200).data
    resumed = [e for e in events if (e.data or {}).get("type") == "resumed"]
    claims = [e.message for e in events if (e.data or {}).get("type") == "claimed"]
    assert resumed and len(claims) == 2, claims
    final = [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id).data]
    assert max(final) == 20, final
    with pytest.raises(openai.ConflictError, match="cannot be paused"):
        client.fine_tuning.jobs.pause(job.id)
    with pytest.raises(openai.ConflictError, match="cannot be resumed"):
        client.fine_tuning.jobs.resume(job.id)
    print(f"\npaused at step {at_pause} with checkpoints at steps {sorted(steps)}, finished with {sorted(final)}")
    # a running job cancelled: 'cancelled' at once, and no further step starts
    long = client.fine_tuning.jobs.create(
        model=tiny_model,
        training_file=train.id,
        method={"type": "reinforcement", "reinforcement": {"grader": EXACT, "hyperparameters": hp}},
    )
    deadline = time.monotonic() + 120
    while _last_step(service, client, long.id) < 2:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    at_cancel = _last_step(service, client, long.id)
    assert client.fine_tuning.jobs.cancel(long.id).status == "cancelled"
    deadline = time.monotonic() + 120
    while _mathrl(service, client, long.id)["status"] != "cancelled":
        assert time.monotonic() < deadline, "the job never stopped"
        time.sleep(0.3)
    ended = _last_step(service, client, long.id)
    assert ended <= at_cancel + 2, (at_cancel, ended)
    print(f"cancelled at step {at_cancel}, stopped after step {ended}")
