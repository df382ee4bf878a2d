"""The vLLM backend for real, on vLLM's CPU build (in .venv beside TRL, made by scripts/setup):
local evaluation agreeing with the HF backend, and an eval job through a worker that has vLLM."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mathrl.schemas import TERMINAL_STATUSES
from tests.helpers.env import ROOT, data_dir
from tests.helpers.processes import wait_for
from tests.helpers.service import Service

pytestmark = pytest.mark.slow

VLLM_PY = ROOT / ".venv" / "bin" / "python"


@pytest.fixture(scope="module")
def vllm_ready() -> Path:
    import importlib.util

    assert importlib.util.find_spec("vllm") is not None, "no vLLM in .venv: run scripts/setup (scripts/test does)"
    return VLLM_PY


def _eval(python: Path, model: str, backend: str, out: Path) -> list[dict]:
    r = subprocess.run(
        [
            str(python),
            "-m",
            "service.cli",
            "eval",
            "--model",
            model,
            "--benchmark",
            "gsm8k",
            "--limit",
            "6",
            "--backend",
            backend,
            "--max-new-tokens",
            "12",
            "--out",
            str(out),
            "--data-dir",
            data_dir(),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "HOME": str(out), "MATHRL_VLLM__ENFORCE_EAGER": "1"},
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]


def test_vllm_and_hf_give_the_same_greedy_completions(vllm_ready: Path, model_for_vllm: str, tmp_path: Path) -> None:
    vllm_items = _eval(vllm_ready, model_for_vllm, "vllm", tmp_path / "vllm")
    hf_items = _eval(ROOT / ".venv" / "bin" / "python", model_for_vllm, "hf", tmp_path / "hf")
    assert [i["prompt"] for i in vllm_items] == [i["prompt"] for i in hf_items]
    # both run float32 on the CPU: the same greedy text, token for token
    same = sum(a["completion"] == b["completion"] for a, b in zip(vllm_items, hf_items, strict=True))
    assert same == len(hf_items), [
        (a["completion"], b["completion"]) for a, b in zip(vllm_items, hf_items, strict=True)
    ]


def test_the_cpu_head_sizes_are_those_vllms_cpu_kernels_take() -> None:
    """evaluator.backends.vllm.CPU_HEAD_SIZES, held to the installed vLLM's compiled dispatch: each size
    from 8 to 1024 is asked of it (the ISA vLLM's CPU attention picks for float32), as an engine asks."""
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from evaluator.backends.vllm import CPU_HEAD_SIZES, cpu_build

    assert cpu_build()
    current_platform.import_kernels()
    taken = []
    for size in range(8, 1025, 8):
        lens, starts = torch.tensor([1], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
        isa = _get_attn_isa(torch.float32, 128, size)
        try:
            torch.ops._C.get_scheduler_metadata(
                1, 1, 1, size, lens, torch.float32, starts, True, -1, isa, False, None, "auto"
            )
        except RuntimeError as exc:
            assert "Unsupported CPU attention configuration" in str(exc), exc
            continue
        taken.append(size)
    assert tuple(taken) == CPU_HEAD_SIZES


def test_a_warm_engine_that_dies_of_its_model_names_why(
    vllm_ready: Path, tiny_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 66.8 on a real engine: vLLM's CPU build starts an engine of the tiny model (heads 16 wide),
    which dies at its first request; the batch that sent it failed with 'the worker's shared vLLM engine
    exited with code 0'. The job's error now names the engine core's RuntimeError (the worker no longer
    starts such an engine: tests/unit/worker/test_warm_engine.py; this is what a job gets where one dies)."""
    import httpx

    from config.settings import Settings
    from tests.helpers.store import store_with_jobs
    from worker import record, warm_engine
    from worker.attempt import AttemptDir

    monkeypatch.setenv("MATHRL_VLLM__ENFORCE_EAGER", "1")
    settings = Settings()
    url, _, (job_id,) = store_with_jobs(
        tmp_path, {"kind": "generate", "resolved_config": {"kind": "generate"}, "queue": "parked"}
    )
    engine, how = warm_engine.acquire(settings, tiny_model, "auto", [], warm_engine.log_path(tmp_path, job_id), None)
    try:
        assert how == "started"

        def healthy() -> bool:
            try:
                return httpx.get(f"{engine.server.url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                assert engine.server.exited() is None, engine.server.log_tail()
                return False

        wait_for(healthy, 300, what="the engine")
        body = {"model": warm_engine.SERVED_NAME, "prompt": "1 + 1 =", "max_tokens": 2}
        r = httpx.post(f"{engine.server.url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 500, r.text
        wait_for(lambda: engine.server.exited() is not None, 60, what="the engine's exit")
        for shared in (True, False):
            out = tmp_path / str(shared)
            out.mkdir()
            record.report_server_exit(url, job_id, engine.server, out, shared=shared)
            said = AttemptDir(out).read_error() or ""
            assert "RuntimeError: Unsupported CPU attention configuration: head_dim=16" in said, said
            assert "1 + 1 =" not in said and not (shared and tiny_model in said), said
    finally:
        warm_engine.release(engine, settings, keep=False)


def test_eval_job_on_a_worker_with_vllm(vllm_ready: Path, service: Service, model_for_vllm: str) -> None:
    import os
    import signal

    env = dict(service.env)
    proc = subprocess.Popen(
        [str(vllm_ready), "-m", "service.cli", "worker", "--queues", "vllm-test", "--hostname", "vllm@%h"],
        env=env,
        cwd=ROOT,
        stdout=open(service.logs / "worker-vllm.log", "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        from tests.helpers.processes import wait_for

        wait_for(lambda: "ready." in (service.logs / "worker-vllm.log").read_text(), 120, what="the vLLM worker")
        c = service.client()
        # sampled with a seed, and more prompt tokens than one engine step holds: on the CPU a
        # seeded request whose prefill vLLM split killed the engine ("CPU Generator does not use
        # offset"); evaluator.backends.vllm.engine_options turns prefill chunking off there
        job = c.jobs.create(
            {
                "kind": "eval",
                "model": model_for_vllm,
                "benchmark": "gsm8k",
                "limit": 32,
                "backend": "vllm",
                "sampling": {"max_new_tokens": 8, "temperature": 1.0, "n": 4, "seed": 5},
                "resources": {"pool": "vllm-test"},
            }
        )
        assert job.queue == "vllm-test"
        done = c.jobs.wait(job.id, timeout=600)
        assert done.status == "succeeded", done.error
        acc = next(s for s in c.scores.list(job_id=job.id) if s.metric == "accuracy")
        assert acc.backend == "vllm" and acc.backend_version.startswith("vllm-")
        started = next(e for e in c.jobs.events(job.id) if e.type == "vllm_engine")
        assert started.data["reused"] is False

        # the next eval of the model runs on the engine the worker kept warm, with the offline
        # engine's and the HF backend's greedy completions (test above)
        greedy = {"model": model_for_vllm, "benchmark": "gsm8k", "limit": 6, "sampling": {"max_new_tokens": 12}}
        warm = c.jobs.create({"kind": "eval", **greedy, "backend": "vllm", "resources": {"pool": "vllm-test"}})
        hf = c.jobs.create({"kind": "eval", **greedy, "backend": "hf"})
        for j in (warm, hf):
            assert c.jobs.wait(j.id, timeout=600).status == "succeeded", c.jobs.retrieve(j.id).error
        reused = next(e for e in c.jobs.events(warm.id) if e.type == "vllm_engine")
        assert reused.data["reused"] is True and reused.data["pid"] == started.data["pid"], reused
        warm_items, hf_items = c.jobs.results(warm.id), c.jobs.results(hf.id)
        assert [i["completion"] for i in warm_items] == [i["completion"] for i in hf_items]
        assert _group_alive(started.data["pid"])

        # another checkpoint of the same model (same architecture, config and tokenizer, other
        # weights) is loaded into the idle engine instead of starting one, and generates with its
        # own weights: the HF backend's greedy text on it, not the first model's (on plain-text arith
        # prompts, where the two random models write different text; through the chat template both
        # repeat one token)
        from trainer.tiny import build_tiny_model

        other = str(
            build_tiny_model(Path(model_for_vllm).parent / "tiny-seed-4", hidden_size=128, heads=2, chat=True, seed=4)
        )
        arith = {
            "benchmark": "arith",
            "limit": 6,
            "recipe": {"format": "text"},
            "sampling": {"max_new_tokens": 12},
            "backend": "vllm",
        }
        on_vllm = {"resources": {"pool": "vllm-test"}}
        first = c.jobs.create({"kind": "eval", "model": model_for_vllm, **arith, **on_vllm})
        assert c.jobs.wait(first.id, timeout=600).status == "succeeded", c.jobs.retrieve(first.id).error
        reloaded = c.jobs.create({"kind": "eval", "model": other, **arith, **on_vllm})
        hf_other = c.jobs.create({"kind": "eval", "model": other, **arith, "backend": "hf"})
        for j in (reloaded, hf_other):
            assert c.jobs.wait(j.id, timeout=600).status == "succeeded", c.jobs.retrieve(j.id).error
        came = next(e for e in c.jobs.events(reloaded.id) if e.type == "vllm_engine")
        assert came.data["how"] == "reloaded" and came.data["pid"] == started.data["pid"], came
        reloaded_text = [i["completion"] for i in c.jobs.results(reloaded.id)]
        assert reloaded_text == [i["completion"] for i in c.jobs.results(hf_other.id)]
        assert reloaded_text != [i["completion"] for i in c.jobs.results(first.id)]  # the weights really changed
        print(f"checkpoint loaded into the warm engine in {came.data['reload_seconds']:.2f}s")

        # a generate job (what POST /v1/completions submits for an ft: model) answers on the warm
        # engine, streamed as 'delta' events, with the greedy text transformers gives
        prompt = {"kind": "generate", "model": other, "prompt": "12 + 30 =", "max_tokens": 8, "temperature": 0}
        on_engine = c.jobs.create({**prompt, "backend": "vllm", "stream": True, **on_vllm})
        on_hf = c.jobs.create({**prompt, "backend": "hf"})
        for j in (on_engine, on_hf):
            assert c.jobs.wait(j.id, timeout=600).status == "succeeded", c.jobs.retrieve(j.id).error
        served = next(e for e in c.jobs.events(on_engine.id) if e.type == "vllm_engine")
        assert served.data["pid"] == started.data["pid"] and served.data["how"] == "reused", served
        engine_text = c.jobs.samples(on_engine.id)[0].completion
        assert engine_text == c.jobs.samples(on_hf.id)[0].completion
        deltas = [e.data["text"] for e in c.jobs.events(on_engine.id) if e.type == "delta"]
        assert "".join(deltas) == engine_text, (deltas, engine_text)

        # a chat held to a JSON Schema (structured outputs, issue 69.2) answers on the warm engine under
        # its guided decoding: JSON the schema admits, from a model whose free text is never JSON
        from tests.helpers.openai_sdk import VERDICT_FORMAT

        chat = {"kind": "generate", "model": other, "messages": [{"role": "user", "content": "2 + 2 = 4?"}]}
        held = {"max_tokens": 64, "response_format": VERDICT_FORMAT, "backend": "vllm"}
        structured = c.jobs.create({**chat, **held, **on_vllm})
        assert c.jobs.wait(structured.id, timeout=600).status == "succeeded", c.jobs.retrieve(structured.id).error
        served = next(e for e in c.jobs.events(structured.id) if e.type == "vllm_engine")
        assert served.data["how"] == "reused", served
        answer = json.loads(c.jobs.samples(structured.id)[0].completion)
        assert set(answer) == {"verdict", "sure"} and answer["verdict"] in ("yes", "no"), answer

        # a label_model grader's model answers on the warm engine too, as transformers would
        judge = {
            "type": "label_model",
            "name": "judge",
            "model": other,
            "input": [{"role": "user", "content": "Is {{sample.output_text}} right? Say yes or no."}],
            "labels": ["yes", "no"],
            "passing_labels": ["yes"],
            "sampling_params": {"max_completions_tokens": 8},
        }
        grade = {"kind": "grade", "grader": judge, "items": [{"completion": "42"}, {"completion": "41"}]}
        graded_on_engine = c.jobs.create({**grade, "backend": "vllm", **on_vllm})
        graded_on_hf = c.jobs.create({**grade, "backend": "hf"})
        for j in (graded_on_engine, graded_on_hf):
            assert c.jobs.wait(j.id, timeout=600).status == "succeeded", c.jobs.retrieve(j.id).error
        judged = next(e for e in c.jobs.events(graded_on_engine.id) if e.type == "vllm_engine")
        assert judged.data["pid"] == started.data["pid"], judged
        reasons = [s.data["reason"] for s in c.jobs.samples(graded_on_engine.id)]
        assert reasons == [s.data["reason"] for s in c.jobs.samples(graded_on_hf.id)], reasons
        print(f"label_model on the warm engine: {reasons}")

        # projects share the engine, not the prompts it cached: a prompt another project sent is not
        # answered from vLLM's prefix cache (sooner: timing calls would tell one project what another
        # asks), one the same project sent is. The engine's count of them is the job's (OpenAI's
        # usage.prompt_tokens_details.cached_tokens)
        long = {**prompt, "prompt": " ".join(f"{i} + {i} = {2 * i}." for i in range(60)), "max_tokens": 1}
        cached = []
        for client in (c, c, service.client(service.key())):  # this project twice, then another project
            j = client.jobs.create({**long, "backend": "vllm", **on_vllm})
            assert client.jobs.wait(j.id, timeout=600).status == "succeeded", client.jobs.retrieve(j.id).error
            assert (
                next(e for e in client.jobs.events(j.id) if e.type == "vllm_engine").data["pid"] == started.data["pid"]
            )
            cached.append(client.jobs.samples(j.id)[0].data["cached_tokens"])
        print(f"prompt tokens from the prefix cache, of each of the three calls: {cached}")
        assert cached[0] == 0 and cached[1] > 0, cached  # the same project's prompt came from the cache: it is on
        assert cached[2] == 0, cached  # the other project's did not

        # the engine stops with its worker
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        wait_for(lambda: not _group_alive(started.data["pid"]), 30, what="the warm engine to stop with its worker")
        wait_for(
            lambda: _port_free(started.data["url"]), 10, 0.2, "nothing to listen on the server's port"
        )  # an exiting process lets go at once; an orphan never
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)


def test_the_first_chat_after_a_fine_tuning_job_loads_its_model_into_the_kept_engine(
    service: Service, model_for_vllm: str
) -> None:
    """Issue 46.4 through the real `openai` package, as a script moving from OpenAI meets it: a
    fine-tuning job, a chat with its model (on the worker's warm vLLM engine: inference_backend
    'vllm'), a second fine-tuning job on the same worker, and the first chat
    with its model. A training job used to stop the idle engine, so that chat waited for a new one;
    the engine is now held through the CPU job, and the new model's weights are loaded into it."""
    import io
    import time
    import uuid

    from runtime.processes import free_port
    from tests.helpers.openai_sdk import openai_client, wait_fine_tuning

    # an API that answers chats on warm engines (the session's answers them with transformers), on the
    # same database and broker: the session's worker runs the jobs
    api = Service(
        env={**service.env, "MATHRL_FINE_TUNING__INFERENCE_BACKEND": "vllm"},
        logs=service.logs / "chat-after-training",
        port=free_port(),
    )
    api.logs.mkdir(exist_ok=True)
    api.start_api()
    try:
        key = api.key()
        client, jobs = openai_client(api, key, timeout=600), api.client(key).jobs
        rows = [
            {"messages": [{"role": "user", "content": f"{a} + {b} ="}, {"role": "assistant", "content": str(a + b)}]}
            for a, b in ((12, 30), (7, 8), (21, 21), (40, 2))
        ]
        lines = "".join(json.dumps(x) + "\n" for x in rows).encode()
        train = client.files.create(file=("t.jsonl", io.BytesIO(lines)), purpose="fine-tune")

        def fine_tune(seed: int) -> str:
            job = client.fine_tuning.jobs.create(
                model=model_for_vllm, training_file=train.id, seed=seed, suffix=f"s{seed}"
            )
            done = wait_fine_tuning(client, job.id, 600)
            assert done.status == "succeeded" and done.fine_tuned_model, done.error
            return str(done.fine_tuned_model)

        def chat(model: str) -> tuple[float, Any]:
            t0 = time.monotonic()
            out = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "12 + 30 ="}], max_tokens=4
            )
            took = time.monotonic() - t0
            job_id = str(uuid.UUID(out.id.removeprefix("chatcmpl-")))  # the generate job that answered it
            return took, next(e for e in jobs.events(job_id) if e.type == "vllm_engine")

        first = fine_tune(1)
        started_in, engine = chat(first)
        assert engine.data["how"] in ("started", "reloaded", "reused"), engine
        warm_in, _ = chat(first)
        # log-probabilities from the engine itself, chat's shape and the legacy one (greedy: each token
        # the likeliest of its place)
        scored = client.chat.completions.create(
            model=first,
            messages=[{"role": "user", "content": "12 + 30 ="}],
            max_tokens=4,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
        )
        content = scored.choices[0].logprobs.content
        assert content and all(len(t.top_logprobs) == 2 for t in content), content
        assert all(abs(t.logprob - t.top_logprobs[0].logprob) < 1e-3 for t in content), content
        # the content's tokens only: the stop token and special tokens were in it before (issue 69.4)
        assert b"".join(bytes(t.bytes) for t in content).decode() == scored.choices[0].message.content, content
        legacy = client.completions.create(model=first, prompt="12 + 30 =", max_tokens=4, temperature=0, logprobs=1)
        got = legacy.choices[0].logprobs
        assert got.tokens and len(got.tokens) == len(got.token_logprobs) == len(got.top_logprobs), got
        assert "".join(got.tokens) == legacy.choices[0].text, got
        second = fine_tune(2)
        after_in, after = chat(second)
        assert after.data["how"] == "reloaded" and after.data["pid"] == engine.data["pid"], after
        assert after_in < warm_in + 15, (after_in, warm_in)  # seconds more than a warm chat, not an engine start
        print(
            f"chat with a fine-tuned model: first {started_in:.1f} s ({engine.data['how']}), warm {warm_in:.1f} s; "
            f"the first chat after the next fine-tuning job {after_in:.1f} s (weights loaded in "
            f"{after.data['reload_seconds']:.1f} s)"
        )
    finally:
        api.stop_api()


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_grpo_vllm_generates_with_the_updated_weights(mode: str, model_for_vllm: str, tmp_path: Path) -> None:
    """Stale weights are the classic bug here (and on the CPU build, whose linear layers are
    prepacked, TRL's in-place load into the colocated engine used to fail outright). After GRPO
    steps and the trainer's weight sync (colocate: full weights; server: a LoRA adapter loaded by
    the worker's vLLM server), vLLM's greedy text must be the updated HF model's, token for
    token, and must differ from vLLM's text before training on at least one prompt."""
    r = subprocess.run(
        [str(VLLM_PY), str(ROOT / "tests" / "helpers" / "vllm_sync_check.py"), mode, model_for_vllm, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        # colocate runs compiled, as users run it (the weights are loaded into the compiled
        # model); the server eager, as in the rest of the suite (tests/helpers/service.py service_env)
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            **({"MATHRL_VLLM__ENFORCE_EAGER": "1"} if mode == "server" else {}),
        },
    )
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, r.stdout[-2000:] + r.stderr[-4000:]
    out = json.loads(line[7:])
    assert out["after"] == out["hf"], out
    if mode == "colocate":
        # Equal greedy text is not enough: a tied LM head that kept its packed copy of the old
        # embedding left the text equal here and moved the tokens' log-probabilities by up to 0.34
        # (vLLM samples, and TRL's importance-sampling correction weighs, with those). Both sides
        # float32 on the CPU: 4.8e-7 measured with the head packed again; tolerance 1e-3.
        worst = max(
            abs(a - b)
            for v, h in zip(out["vllm_logprobs"], out["hf_logprobs"], strict=True)
            for a, b in zip(v, h, strict=True)
        )
        assert worst < 1e-3, f"vLLM's log-probabilities are not the updated model's (worst {worst:.3g})"
        # the jobs' loop takes the importance ratio from the training forward instead of TRL's extra
        # no-grad pass: on the same batch, the two give the same log-probabilities and ratios
        reuse = out["reuse"]
        assert reuse["logp_diff"] < 1e-5 and reuse["ratio_diff"] < 1e-5, reuse
        assert reuse["ratio_mean"] > 0, reuse  # a ratio that masks everything would compare equal too
    assert any(a != b for a, b in zip(out["after"], out["before"], strict=True)), (
        "the engine still generates the initial model's text"
    )
    assert out["timings"]["weight_sync_seconds"] > 0 and out["timings"]["generation_seconds"] > 0, out["timings"]


def test_grpo_job_generates_with_vllm_through_the_service(service: Service, model_for_vllm: str) -> None:
    """A GRPO job with generation.backend='vllm' on the CPU queue: the worker's job process runs
    the colocated engine, records which backend ran, and stores the per-step timing metrics."""
    c = service.client()
    job = c.jobs.create(
        {
            "kind": "grpo",
            "model": model_for_vllm,
            "dataset": {"name": "arith-train", "limit": 64},
            "max_steps": 2,
            "learning_rate": 1e-4,
            "num_generations": 4,
            "per_device_train_batch_size": 8,
            "max_completion_length": 6,
            "generation": {"backend": "vllm"},
            "logging_steps": 1,
            "save_steps": 100,
            "eval": {"benchmark": "arith", "limit": 8, "every": 1, "max_new_tokens": 6},
        }
    )
    assert job.resolved_config["generation_backend"] == "vllm"
    done = c.jobs.wait(job.id, timeout=900)
    assert done.status == "succeeded", done.error
    gen = next(e for e in c.jobs.events(job.id) if e.type == "generation")
    assert gen.data["backend"] == "vllm" and gen.data["version"].startswith("vllm-0.31"), gen
    assert gen.data["engine_options"]["dtype"] == "float32"
    metrics = {m.name: [p.value for p in m.points] for m in c.jobs.metrics(job.id)}
    for name in ("generation_seconds", "weight_sync_seconds", "training_seconds", "generation_tokens_per_second"):
        assert len(metrics[name]) == 2 and all(v >= 0 for v in metrics[name]), (name, metrics.get(name))
    assert metrics["weight_sync_seconds"][1] > 0  # step 2 generated with step 1's weights: a sync ran
    assert all(0 < v < 1 for v in metrics["generation_share"]), metrics["generation_share"]
    # held-out scoring every step on the engine that already holds the policy: no second engine
    held = [e for e in c.jobs.events(job.id) if e.type == "heldout"]
    assert [e.data["step"] for e in held] == [1, 2], held
    assert all(e.data["backend"] == "the colocated vLLM engine" and e.data["n"] == 8 for e in held), held
    assert len(metrics["heldout/accuracy"]) == 2


def test_reward_model_job_samples_with_vllm(service: Service, model_for_vllm: str) -> None:
    """A process RM job with backend 'vllm': the policy's solutions and the per-step rollouts come
    from vLLM's engine, and the scores say so."""
    c = service.client()
    rm = c.jobs.create(
        {
            "kind": "reward_model",
            "type": "process",
            "model": model_for_vllm,
            "dataset": {"name": "arith-train", "limit": 8},
            "samples_per_question": 4,
            "completions_per_step": 2,
            "backend": "vllm",
            "sampling": {"temperature": 1.0, "max_new_tokens": 6, "n": 4},
            "num_train_epochs": 1,
            "per_device_train_batch_size": 8,
            "max_length": 32,
            "heldout_fraction": 0.25,
        }
    )
    done = c.jobs.wait(rm.id, timeout=600)
    assert done.status == "succeeded", done.error
    sampling = next(e for e in c.jobs.events(rm.id) if e.type == "sampling" and e.data)
    assert sampling.data["backend"] == "vllm" and sampling.data["version"].startswith("vllm-0.31"), sampling
    scored = next(e for e in c.jobs.events(rm.id) if e.type == "scored")  # pairwise: a number, or null with no pairs
    assert scored.data["pairwise_accuracy"] is None or 0 <= scored.data["pairwise_accuracy"] <= 1, scored
    scores = c.scores.list(job_id=rm.id)
    assert scores and all(s.backend == "vllm" and s.backend_version.startswith("vllm-") for s in scores), scores


def _server_spec(model: str, **over: Any) -> dict[str, Any]:
    return {
        "kind": "grpo",
        "model": model,
        "dataset": {"name": "arith-train", "limit": 4000},
        "max_steps": 2,
        "learning_rate": 1e-3,
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_completion_length": 6,
        "lora": {"r": 8},
        "generation": {"backend": "vllm", "mode": "server"},
        "logging_steps": 1,
        "save_steps": 100,
        **over,
    }


def _group_alive(pgid: int) -> list[int]:
    """Processes still in process group `pgid` (the server's: it leads its own)."""
    alive = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                alive.append(int(d.name))
    return alive


def _port_free(url: str) -> bool:
    """Nothing listens on the server's port any more (no orphan of the server kept its socket). Read
    from /proc/net/tcp*, not by binding: a bind also fails while some other process's outgoing
    connection happens to use that number as its ephemeral port (seen once in a suite run)."""
    port = int(url.rsplit(":", 1)[1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                return False
    return True


def test_grpo_job_in_server_mode_syncs_lora_to_the_workers_vllm_server(
    service: Service, model_for_vllm: str, tmp_path: Path
) -> None:
    """Server mode end to end: the worker starts a vLLM server for the job on a free port, the
    trainer syncs its LoRA adapter to it every step, and the server is gone when the job ends.
    Then the adapter it saved is served by the worker's warm engine of its base."""
    c = service.client()
    job = c.jobs.create(_server_spec(model_for_vllm, save_steps=1))  # a checkpoint is an adapter directory
    assert job.resolved_config["generation_mode"] == "server"
    done = c.jobs.wait(job.id, timeout=900)
    assert done.status == "succeeded", done.error
    events = c.jobs.events(job.id)
    started = next(e for e in events if e.type == "vllm_server")
    assert started.data["url"].startswith("http://127.0.0.1:") and not started.data["url"].endswith(":8000")
    gen = next(e for e in events if e.type == "generation")
    assert gen.data["mode"] == "server" and "LoRA adapter" in gen.message, gen
    metrics = {m.name: [p.value for p in m.points] for m in c.jobs.metrics(job.id)}
    assert metrics["weight_sync_seconds"][1] > 0 and len(metrics["generation_seconds"]) == 2, metrics
    wait_for(lambda: not _group_alive(started.data["pid"]), 30, what="the job's vLLM server to stop")
    wait_for(
        lambda: _port_free(started.data["url"]), 10, 0.2, "nothing to listen on the server's port"
    )  # an exiting process lets go at once; an orphan never

    # the adapter of its last checkpoint (what an ft: model's checkpoint names), made loud (lora_B random, so its text
    # is not the base's), answers on the worker's warm engine of its base model, started with LoRA
    # on, with the greedy text transformers + peft give; the base then runs on the same engine
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    last = max((cp for cp in c.jobs.checkpoints(job.id) if cp.kind == "checkpoint"), key=lambda cp: cp.step)
    loud = tmp_path / "loud-adapter"
    shutil.copytree(last.uri, loud)
    weights = load_file(loud / "adapter_model.safetensors")
    g = torch.Generator().manual_seed(0)
    loud_b = {k: torch.randn(v.shape, generator=g) * 0.05 for k, v in weights.items() if "lora_B" in k}
    save_file({**weights, **loud_b}, loud / "adapter_model.safetensors")
    prompt = {"kind": "generate", "model": str(loud), "prompt": "12 + 30 =", "max_tokens": 8, "temperature": 0}
    on_engine = c.jobs.create({**prompt, "backend": "vllm"})
    base = c.jobs.create({**prompt, "model": model_for_vllm, "backend": "vllm"})
    on_hf = c.jobs.create({**prompt, "backend": "hf"})  # a CPU job off the engine: the idle engine is held through it
    for j in (on_engine, base, on_hf):
        assert c.jobs.wait(j.id, timeout=600).status == "succeeded", c.jobs.retrieve(j.id).error
    served = next(e for e in c.jobs.events(on_engine.id) if e.type == "vllm_engine")
    assert served.data["adapter"] == str(loud) and "LoRA adapters of" in served.message, served
    again = next(e for e in c.jobs.events(base.id) if e.type == "vllm_engine")
    assert again.data["pid"] == served.data["pid"] and again.data["how"] == "reused", again
    text = {j.id: c.jobs.samples(j.id)[0].completion for j in (on_engine, on_hf, base)}
    assert text[on_engine.id] == text[on_hf.id] != text[base.id], text
    print(f"LoRA adapter on the warm engine: {text[on_engine.id]!r}; its base: {text[base.id]!r}")
    _tinker_session_samples_on_the_warm_engine(service, model_for_vllm, text[base.id])


def _tinker_session_samples_on_the_warm_engine(service: Service, model: str, base_text: str) -> None:
    """Issue 47: a Tinker session of that base model on this worker (the engine idle, LoRA on)
    samples on the warm engine, each sampler loaded as an adapter: a new adapter gives the base's
    text, and a trained sampler's greedy text is what transformers + peft give for the same save."""
    import os

    import tinker
    from tinker import types

    os.environ.setdefault("TINKER_TELEMETRY", "0")
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    key = service.key()
    c = service.client(key)
    with tinker.ServiceClient(base_url=service.url, api_key=f"tml-{key}") as client:
        training = client.create_lora_training_client(base_model=model, rank=8, seed=0, train_unembed=False).result()
        tok = training.get_tokenizer()
        prompt = types.ModelInput.from_ints(tok.encode("12 + 30 ="))
        greedy = types.SamplingParams(max_tokens=8, temperature=0.0)
        fresh = training.save_weights_and_get_sampling_client().result()
        first = fresh.sample(prompt, 2, greedy).result()
        assert {tok.decode(s.tokens, skip_special_tokens=True) for s in first.sequences} == {base_text}, first
        assert all(len(s.logprobs) == len(s.tokens) and max(s.logprobs) <= 0 for s in first.sequences)
        prompt_lp = fresh.compute_logprobs(prompt).result()
        assert len(prompt_lp) == prompt.length and prompt_lp[0] is None and all(v < 0 for v in prompt_lp[1:])

        tokens = tok.encode("12 + 30 = 42 42 42 42 42 42 42")
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
        )
        for _ in range(8):
            training.forward_backward([datum], "cross_entropy").result()
            training.optim_step(types.AdamParams(learning_rate=3e-2)).result()
        path = training.save_weights_for_sampler("warm").result().path
        trained = client.create_sampling_client(model_path=path).sample(prompt, 1, greedy).result()
        on_engine = tok.decode(trained.sequences[0].tokens, skip_special_tokens=True)
        job = next(j for j in c.jobs.list(kind="session") if j.name == training.model_id)
    events = c.jobs.events(job.id)
    came = next(e for e in events if e.type == "vllm_engine")
    assert came.data["how"] in ("reused", "reloaded") and "up to rank 8" in came.message, came
    sampling = [e for e in events if e.type == "sampling"]
    assert [e.data["backend"] for e in sampling] == ["vllm"], sampling  # and it never fell back
    step = max(cp.step for cp in c.jobs.checkpoints(job.id))
    hf = c.jobs.create({"kind": "generate", "model": f"job:{job.id}@step-{step}", "prompt": "12 + 30 =",
                        "max_tokens": 8, "temperature": 0, "backend": "hf"})  # fmt: skip
    assert c.jobs.wait(hf.id, timeout=300).status == "succeeded", c.jobs.retrieve(hf.id).error
    on_hf = c.jobs.samples(hf.id)[0].completion
    print(f"Tinker sampler on the warm engine: {on_engine!r}; transformers on its save: {on_hf!r}; base {base_text!r}")
    assert on_engine == on_hf != base_text


def test_worker_killed_mid_job_takes_its_vllm_server_with_it(service: Service, model_for_vllm: str) -> None:
    """kill -9 of the worker (as when a node dies): the job's vLLM server and everything in its
    process group die with it, and its port is free again."""
    import os
    import signal

    # what this drill tests is the process group, not the lease: a lease of its own, longer than the
    # tests' 4 s, which a worker starved of CPU by a starting server and a trainer on 2 cores could let
    # lapse (the job, max_attempts 1, would then fail before its first step)
    lease = {"MATHRL_WORKER__LEASE_SECONDS": "30", "MATHRL_WORKER__HEARTBEAT_SECONDS": "2"}
    worker = service.start_worker(queues="vllm-drill", name="vllm-drill", env=lease)
    c = service.client()
    job = c.jobs.create(
        _server_spec(model_for_vllm, max_steps=100000, resources={"pool": "vllm-drill"}, max_attempts=1)
    )
    try:
        started = wait_for(
            lambda: next((e for e in c.jobs.events(job.id) if e.type == "vllm_server"), None),
            120,
            what="the vLLM server to start",
        )

        def first_step() -> Any:
            job_now = c.jobs.retrieve(job.id)  # a job that ended fails here with its error, not after the wait
            assert job_now.status not in TERMINAL_STATUSES, (job_now.status, job_now.error)
            return c.jobs.metrics(job.id)

        wait_for(first_step, 600, 1.0, "a training step (server up, adapter synced)")
        assert _group_alive(started.data["pid"])
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        service.workers.remove(worker)
        wait_for(lambda: not _group_alive(started.data["pid"]), 30, what="the orphaned vLLM server to die")
        wait_for(
            lambda: _port_free(started.data["url"]), 10, 0.2, "nothing to listen on the server's port"
        )  # an exiting process lets go at once; an orphan never
    finally:
        c.jobs.cancel(job.id)


def test_async_grpo_job_trains_on_samples_no_staler_than_max_staleness(service: Service, model_for_vllm: str) -> None:
    """algorithm: async (experimental) on CPU: TRL's AsyncGRPOTrainer with its rollout worker on
    the job's vLLM server, LoRA adapters synced by name, staleness recorded and bounded."""
    c = service.client()
    job = c.jobs.create(_server_spec(model_for_vllm, algorithm="async", max_staleness=1, max_steps=3))
    done = c.jobs.wait(job.id, timeout=900)
    assert done.status == "succeeded", done.error
    gen = next(e for e in c.jobs.events(job.id) if e.type == "generation")
    assert gen.data["algorithm"] == "async" and gen.data["max_staleness"] == 1, gen
    metrics = {m.name: [p.value for p in m.points] for m in c.jobs.metrics(job.id)}
    assert metrics["sample/staleness_max"] and max(metrics["sample/staleness_max"]) <= 1, metrics
    assert len(metrics["loss"]) == 3


def test_grpo_with_the_python_tool_on_the_colocated_engine(tmp_path: Path) -> None:
    """The tool's rollouts on vLLM (trainer/tool_grpo.py): a taught tiny Llama's turn stops at the
    call, the sandbox's output comes back as tokens the loss leaves out, the sampler's
    log-probabilities cover every token, and the answer after the output is graded."""
    r = subprocess.run(
        [str(VLLM_PY), str(ROOT / "tests" / "helpers" / "tool_grpo_vllm.py"), str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MATHRL_VLLM__ENFORCE_EAGER": "1"},
    )
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, r.stdout[-2000:] + r.stderr[-4000:]
    out = json.loads(line[7:])
    m = out["metrics"]
    assert out["backend"] == "vllm" and all(out["logprobs"]), out
    assert m["tool/calls_per_rollout"] >= 1.0 and m["tool/call_errors"] == 0.0, m
    # each rollout's masked tokens are exactly what the sandbox printed, after the model's ```output
    assert sorted(set(out["tool_texts"])) == ["\n1023\n```\n", "\n391\n```\n", "\n66\n```\n"], out["tool_texts"]
    assert m["rewards/accuracy/mean"] > 0 and m["tool_share"] > 0, m
    # the held-out answers on the colocated engine called the tool too, each turn within its length
    held = out["heldout"]
    assert held and held["backend"] == "the colocated vLLM engine, with the tool" and held["heldout/reward"] > 0, held
