"""vLLM engines a worker keeps warm between eval jobs.

Starting vLLM costs minutes on a CPU (~100-170 s for SmolLM2-135M here) and tens of seconds on
a GPU, which is most of a 100-problem eval. So an eval job with `backend: vllm` does not start
its own engine: the supervisor hands it a vLLM OpenAI server (`vllm serve`) of the job's model
and keeps that server after the job. The next eval job of the same model on this worker (the
same resolved path, dtype and GPUs) generates on it at once. The job process reaches it at
MATHRL_EVAL_ENGINE_URL (evaluator/vllm_backend.py `generate_remote`); the scores are the
same as the offline engine's: the same engine, requests and sampling settings.

A warm engine is stopped when it has been idle `worker.warm_engine_idle_seconds`, when another
model's eval needs the slot (`worker.warm_engines` servers at most), when a job of another kind
starts on this worker (training needs the GPUs and cores), and with the worker (the server runs
under worker.vllm_server's guard). `worker.warm_engines: 0` turns this off: each eval job then
loads an offline engine in its own process, as before.

Not done: a checkpoint of the same base model is served by a new engine, not by reloading
weights into the warm one (vLLM's CPU build prepacks linear weights and drops the originals,
so an in-place reload fails there; see worker/vllm_server.py).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.vllm_server import VLLMServer, free_port, launch

log = logging.getLogger("mathrl.worker")
SERVED_NAME = "mathrl-eval"


@dataclass
class WarmEngine:
    key: tuple[str, str, str]  # (model path, dtype, GPUs)
    server: VLLMServer
    max_model_len: int
    users: int = 0
    jobs: int = 0  # eval jobs served, this one included
    idle_since: float = field(default_factory=time.monotonic)


_lock = threading.Lock()
_engines: dict[tuple[str, str, str], WarmEngine] = {}


def wants_warm_engine(spec: Any, settings: Any) -> bool:
    """An eval on vLLM, warm engines on, and vLLM installed here (else the job process says it is missing)."""
    import importlib.util

    if getattr(spec, "kind", None) != "eval" or spec.backend != "vllm" or settings.worker.warm_engines <= 0:
        return False
    return importlib.util.find_spec("vllm") is not None


def max_model_len(model_path: str, cap: int) -> int:
    """The model's context length (config.json), at most `cap`; `cap` when the config says none."""
    import json

    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return cap
    return min(int(config.get("max_position_embeddings") or cap), cap)


def server_command(model_path: str, dtype: str, length: int, port: int, gpus: int) -> list[str]:
    """`vllm serve` for eval jobs, with the engine arguments every engine of ours gets."""
    from evaluator.vllm_backend import engine_options

    opts = engine_options(dtype, max_model_len=length)
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
        "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", opts["dtype"],
        "--max-model-len", str(length), "--tensor-parallel-size", str(max(1, gpus)), "--disable-log-stats",
        "--disable-uvicorn-access-log",
    ]  # fmt: skip
    if "gpu_memory_utilization" in opts:
        cmd += ["--gpu-memory-utilization", str(opts["gpu_memory_utilization"])]
    else:
        cmd += [
            "--kv-cache-memory-bytes", str(opts["kv_cache_memory_bytes"]), "--no-enable-chunked-prefill",
            "--max-num-batched-tokens", str(opts["max_num_batched_tokens"]),
        ]  # fmt: skip
    if opts.get("enforce_eager"):
        cmd.append("--enforce-eager")
    return cmd


def acquire(
    settings: Any, model_path: str, dtype: str, gpus: list[str], log_path: Path, preexec: Any
) -> tuple[WarmEngine, bool]:
    """The warm engine for this model, started if there is none. Returns it and whether it was
    already running. Release it with `release` when the job ends."""
    key = (model_path, dtype, ",".join(gpus))
    with _lock:
        _stop(lambda e: e.users == 0 and (e.server.exited() is not None or _expired(e, settings)))
        engine = _engines.get(key)
        if engine is not None and engine.server.exited() is None:
            engine.users += 1
            engine.jobs += 1
            return engine, True
        _engines.pop(key, None)
        idle = sorted((e for e in _engines.values() if e.users == 0), key=lambda e: e.idle_since)
        for e in idle[: max(0, len(_engines) - settings.worker.warm_engines + 1)]:
            _stop(lambda x, e=e: x is e)
        length = max_model_len(model_path, settings.worker.warm_engine_max_model_len)
        port = free_port()
        env = {**os.environ}
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        server = launch(server_command(model_path, dtype, length, port, len(gpus)), port, env, log_path, preexec)
        engine = WarmEngine(key, server, length, users=1, jobs=1)
        _engines[key] = engine
        log.info("started a warm vLLM engine for %s at %s (process %d)", model_path, server.url, server.proc.pid)
        return engine, False


def release(engine: WarmEngine, settings: Any, keep: bool = True) -> None:
    """The job is done with it. It stays warm for the next job unless `keep` is false (its job
    was cancelled mid-request, or it failed) or warm engines are off; an idle one is stopped
    after `worker.warm_engine_idle_seconds` by a timer."""
    with _lock:
        engine.users -= 1
        engine.idle_since = time.monotonic()
        if engine.users == 0 and not keep:
            _stop(lambda e: e is engine)
            return
    timer = threading.Timer(settings.worker.warm_engine_idle_seconds + 1, reap, args=(settings,))
    timer.daemon = True
    timer.start()


def reap(settings: Any) -> None:
    """Stop the engines idle longer than the setting, or whose server has exited."""
    with _lock:
        _stop(lambda e: e.users == 0 and (e.server.exited() is not None or _expired(e, settings)))


def stop_idle() -> int:
    """Stop every idle engine (another kind of job needs the GPUs and cores). Returns how many."""
    with _lock:
        return _stop(lambda e: e.users == 0)


def running() -> list[WarmEngine]:
    with _lock:
        return list(_engines.values())


def _expired(e: WarmEngine, settings: Any) -> bool:
    return time.monotonic() - e.idle_since >= settings.worker.warm_engine_idle_seconds


def _stop(which: Any) -> int:
    """Stop and forget the engines `which` picks (the caller holds the lock)."""
    gone = [e for e in _engines.values() if which(e)]
    for e in gone:
        _engines.pop(e.key, None)
        if e.server.exited() is None:
            log.info("stopping the warm vLLM engine for %s (%d jobs served)", e.key[0], e.jobs)
        e.server.stop()
    return len(gone)
