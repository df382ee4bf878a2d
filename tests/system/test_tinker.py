"""The Tinker-compatible API (api/routers/tinker.py, kind `session`) through the real `tinker` SDK
(0.38.0) against the running service (an API and a worker process), on the tests' tiny model:
supervised steps lower the loss; a saved state resumed with its optimizer takes the same next step,
bit for bit; sampling from a sampler save gives the trained model's text, and from the base model the
untrained one's; a save answers as an `ft:` model on the OpenAI surface; an RL loop (sample, grade
with mathrl's grader, importance_sampling) raises the reward; another project's key gets 404s; and a
client killed mid-session frees the worker after the heartbeat timeout; a cancelled session ends, and a
drained one fails with the reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from tests.helpers.service import Service

pytestmark = pytest.mark.slow

TEXT = "12 + 30 = 42. 7 + 8 = 15. 21 + 21 = 42."


@pytest.fixture(scope="module")
def tinker_env() -> None:
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"


def _client(service: Service, key: str) -> Any:
    import tinker

    return tinker.ServiceClient(base_url=service.url, api_key=f"tml-{key}")


def _datum(tokenizer: Any, text: str) -> Any:
    from tinker import types

    tokens = tokenizer.encode(text)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


def _loss(training: Any, data: list[Any]) -> float:
    out = training.forward_backward(data, "cross_entropy").result()
    return float(out.metrics["loss:sum"])


def _job_of_model(service: Service, key: str, model_id: str) -> dict[str, Any]:
    r = httpx.get(f"{service.url}/v1/jobs", params={"kind": "session"}, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return next(j for j in r.json()["data"] if j["name"] == model_id)


def _checkpoints(service: Service, key: str, job_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{service.url}/v1/jobs/{job_id}/checkpoints", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    data: list[dict[str, Any]] = r.json()["data"]
    return data


def _ended(service: Service, key: str, model_id: str) -> str:
    """The status of the session's job once it has ended (finished by the client's `with` exit)."""
    deadline = time.monotonic() + 60
    while (status := _job_of_model(service, key, model_id)["status"]) not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, f"the finished session's job is still {status}"
        time.sleep(0.5)
    return str(status)


def test_a_training_client_learns_saves_resumes_and_samples(
    service: Service, tiny_model: str, tinker_env: None
) -> None:
    from tinker import types

    key = service.key()
    adam = types.AdamParams(learning_rate=3e-3)
    greedy = types.SamplingParams(max_tokens=6, temperature=0.0)
    with _client(service, key) as client:
        labels = {"renderer_name": "role_colon"}  # what the cookbook stores, and reads back on resuming
        training = client.create_lora_training_client(
            base_model=tiny_model, rank=8, seed=0, user_metadata=labels
        ).result()
        tokenizer = training.get_tokenizer()  # offline: the model's own directory
        data = [_datum(tokenizer, TEXT)]
        prompt = types.ModelInput.from_ints(tokenizer.encode("12 + 30 ="))
        before = training.save_weights_and_get_sampling_client().sample(prompt, 1, greedy).result()
        losses = []
        for _ in range(20):
            losses.append(_loss(training, data))
            training.optim_step(adam).result()
        print("losses:", [round(x, 3) for x in losses])
        assert losses[-1] < 0.5 * losses[0], losses

        # saves: the state with its optimizer, and the adapter for sampling
        state = training.save_state("after-20").result().path
        assert state == f"tinker://{training.model_id}/weights/after-20"
        sampler_path = training.save_weights_for_sampler("trained").result().path
        now = training.save_weights_and_get_sampling_client()
        here = now.sample(prompt, 1, greedy).result()
        prompt_lp = now.compute_logprobs(prompt).result()  # each prompt token's, given those before it
        assert len(prompt_lp) == prompt.length and prompt_lp[0] is None and all(v < 0 for v in prompt_lp[1:])
        trained = tokenizer.decode(here.sequences[0].tokens)
        assert trained != tokenizer.decode(before.sequences[0].tokens)  # training changed what it says
        on_path = client.create_sampling_client(model_path=sampler_path).sample(prompt, 2, greedy).result()
        assert {tokenizer.decode(s.tokens) for s in on_path.sequences} == {trained}
        assert all(len(s.logprobs) == len(s.tokens) for s in on_path.sequences)
        # the next step, to compare with the resumed client's
        first = (_loss(training, data), training.optim_step(adam).result(), _loss(training, data))

        # the SDK's RestClient reads the run and its saves (api/routers/tinker_runs.py)
        import tinker

        rest = client.create_rest_client()
        run = rest.get_training_run_by_tinker_path(sampler_path).result()
        assert (run.training_run_id, run.base_model, run.lora_rank) == (training.model_id, tiny_model, 8), run
        assert run.user_metadata == labels and run.last_checkpoint and run.last_checkpoint.tinker_path == state, run
        assert run.last_sampler_checkpoint and run.last_sampler_checkpoint.tinker_path == sampler_path, run
        saves = rest.list_checkpoints(training.model_id).result().checkpoints
        assert {(c.checkpoint_type, c.tinker_path) for c in saves} == {("training", state), ("sampler", sampler_path)}
        assert training.model_id in {r.training_run_id for r in rest.list_training_runs().result().training_runs}
        assert {c.tinker_path for c in rest.list_user_checkpoints().result().checkpoints} >= {state, sampler_path}
        info = rest.get_weights_info_by_tinker_path(state).result()
        assert (info.base_model, info.lora_rank, info.is_lora) == (tiny_model, 8, True), info
        with pytest.raises(tinker.BadRequestError, match="not served"):
            rest.delete_checkpoint_from_tinker_path(state).result()

        # the job records what it did: its losses per step, its saves as checkpoints
        job = _job_of_model(service, key, training.model_id)
        auth = {"Authorization": f"Bearer {key}"}
        r = httpx.get(f"{service.url}/v1/jobs/{job['id']}/metrics", headers=auth)
        assert r.status_code == 200, r.text
        print("metrics:", str(r.json())[:300])
        events = httpx.get(f"{service.url}/v1/jobs/{job['id']}/events", headers=auth).json()["data"]
        said = json.dumps([(e["message"], e["data"]) for e in events])
        assert "serving training calls" in said and "http://" not in said, said  # the worker's address is not theirs
        print("checkpoints:", str(_checkpoints(service, key, job["id"]))[:300])

        # another project's key: 404 on the model, its futures and its saves
        headers = {"X-API-Key": f"tml-{service.key()}"}
        r = httpx.post(f"{service.url}/api/v1/get_info", json={"model_id": training.model_id}, headers=headers)
        assert r.status_code == 404, r.text
        r = httpx.post(f"{service.url}/api/v1/retrieve_future", json={"request_id": f"{job['id']}:1"}, headers=headers)
        assert r.status_code == 404, r.text
        body = {"session_id": "x", "sampling_session_seq_id": 0, "model_path": sampler_path}
        r = httpx.post(f"{service.url}/api/v1/create_sampling_session", json=body, headers=headers)
        assert r.status_code == 404, r.text
        r = httpx.get(f"{service.url}/api/v1/training_runs/{training.model_id}", headers=headers)
        assert r.status_code == 404, r.text
        r = httpx.get(f"{service.url}/api/v1/checkpoints", headers=headers)
        assert r.status_code == 200 and r.json()["checkpoints"] == [], r.text
    assert _ended(service, key, training.model_id) == "succeeded"  # the `with` exit finished the session

    # a new client resumes from the state, optimizer included: the same next step, bit for bit
    with _client(service, key) as client:
        resumed = client.create_training_client_from_state_with_optimizer(state).result()
        again = (_loss(resumed, data), resumed.optim_step(adam).result(), _loss(resumed, data))
        assert (first[0], first[2]) == (again[0], again[2])
    _ended(service, key, resumed.model_id)

    # sampling from the sampler save once its job has ended: a sampling job of its own, the trained text
    with _client(service, key) as client:
        later = client.create_sampling_client(model_path=sampler_path).sample(prompt, 1, greedy).result()
        assert tokenizer.decode(later.sequences[0].tokens) == trained
    # the same save is an `ft:` model of the project: listed, and answered by the OpenAI surface's path
    saves = {c["data"]["tinker_path"]: c["data"]["model"] for c in _checkpoints(service, key, job["id"])}
    ft_name = saves[sampler_path]
    assert ft_name.startswith("ft:") and ":tinker:ftjob-" in ft_name and saves[state] != ft_name, saves
    listed = httpx.get(f"{service.url}/v1/models", headers=auth)
    assert ft_name in {m["id"] for m in listed.json()["data"]}, listed.text
    body = {"model": ft_name, "prompt": "12 + 30 =", "max_tokens": 6, "temperature": 0}
    r = httpx.post(f"{service.url}/v1/completions", json=body, headers=auth, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == trained, (r.json(), trained)
    final = body | {"model": ft_name.rsplit(":ckpt-step-", 1)[0]}  # a session has no final model: its saves are
    assert httpx.post(f"{service.url}/v1/completions", json=final, headers=auth).status_code == 404
    other = {"Authorization": f"Bearer {service.key()}"}
    assert httpx.post(f"{service.url}/v1/completions", json=body, headers=other).status_code == 404
    # and from the base model: the untrained text (a new adapter starts as a no-op)
    with _client(service, key) as client:
        base = client.create_sampling_client(base_model=tiny_model).sample(prompt, 1, greedy).result()
        assert base.sequences[0].tokens == before.sequences[0].tokens


KILLED_CLIENT = """
import sys, tinker
client = tinker.ServiceClient(base_url=sys.argv[1], api_key="tml-" + sys.argv[2])
training = client.create_lora_training_client(base_model=sys.argv[3], rank=4)
print(training.model_id, flush=True)
import time; time.sleep(600)
"""


def test_a_killed_client_frees_the_worker_after_the_heartbeat_timeout(
    service: Service, tiny_model: str, tinker_env: None
) -> None:
    key = service.key()
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_CLIENT, service.url, key, tiny_model], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        model_id = proc.stdout.readline().strip()
        assert _job_of_model(service, key, model_id)["status"] == "running"
    finally:
        proc.kill()
        proc.wait()
    killed = time.monotonic()
    while (job := _job_of_model(service, key, model_id))["status"] == "running":
        assert time.monotonic() - killed < 90, "the abandoned session still holds the worker"
        time.sleep(1)
    took = time.monotonic() - killed
    print(f"freed {took:.1f} s after the client was killed (heartbeat timeout 20 s)")
    assert job["status"] == "succeeded" and took >= 15


def test_a_cancelled_session_ends_and_a_drained_one_fails_with_the_reason(
    service: Service, tiny_model: str, tinker_env: None
) -> None:
    """Cancel and drain work on a session as on any job. A cancel (POST /v1/jobs/{id}/cancel) ends
    it `cancelled`, and the client's next call is told the session ended. A drain (SIGTERM to the
    worker, Kubernetes stopping its pod) cannot move a model that lives in the job's memory: the
    job fails, saying so and what to do, and the worker exits cleanly."""
    import tinker

    key = service.key()
    auth = {"Authorization": f"Bearer {key}"}
    with _client(service, key) as client:
        training = client.create_lora_training_client(base_model=tiny_model, rank=4).result()
        data = [_datum(training.get_tokenizer(), TEXT)]
        _loss(training, data)
        job = _job_of_model(service, key, training.model_id)
        r = httpx.post(f"{service.url}/v1/jobs/{job['id']}/cancel", headers=auth)
        assert r.status_code == 200, r.text
        assert _ended(service, key, training.model_id) == "cancelled"
        t0 = time.monotonic()
        with pytest.raises(tinker.NotFoundError, match="is cancelled: start a new client"):
            training.forward_backward(data, "cross_entropy").result()
        assert time.monotonic() - t0 < 10  # told at once, not retried

    worker = service.workers[0]
    try:
        with _client(service, key) as client:
            training = client.create_lora_training_client(base_model=tiny_model, rank=4).result()
            _loss(training, data)
            os.killpg(worker.pid, signal.SIGTERM)
            assert worker.wait(timeout=60) == 0  # a warm shutdown, after the drain
            job = _job_of_model(service, key, training.model_id)
            assert job["status"] == "failed", job
            assert "drained" in job["error"] and "save_state" in job["error"], job["error"]
    finally:
        service.stop_worker(worker)
        service.start_worker()


DIGIT = {"type": "regex", "pattern": "\\d"}  # dense on a random model: ~1 in 4 samples


def _rewards(service: Service, key: str, texts: list[str]) -> list[float]:
    """mathrl's grader on the completions, through POST /v1/graders:run."""
    r = httpx.post(
        f"{service.url}/v1/graders:run",
        json={"grader": DIGIT, "items": [{"completion": t} for t in texts]},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return [float(d["score"]) for d in r.json()["data"]]


def test_an_rl_loop_samples_grades_and_raises_its_reward(service: Service, tiny_model: str, tinker_env: None) -> None:
    """Tinker's RL loop as a user writes it: sample a group per prompt from the current weights, grade
    with mathrl's grader, advantages centred per group, `importance_sampling` with the sampler's
    log-probabilities, `optim_step`."""
    from tinker import types

    key = service.key()
    params = types.SamplingParams(max_tokens=3, temperature=1.0, seed=0)
    with _client(service, key) as client:
        training = client.create_lora_training_client(base_model=tiny_model, rank=8, seed=0).result()
        tokenizer = training.get_tokenizer()
        prompts = [tokenizer.encode(f"{a} + {b} =") for a, b in ((2, 3), (4, 1), (3, 3), (1, 5))]
        means, mixed = [], []  # mixed: the last batch whose group rewards differed
        for _ in range(12):
            sampler = training.save_weights_and_get_sampling_client().result()
            futures = [sampler.sample(types.ModelInput.from_ints(p), 8, params) for p in prompts]
            data, rewards = [], []
            for prompt, future in zip(prompts, futures, strict=True):
                group = future.result().sequences
                scores = _rewards(service, key, [tokenizer.decode(s.tokens) for s in group])
                rewards += scores
                mean = sum(scores) / len(scores)
                for seq, score in zip(group, scores, strict=True):
                    tokens = prompt + list(seq.tokens)
                    pad = [0.0] * (len(prompt) - 1)
                    data.append(
                        types.Datum(
                            model_input=types.ModelInput.from_ints(tokens[:-1]),
                            loss_fn_inputs={
                                "target_tokens": tokens[1:],
                                "logprobs": pad + list(seq.logprobs),
                                "advantages": pad + [score - mean] * len(seq.tokens),
                            },
                        )
                    )
            means.append(sum(rewards) / len(rewards))
            mixed = data if any(any(d.loss_fn_inputs["advantages"].tolist()) for d in data) else mixed
            training.forward_backward(data, "importance_sampling").result()
            training.optim_step(types.AdamParams(learning_rate=2e-2)).result()
        print("mean reward per step:", [round(m, 2) for m in means])
        assert sum(means[-3:]) / 3 > sum(means[:3]) / 3 + 0.2, means

        # that batch is off-policy now: gspo's loss over the wire is its formula on the
        # learner's log-probabilities, the sequence ratio over the sampled tokens only
        import torch

        gspo_data = [
            types.Datum(
                model_input=d.model_input,
                loss_fn_inputs={
                    **d.loss_fn_inputs,
                    "sequence_ratio_mask": [float(a != 0) for a in d.loss_fn_inputs["advantages"].tolist()],
                },
            )
            for d in mixed
            if any(d.loss_fn_inputs["advantages"].tolist())
        ]
        out = training.forward(gspo_data, "gspo").result()
        expected = 0.0
        for d, o in zip(gspo_data, out.loss_fn_outputs, strict=True):
            lp = torch.tensor(o["logprobs"].tolist())
            sampled, adv = (torch.tensor(d.loss_fn_inputs[k].tolist()) for k in ("logprobs", "advantages"))
            marked = torch.tensor(d.loss_fn_inputs["sequence_ratio_mask"].tolist()) != 0
            ratio = torch.exp((lp - sampled)[marked].mean())
            expected += float(-torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv).sum())
        assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-4), (out.metrics, expected)

        # the SDK's forward_backward_custom: the loss on the client, its gradient sent back as weights
        custom = training.forward_backward_custom(data[:2], lambda _, lps: ((sum(x.sum() for x in lps)), {}))
        plain = training.forward(data[:2], "importance_sampling").result()  # any loss: its logprobs
        summed = sum(sum(o["logprobs"].tolist()) for o in plain.loss_fn_outputs)
        assert custom.result().metrics["loss:sum"] == pytest.approx(summed, rel=1e-4)
