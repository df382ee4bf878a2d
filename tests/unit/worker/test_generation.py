"""GRPO generation pieces that need no model: the vLLM server's command line and GPU split, and
the CPU stand-in for TRL's FlashAttention-3 tree attention (async GRPO)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinds import resolve_config
from mathrl.specs import parse_spec
from mathrl.specs.resolved import ResolvedGRPO

pytestmark = pytest.mark.quick

BASE = {
    "kind": "grpo",
    "model": "/models/m",
    "dataset": {"name": "gsm8k-train"},
    "max_completion_length": 64,
    "max_prompt_length": 128,
}


def test_server_command_for_a_lora_job_on_cpu() -> None:
    from worker.vllm_server import server_command

    spec = parse_spec({**BASE, "lora": {"r": 4}, "generation": {"backend": "vllm", "mode": "server"}})
    cmd = server_command(spec, resolve_config(spec), "/models/m", 41234, on_gpu=False)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    flag = lambda name: cmd[cmd.index(name) + 1]  # noqa: E731
    assert flag("--port") == "41234" and flag("--host") == "127.0.0.1"
    assert "--enable-lora" in cmd and flag("--max-lora-rank") == "8"  # r=4 served under vLLM's smallest rank >= 4
    assert flag("--max-model-len") == "192" and flag("--dtype") == "float32"
    assert "--kv-cache-memory-bytes" in cmd and "--gpu-memory-utilization" not in cmd
    # seeded requests (TRL's async rollouts seed each one) must never have their prefill split on a CPU
    assert "--no-enable-chunked-prefill" in cmd
    assert int(cmd[cmd.index("--max-num-batched-tokens") + 1]) >= int(cmd[cmd.index("--max-model-len") + 1])


def test_the_servers_follow_the_eager_setting_as_every_engine_does(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from evaluator.backends import EngineSettings
    from worker.vllm_server import server_command

    monkeypatch.setenv("CXX", sys.executable)  # a compiler to find: without one a CPU engine runs eager anyway

    lora = parse_spec({**BASE, "lora": {"r": 4}, "generation": {"backend": "vllm", "mode": "server"}})
    full = parse_spec({**BASE, "resources": {"gpus": 2}, "generation": {"mode": "server"}})
    assert "--enforce-eager" not in server_command(lora, resolve_config(lora), "/m", 5, on_gpu=False)
    assert "--enforce_eager" not in server_command(full, resolve_config(full), "/m", 5, on_gpu=True)
    eager = EngineSettings(enforce_eager=True)
    assert "--enforce-eager" in server_command(lora, resolve_config(lora), "/m", 5, on_gpu=False, engine=eager)
    cmd = server_command(full, resolve_config(full), "/m", 5, on_gpu=True, engine=eager)
    assert cmd[cmd.index("--enforce_eager") + 1] == "true"


def test_server_takes_the_jobs_last_gpus_and_full_weights_use_trls_server() -> None:
    from worker.vllm_server import server_command, split_gpus

    spec = parse_spec({**BASE, "resources": {"gpus": 8}, "generation": {"mode": "server"}})
    assert split_gpus(spec, [str(i) for i in range(8)]) == (["0", "1", "2", "3", "4", "5"], ["6", "7"])
    assert resolve_config(spec).of(ResolvedGRPO).world_size == 6
    cmd = server_command(spec, resolve_config(spec), "/models/m", 5, on_gpu=True)
    assert cmd[1:3] == ["-m", "trl.scripts.vllm_serve"] and cmd[cmd.index("--tensor_parallel_size") + 1] == "2"
    three = parse_spec({**BASE, "resources": {"gpus": 4}, "generation": {"mode": "server", "server_gpus": 3}})
    assert split_gpus(three, ["a", "b", "c", "d", "e"]) == (["a"], ["b", "c", "d"])


def test_varlen_causal_attention_matches_attention_per_sample() -> None:
    """Two packed segments with different query and key lengths (a segment that continues a
    shared prefix sees the prefix's keys): each equals causal attention over its own path."""
    import torch
    import torch.nn.functional as F

    from trainer.async_grpo import varlen_causal_attention

    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 8
    k = torch.randn(7, kv_heads, dim)
    v = torch.randn(7, kv_heads, dim)
    # segment 0: queries 0..2 over keys 0..2; segment 1: queries 3..6 continue the prefix keys 0..1
    q = torch.randn(7, heads, dim)
    kv_index = torch.tensor([0, 1, 2, 0, 1, 3, 4, 5, 6])
    out = varlen_causal_attention(
        q,
        k.index_select(0, kv_index),
        v.index_select(0, kv_index),
        torch.tensor([0, 3, 7]),
        torch.tensor([0, 3, 9]),
        4,
        6,
        softmax_scale=dim**-0.5,
    )

    def reference(qs: torch.Tensor, path: list[int]) -> torch.Tensor:
        kk = k[path].transpose(0, 1).repeat_interleave(2, 0)
        vv = v[path].transpose(0, 1).repeat_interleave(2, 0)
        full_q = torch.zeros(len(path), heads, dim)
        full_q[len(path) - len(qs) :] = qs
        res = F.scaled_dot_product_attention(full_q.transpose(0, 1), kk, vv, is_causal=True)
        return res.transpose(0, 1)[len(path) - len(qs) :]

    torch.testing.assert_close(out[:3], reference(q[:3], [0, 1, 2]))
    torch.testing.assert_close(out[3:], reference(q[3:], [0, 1, 3, 4, 5, 6]))


def _wait_forever(event: object) -> None:
    event.wait()  # type: ignore[attr-defined]


def test_async_rollout_worker_stop_returns_when_its_child_died() -> None:
    """A rollout child that dies while waiting on TRL's stop event (a reward raised in it) made
    AsyncRolloutWorker.stop hang forever in Event.set, so a failed async job never ended."""
    import multiprocessing as mp
    import os
    import signal
    import threading
    import time

    from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

    from trainer.async_grpo import _stop_without_hanging

    ctx = mp.get_context("spawn")
    worker = AsyncRolloutWorker.__new__(AsyncRolloutWorker)
    worker._stop_event_mp = ctx.Event()
    worker._process = ctx.Process(target=_wait_forever, args=(worker._stop_event_mp,), daemon=True)
    worker._process.start()
    time.sleep(2.0)  # the child is waiting on the event
    os.kill(worker._process.pid, signal.SIGKILL)
    worker._process.join(10)
    _stop_without_hanging()
    done = threading.Event()
    threading.Thread(target=lambda: (worker.stop(), done.set()), daemon=True).start()
    assert done.wait(20), "AsyncRolloutWorker.stop hung on a dead child"
    assert worker._process is None


@pytest.mark.quick
def test_a_servers_environment_keeps_every_core_on_a_small_cpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's CPU build reserves a core for its scheduler by default: on 2 cores the warm eval engine
    generated on one (147 s for 100 GSM8K items vs 82 s on both), because the setting reached this
    process only after the server's environment had been copied. It is in the server's environment
    itself now, whatever ran before; an operator's own value wins."""
    import os

    from worker.vllm_server import server_env

    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert server_env()["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert server_env()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the engine in the server's process
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in os.environ  # nothing set behind the caller's back
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in server_env()  # a big machine keeps vLLM's default
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in server_env()
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "2")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert server_env()["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "2"  # an operator's own values win
    assert server_env()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_vllm_on_a_cpu_without_a_cxx_compiler_runs_eager(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """torch.compile's CPU backend needs a C++ compiler; the worker-cpu image has none, and an
    engine that tried to compile there failed to start ("No working C++ compiler found")."""
    from evaluator.backends import vllm

    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert vllm.cxx_compiler() is None
    assert vllm.engine_options("auto")["enforce_eager"] is True
    gxx = tmp_path / "g++"
    gxx.write_text("#!/bin/sh\n")
    gxx.chmod(0o755)
    assert vllm.cxx_compiler() == str(gxx)
    assert "enforce_eager" not in vllm.engine_options("auto")


def test_the_backends_a_spec_accepts_are_the_registered_ones() -> None:
    """Adding a backend is its entry in the SDK's registry (mathrl/backends.py: the specs' choices,
    the resolved config, the trainer read it) and its implementation under evaluator/backends/ in
    BACKENDS (mathrl/ cannot import the evaluator): the two must hold the same names."""
    from typing import get_args

    from evaluator.backends import BACKENDS, VLLM, Backend, backend
    from mathrl.backends import GENERATION_BACKENDS
    from mathrl.specs import EvalSpec, GenerationBackend
    from mathrl.specs.resolved import ResolvedGRPO

    assert set(GENERATION_BACKENDS) == set(BACKENDS) == set(get_args(GenerationBackend))
    assert {n for n, info in GENERATION_BACKENDS.items() if info.vllm} == {n for n, c in BACKENDS.items() if c is VLLM}
    assert EvalSpec.model_json_schema()["properties"]["backend"]["enum"] == list(GENERATION_BACKENDS)
    assert get_args(ResolvedGRPO.model_fields["generation_backend"].annotation) == tuple(GENERATION_BACKENDS)
    for name, cls in BACKENDS.items():
        assert issubclass(cls, Backend) and cls.name == name
    with pytest.raises(ValueError, match="unknown generation backend 'vlm'. Did you mean 'vllm'"):
        backend("vlm")


def test_engine_settings_reach_every_engine_as_arguments(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The operator's MATHRL_VLLM__* settings are read once, by the service's settings, and given to
    the evaluator and trainer as arguments; a job's warm engine comes from its supervisor's env."""
    from config.settings import Settings
    from evaluator.backends import vllm
    from worker.warm_engine import ENGINE_ADAPTER_ENV, ENGINE_SALT_ENV, ENGINE_URL_ENV, cache_salt, given_engine

    monkeypatch.setenv("MATHRL_VLLM__ENFORCE_EAGER", "1")
    monkeypatch.setenv("MATHRL_VLLM__CPU_KV_GIB", "0.5")
    monkeypatch.setenv("MATHRL_WORKER__WARM_ENGINE_START_SECONDS", "30")
    settings = Settings()
    engine = settings.vllm.engine()
    assert (engine.enforce_eager, engine.cpu_kv_gib, engine.memory_fraction) == (True, 0.5, 0.9)
    monkeypatch.setenv("PATH", str(tmp_path))  # no C++ compiler: eager either way; shown by the default below
    opts = vllm.engine_options("auto", settings=engine)
    assert opts["enforce_eager"] is True and opts["kv_cache_memory_bytes"] == 2**29
    assert vllm.engine_options("auto")["kv_cache_memory_bytes"] == 2 * 2**30  # no settings: the defaults
    assert given_engine(settings, {}) is None
    warm = given_engine(settings, {ENGINE_URL_ENV: "http://127.0.0.1:5", ENGINE_ADAPTER_ENV: "/a"})
    assert warm is not None and (warm.url, warm.adapter, warm.start_seconds) == ("http://127.0.0.1:5", "/a", 30.0)
    salted = given_engine(settings, {ENGINE_URL_ENV: "http://127.0.0.1:5", ENGINE_SALT_ENV: cache_salt("p1")})
    assert salted is not None and salted.cache_salt == cache_salt("p1") != cache_salt("p2") and warm.cache_salt is None


def test_a_dead_servers_error_names_its_exception_not_the_noise_printed_at_exit() -> None:
    """A vLLM server that died of an unsupported model printed its RuntimeError, then its shutdown
    and hundreds of triton 'leaked function' lines: the job's error showed only those."""
    from worker.vllm_server import error_tail

    log = "\n".join(
        [
            "INFO starting",
            "Traceback (most recent call last):",
            '  File "cpu_attn.py", line 257, in build',
            "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0",
            *[f"(APIServer pid=7) INFO [shutdown] step {i}" for i in range(20)],
            "nanobind: leaked 514 functions!",
            *[f' - leaked function "create_{i}"' for i in range(300)],
            " - ... skipped remainder",
            "nanobind: this is likely caused by a reference counting issue in the binding code.",
            "See https://nanobind.readthedocs.io/en/latest/refleaks.html",
        ]
    )
    tail = error_tail(log, 600)
    assert tail.startswith("RuntimeError: Unsupported CPU attention configuration: head_dim=16"), tail
    assert "leaked" not in tail and "nanobind" not in tail and "step 19" in tail
    assert len(tail) <= 600 + 10
    assert error_tail("INFO one\nINFO two", 600) == "INFO one\nINFO two"  # nothing to add where no error


# what vLLM 0.31's server logged when its engine died of the tiny model (head_dim 16) at its first
# request, cut down: the engine core's fatal error, then the API server's own errors about the request
CORE, API = "(EngineCore pid=7678) ERROR 12-01 23:42:58 [core.py:1435] ", "(APIServer pid=7524) ERROR 12-01 23:42:58 "
DIED_AT_A_REQUEST = [
    "(APIServer pid=7524) INFO 12-01 23:41:57 [api_utils.py:286] non-default args: {'model': '/models/tiny'}",
    "INFO:     Application startup complete.",
    f"{API}[serving.py:90] ValueError: the prompt 'what is the secret of project a?' is too long",
    f"{CORE}EngineCore encountered a fatal error.",
    f"{CORE}Traceback (most recent call last):",
    f'{CORE}  File "vllm/v1/attention/backends/cpu_attn.py", line 257, in build',
    f"{CORE}RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0",
    f"{API}[async_llm.py:871] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause.",
    f"{API}[vllm_error.py:54] Engine Exception caught. Request id: cmpl-b75de0409f7bbb4f",
    "(APIServer pid=7524) INFO 12-01 23:42:58 [core_client.py:766] [shutdown] MPClient: engine manager stopped",
]


def test_an_engines_reason_is_its_exception_and_a_shared_one_gives_no_requests_text() -> None:
    """Issue 66.8: a batch on a model vLLM's CPU build cannot run failed with 'the worker's shared vLLM
    engine exited with code 0', and a job's own server's error did not name the RuntimeError either:
    vLLM's lines carry its logger's prefix, which the old pattern did not allow for."""
    from worker.vllm_server import engine_reason, error_tail

    died = "\n".join(DIED_AT_A_REQUEST)
    head_dim = "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"
    assert engine_reason(died) == head_dim  # the EngineDeadError after it points back at it
    assert error_tail(died, 200).startswith(head_dim + "\n...")
    # a warm engine served other projects: of what it logged while serving, only the engine core's
    # fatal error, quoted values left out; never the API server's lines about a request
    assert engine_reason(died, shared=True) == head_dim
    request_error = "\n".join(DIED_AT_A_REQUEST[:3])
    assert engine_reason(request_error) is not None and engine_reason(request_error, shared=True) is None
    quoted = died.replace("kv_cache_idx=0", "kv_cache_idx=0 for 'a prompt'")
    assert engine_reason(quoted, shared=True) == head_dim + " for '...'"
    # one that never came up served no one: its whole log is the job's, pydantic's message line included
    failed_start = "\n".join(
        [
            "(APIServer pid=9) INFO 12-01 23:47:09 [api_utils.py:286] non-default args: {'model': '/models/bad'}",
            "Traceback (most recent call last):",
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
            "  Value error, Model architectures ['FooForCausalLM'] are not supported for now.",
            "    For further information visit https://errors.pydantic.dev/2.14/v/value_error",
        ]
    )
    reason = "ValidationError: 1 validation error for ModelConfig Value error, Model architectures ['FooForCausalLM']"
    assert reason in (engine_reason(failed_start, shared=True) or "")
    assert engine_reason("INFO one\nWARNING two: `OSError: [Errno 24] Too many open files`") is None


def test_a_models_head_size_is_read_off_its_config_as_vllm_reads_it(tmp_path: Path) -> None:
    """vLLM's CPU build runs heads of CPU_HEAD_SIZES only; the tests' tiny model (64 wide, 4 heads) has
    16 and a 'tiny:2x64' ref the same (tests/system/test_vllm.py holds the sizes to the library's)."""
    import json

    from evaluator.backends.vllm import cpu_refusal, head_size
    from mathrl.modelref import tiny_shape
    from trainer.memory_plan import read_model_config

    qwen2 = {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4}
    (tmp_path / "config.json").write_text(json.dumps(qwen2))
    config = read_model_config(tmp_path)
    assert config is not None and head_size(config) == 16
    said = cpu_refusal(config) or ""
    assert said.startswith("vLLM's CPU build cannot run this model: its attention heads are 16 wide"), said
    assert "32, 48, 64" in said
    assert head_size({**qwen2, "head_dim": 64}) == 64 and cpu_refusal({**qwen2, "head_dim": 64}) is None
    assert head_size({"text_config": {"hidden_size": 2048, "num_attention_heads": 16}}) == 128  # a VLM's
    assert head_size({"n_embd": 768, "n_head": 12}) == 64  # GPT-2's names
    assert head_size({"kv_lora_rank": 512, "hidden_size": 64, "num_attention_heads": 4}) is None  # MLA: not told
    assert head_size({}) is None and cpu_refusal(None) is None and cpu_refusal({}) is None
    assert cpu_refusal(tiny_shape("tiny:2x64")) is not None and cpu_refusal(tiny_shape("tiny:2x128")) is None
    assert tiny_shape("org/model") is None


def test_a_cpu_job_naming_vllm_for_a_model_it_cannot_run_is_refused_at_submit(tmp_path: Path) -> None:
    """Where the API can read the model's shape, a CPU job that names vLLM for it is refused at the
    field that names it; 'auto' and 'hf' are admitted (the worker answers 'auto' on transformers)."""
    import json

    from api.admission import admit_spec
    from api.problems import Problem
    from config.settings import Settings

    settings = Settings(artifact_dir=str(tmp_path / "artifacts"), sources={"model_roots": [str(tmp_path)]})  # type: ignore[call-arg, arg-type]
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "config.json").write_text(json.dumps({"hidden_size": 128, "num_attention_heads": 2}))
    cases = [
        ({"kind": "eval", "model": str(tiny), "benchmark": "gsm8k", "backend": "vllm"}, "/backend"),
        ({"kind": "generate", "model": str(tiny), "prompt": "1 + 1 =", "backend": "vllm"}, "/backend"),
        ({**BASE, "model": "tiny:2x64", "generation": {"backend": "vllm"}}, "/generation/backend"),
    ]
    for spec, pointer in cases:
        with pytest.raises(Problem) as refused:
            admit_spec(parse_spec(spec), settings)
        problem = refused.value
        assert (problem.status, problem.title) == (422, "Model does not fit vLLM's CPU build"), problem.detail
        assert [e["pointer"] for e in problem.errors or []] == [pointer]
        assert "heads are 16 wide" in (problem.detail or "") and "to 'hf'" in (problem.detail or ""), problem.detail
    admitted = [
        {"kind": "eval", "model": str(wide), "benchmark": "gsm8k", "backend": "vllm"},  # 64 wide: it fits
        {"kind": "eval", "model": str(tiny), "benchmark": "gsm8k", "backend": "hf"},
        {"kind": "generate", "model": str(tiny), "prompt": "1 + 1 =", "backend": "auto"},  # the worker falls back
        {"kind": "eval", "model": "org/model", "benchmark": "gsm8k", "backend": "vllm"},  # a hub id: the worker's
        {"kind": "eval", "model": str(tiny), "benchmark": "gsm8k", "backend": "vllm", "resources": {"gpus": 1}},
    ]
    for spec in admitted:
        admit_spec(parse_spec(spec), settings)


def test_the_job_process_fails_before_its_engine_loads_a_model_it_cannot_run(tmp_path: Path) -> None:
    """What the API could not read (a hub id, a pipeline's model saved since) the job's process checks
    before vLLM loads it in the process (GRPO's colocated engine, an eval without warm engines, a
    reward model's sampling of its policy, which is the model vLLM loads there)."""
    import json

    from runtime.errors import NotAvailable
    from worker.child import _check_engine_fit

    tiny, wide = tmp_path / "tiny", tmp_path / "wide"
    for folder, heads in ((tiny, 8), (wide, 2)):  # 16 and 64 wide
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"hidden_size": 128, "num_attention_heads": heads}))

    def resolve(ref: str) -> tuple[str, str | None]:
        return {"job:tiny": str(tiny), "job:wide": str(wide)}[ref], None

    grpo = parse_spec({**BASE, "model": "job:tiny", "generation": {"backend": "vllm"}})
    with pytest.raises(NotAvailable, match="heads are 16 wide.*set generation.backend to 'hf'"):
        _check_engine_fit(grpo, str(tiny), resolve)
    _check_engine_fit(parse_spec({**BASE, "model": "job:tiny"}), str(tiny), resolve)  # auto: hf on the CPU
    rm = {"kind": "reward_model", "model": "job:wide", "dataset": {"name": "gsm8k-train"}, "backend": "vllm"}
    with pytest.raises(NotAvailable, match="set backend to 'hf'"):
        _check_engine_fit(parse_spec({**rm, "policy": "job:tiny"}), str(wide), resolve)  # its policy samples
    _check_engine_fit(parse_spec(rm), str(wide), resolve)
