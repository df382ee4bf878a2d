"""A reinforcement fine-tuning script as it is written for OpenAI's API, with the official `openai`
package. It runs unchanged against mathrl: the package reads OPENAI_BASE_URL and OPENAI_API_KEY
(`bench/openai_migration.py` starts an embedded mathrl and runs this file; docs/openai-rft.md
shows its output).

It checks a grader, uploads the data, trains, follows the job, lists its checkpoints and models,
talks to the fine-tuned model, then trains again with a higher learning rate and talks to that
model too (the first chat after a job: what issue 46.4 measured)."""

from __future__ import annotations

import time
from pathlib import Path

from openai import OpenAI

HERE = Path(__file__).parent
client = OpenAI()

grader = {
    "type": "string_check",
    "name": "exact_answer",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference_answer}}",
    "operation": "eq",
}
client.fine_tuning.alpha.graders.validate(grader=grader)
check = client.fine_tuning.alpha.graders.run(grader=grader, model_sample="72", item={"reference_answer": "72"})
print(f"grader check: reward {check.reward}")

train = client.files.create(file=open(HERE / "train.jsonl", "rb"), purpose="fine-tune")
valid = client.files.create(file=open(HERE / "valid.jsonl", "rb"), purpose="fine-tune")
print(f"uploaded {train.filename} as {train.id} ({train.bytes} bytes), {valid.filename} as {valid.id}")


def fine_tune(learning_rate_multiplier: float) -> str:
    job = client.fine_tuning.jobs.create(
        model="o4-mini-2025-04-16",
        training_file=train.id,
        validation_file=valid.id,
        suffix="adder",
        seed=42,
        method={
            "type": "reinforcement",
            "reinforcement": {
                "grader": grader,
                "hyperparameters": {
                    "n_epochs": 1,
                    "batch_size": 4,
                    "learning_rate_multiplier": learning_rate_multiplier,
                    "compute_multiplier": 0.5,
                    "reasoning_effort": "low",
                    "eval_interval": 2,
                },
            },
        },
    )
    print(f"created {job.id} on {job.model}: {job.status}")
    seen: set[str] = set()
    while True:
        job = client.fine_tuning.jobs.retrieve(job.id)
        events = client.fine_tuning.jobs.list_events(job.id, limit=50).data
        for event in reversed(events):
            if event.id not in seen:
                seen.add(event.id)
                print(f"  [{event.level}] {event.message[:110]}")
        if job.status in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(2)
    print(f"{job.id}: {job.status}, {job.trained_tokens} trained tokens, model {job.fine_tuned_model}")
    if job.status != "succeeded":
        raise SystemExit(f"the job did not succeed: {job.error}")
    for ckpt in client.fine_tuning.jobs.checkpoints.list(job.id).data:
        print(
            f"  checkpoint step {ckpt.step_number}: train loss {ckpt.metrics.train_loss}, "
            f"valid reward {ckpt.metrics.valid_reward_mean}"
        )
    assert job.fine_tuned_model is not None
    return job.fine_tuned_model


def ask(model: str, question: str) -> str:
    t0 = time.monotonic()
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=16, temperature=0
    )
    print(f"  chat in {time.monotonic() - t0:.1f} s: {question!r} -> {answer.choices[0].message.content!r}")
    return answer.choices[0].message.content or ""


first = fine_tune(learning_rate_multiplier=1.0)
print("first chat with the fine-tuned model, then a second one:")
ask(first, "What is 25 + 47? Answer with the number only.")
ask(first, "What is 12 + 30? Answer with the number only.")
print("streamed:", end=" ")
for chunk in client.chat.completions.create(
    model=first, messages=[{"role": "user", "content": "What is 7 + 8?"}], max_tokens=16, stream=True
):
    if chunk.choices:
        print(repr(chunk.choices[0].delta.content or ""), end=" ")
print()

second = fine_tune(learning_rate_multiplier=4.0)
print("the first chat with the model trained second, then a second one:")
ask(second, "What is 25 + 47? Answer with the number only.")
ask(second, "What is 12 + 30? Answer with the number only.")

print("models:", [m.id for m in client.models.list()])
