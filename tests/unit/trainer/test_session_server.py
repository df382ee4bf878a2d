"""A session job's calls (trainer/session_server.py) on the tiny model, in-process, without HTTP:
a resent call runs once, results wait for their call, a failed call fails its future with the reason,
a sampler keeps the weights it was made with, and the token guards the server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.sink import PrintSink
from trainer.session import LoraOptions, TrainingSession
from trainer.session_server import TOKEN_HEADER, SessionService, serve

pytestmark = pytest.mark.slow  # the tiny model

JOB = "01a00000-0000-7000-8000-000000000001"


def forward_backward(tokens: list[int], seq: int, loss: str = "cross_entropy") -> bytes:
    """A ForwardBackwardRequest's bytes, written by the `tinker` SDK's own encoder."""
    from tinker import types
    from tinker.proto.request_conv import forward_backward_request_to_proto

    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    request = types.ForwardBackwardRequest(
        model_id="s:train:0", seq_id=seq, forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn=loss)
    )
    return bytes(forward_backward_request_to_proto(request).SerializeToString())


@pytest.fixture
def service(tiny_model: str, tmp_path: Path) -> Any:
    session = TrainingSession(tiny_model, LoraOptions(rank=4, seed=0))
    svc = SessionService(session, PrintSink(), JOB, "s:train:0", tmp_path / "work", tmp_path / "out", train=True)
    yield svc
    svc.close()


def _grads(svc: SessionService) -> float:
    return float(sum(float(p.grad.abs().sum()) for p in svc.session.params if p.grad is not None))


def test_a_resent_call_runs_once_and_its_result_waits_for_it(service: SessionService) -> None:
    tokens = service.session.tokenizer.encode("12 + 30 = 42")
    first = service.submit("forward_backward", forward_backward(tokens, seq=1))
    again = service.submit("forward_backward", forward_backward(tokens, seq=1))
    assert first == again  # the same future: the gradients are added once
    result = service.retrieve(first["request_id"])
    assert result.content_type == "application/x-protobuf"
    once = _grads(service)
    service.retrieve(service.submit("forward_backward", forward_backward(tokens, seq=2))["request_id"])
    assert _grads(service) == pytest.approx(2 * once)  # a new seq_id is a new call


def test_a_failed_call_fails_its_future_with_the_reason(service: SessionService) -> None:
    tokens = service.session.tokenizer.encode("1 + 1 = 2")
    ids = service.submit("forward_backward", forward_backward(tokens, seq=1, loss="stable_reinforce"))
    answer = json.loads(service.retrieve(ids["request_id"]).body)
    assert answer["category"] == "user" and "stable_reinforce" in answer["error"] and "gspo" in answer["error"], answer
    bad = service.submit("forward_backward", b"\x0a\xff")
    assert "error" in json.loads(service.retrieve(bad["request_id"]).body)
    unknown = json.loads(service.retrieve(f"{JOB}:99", wait=0.1).body)
    assert unknown["category"] == "user"
    step = service.submit("optim_step", json.dumps({"seq_id": 3, "optimizer_params": {"type": "dimuon"}}).encode())
    assert "adamw" in json.loads(service.retrieve(step["request_id"]).body)["error"]
    for seq, name in ((4, ".."), (5, ".")):  # '..' made promote rename the session's folder into itself
        save = service.submit("save_weights", json.dumps({"seq_id": seq, "path": name}).encode())
        answer = json.loads(service.retrieve(save["request_id"]).body)
        assert "is not a save name" in answer["error"] and answer["category"] == "user", answer


def test_a_sampler_keeps_the_weights_it_was_made_with(service: SessionService) -> None:
    tok = service.session.tokenizer
    prompt = {"chunks": [{"tokens": tok.encode("12 + 30 ="), "type": "encoded_text"}]}
    greedy = {"max_tokens": 5, "temperature": 0.0}

    def sample(sampler: str) -> bytes:
        body = {"sampling_session_id": sampler, "prompt": prompt, "sampling_params": greedy, "num_samples": 2}
        ids = service.submit("asample", json.dumps(body).encode())
        assert len(ids["sample_sequence_ids"]) == 2
        return service.retrieve(ids["request_id"]).body

    before = sample(f"{JOB}:sample:0")
    tokens = tok.encode("12 + 30 = 42. 12 + 30 = 42.")
    for seq in range(1, 6):
        service.retrieve(service.submit("forward_backward", forward_backward(tokens, seq))["request_id"])
        step = {"seq_id": 10 + seq, "adam_params": {"learning_rate": 0.05}}
        service.retrieve(service.submit("optim_step", json.dumps(step).encode())["request_id"])
    snapshot = json.loads(
        service.retrieve(service.submit("save_weights_for_sampler", b'{"seq_id": 20}')["request_id"]).body
    )
    after = sample(snapshot["sampling_session_id"])
    assert sample(f"{JOB}:sample:0") == before  # sampler 0 still samples the weights the job started with
    assert after != before  # the snapshot samples the trained ones


def test_the_server_answers_only_its_token(service: SessionService) -> None:
    server = serve(service, "127.0.0.1", "right")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert httpx.post(f"{url}/get_info", headers={TOKEN_HEADER: "wrong"}).status_code == 403
        info = httpx.post(f"{url}/get_info", headers={TOKEN_HEADER: "right"}).json()
        assert info["model_id"] == "s:train:0" and info["lora_rank"] == 4
    finally:
        server.shutdown()


def test_bad_numbers_and_tokens_are_the_callers_error_and_leave_the_session_as_it_was(service: SessionService) -> None:
    """A NaN learning rate (JSON allows it) or beta2 1.0 wrote NaN into every adapter weight; a token
    outside the vocabulary was a 'server' IndexError (on a GPU a device-side assert, for every later
    call); num_samples 10**9 built a billion future ids before its check; a list where a number goes,
    or Infinity, dropped the connection (the API said 503)."""
    tok = service.session.tokenizer
    tokens = tok.encode("12 + 30 = 42")
    service.retrieve(service.submit("forward_backward", forward_backward(tokens, seq=1))["request_id"])
    before = {n: p.detach().clone() for n, p in service.session.model.named_parameters() if p.requires_grad}
    for seq, adam in enumerate(
        ({"learning_rate": float("nan")}, {"beta2": 1.0}, {"eps": 0}, {"learning_rate": -1}, {"learning_rate": [1]}),
        start=2,
    ):
        step = service.submit("optim_step", json.dumps({"seq_id": seq, "adam_params": adam}).encode())
        answer = json.loads(service.retrieve(step["request_id"]).body)
        assert answer["category"] == "user" and f"adam_params.{next(iter(adam))}" in answer["error"], (adam, answer)
    for name, p in service.session.model.named_parameters():
        if name in before:
            assert bool((p == before[name]).all()), name  # no step was taken
    vocab = service.session.model.get_input_embeddings().num_embeddings
    ids = service.submit("forward_backward", forward_backward([*tokens, vocab + 5], seq=9))
    answer = json.loads(service.retrieve(ids["request_id"]).body)
    assert answer["category"] == "user" and f"token {vocab + 5} is not in the model's vocabulary" in answer["error"]
    prompt = {"chunks": [{"tokens": [vocab], "type": "encoded_text"}]}
    ids = service.submit("asample", json.dumps({"prompt": prompt, "sampling_params": {"max_tokens": 2}}).encode())
    answer = json.loads(service.retrieve(ids["request_id"]).body)
    assert answer["category"] == "user" and "prompt: token" in answer["error"], answer
    ok = {"chunks": [{"tokens": tokens, "type": "encoded_text"}]}
    for body, said in (
        ({"prompt": ok, "num_samples": 10**9}, "num_samples"),
        ({"prompt": ok, "num_samples": 0}, "num_samples"),  # issue 69.6: was served as one sample
        ({"prompt": ok, "sampling_params": {"temperature": -1}}, "temperature"),  # was served as greedy
        ({"prompt": ok, "sampling_params": {"top_p": 0}}, "top_p"),
        ({"prompt": ok, "sampling_params": {"max_tokens": 10**9}}, "max_tokens"),
    ):
        with pytest.raises(ValueError, match=said):
            service.submit("asample", json.dumps(body).encode())
    server = serve(service, "127.0.0.1", "right")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        for body in (b'{"prompt": {"chunks": [{"tokens": [1]}]}, "num_samples": [2]}', b'{"seq_id": Infinity}'):
            r = httpx.post(f"{url}/asample", content=body, headers={TOKEN_HEADER: "right"})
            assert r.status_code == 400 and r.json()["category"] == "user", r.text
    finally:
        server.shutdown()


def test_a_sessions_samplers_run_on_the_backend_it_names(tiny_model: str, tmp_path: Path) -> None:
    """Issue 68.3: a session samples through `backend(name).token_sampler(...)`: transformers (`hf`)
    where the worker gave it no warm engine; `vllm` only on the engine it was given, refused without
    one, never sampled on transformers in its place."""
    from evaluator.backends.hf_sampling import HFTokenSampler
    from runtime.errors import NotAvailable

    session = TrainingSession(tiny_model, LoraOptions(rank=4, seed=0))
    svc = SessionService(session, PrintSink(), JOB, "s:train:0", tmp_path / "work", tmp_path / "out", train=True)
    try:
        assert (svc.sampling, type(svc.sampler)) == ("hf", HFTokenSampler)
    finally:
        svc.close()
    with pytest.raises(NotAvailable, match="warm engine, which this session did not get"):
        SessionService(
            session, PrintSink(), JOB, "s:train:0", tmp_path / "w", tmp_path / "o", train=True, sampling="vllm"
        )
