"""vLLM engines a worker keeps warm between eval jobs.

An eval job with `backend: vllm` does not start its own engine: the supervisor hands it a vLLM
OpenAI server (`vllm serve`) of the job's model (`acquire`) and keeps that server after the job
(`release`), so the next eval of the same model on this worker generates on it at once. The
job process reaches it at MATHRL_EVAL_ENGINE_URL. An idle engine of the same `model_family`
reloads a checkpoint's weights in place (`reload_weights`), a LoRA adapter is served by an engine
of its base, and each job's requests carry its project's `cache_salt`. `worker.warm_engines: 0`
turns this off. When an engine stops, and how reloads and adapters work: docs/vllm.md,
"`worker/warm_engine.py`: warm engines".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from config.settings import Settings

import hashlib
import hmac
import logging
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config.settings import Settings
from evaluator.backends.base import EngineSettings, WarmEngineAddress
from evaluator.models import context_length
from mathrl.specs import AnySpec
from worker.model_family import model_family as model_family  # what one engine can reload in place
from worker.vllm_server import VLLMServer, free_port, launch, server_env

# what the supervisor sets in the process of a job it gave a warm engine
ENGINE_URL_ENV = "MATHRL_EVAL_ENGINE_URL"
ENGINE_ADAPTER_ENV = "MATHRL_EVAL_ENGINE_ADAPTER"  # the LoRA adapter directory that job's requests name
ENGINE_SALT_ENV = "MATHRL_EVAL_ENGINE_CACHE_SALT"  # its project's prefix-cache salt (cache_salt)
_SALT_KEY = secrets.token_bytes(32)  # this worker process's: its engines live no longer than it


def cache_salt(project_id: str) -> str:
    """The salt of a project's requests to this worker's warm engines. vLLM caches a prompt's KV
    blocks across requests (prefix caching), and an engine serves every project that names its
    model: unsalted, a prompt that begins as another project's recent one is answered sooner, and
    timing calls tells a project what another asks (a held-out set's questions, a grader's rubric).
    Salted, cached blocks are reused only by requests of the same project. Keyed with a secret of
    this process, so that a salt cannot be worked out from a project's id."""
    return hmac.new(_SALT_KEY, project_id.encode(), hashlib.sha256).hexdigest()


def given_engine(settings: Settings, environ: dict[str, str] | None = None) -> WarmEngineAddress | None:
    """In a job's process: the warm engine its supervisor gave it, if any (read once here and
    passed to the evaluator as an argument)."""
    import os

    env = os.environ if environ is None else environ
    url = env.get(ENGINE_URL_ENV)
    if not url:
        return None
    start = settings.worker.warm_engine_start_seconds
    return WarmEngineAddress(url, env.get(ENGINE_ADAPTER_ENV), start, env.get(ENGINE_SALT_ENV) or None)


log = logging.getLogger("mathrl.worker")
SERVED_NAME = "mathrl-eval"
RELOAD_TIMEOUT = 600.0
LORAS_PER_BATCH = 2  # adapters one engine step can mix (vLLM keeps more loaded on the CPU side)


@dataclass
class WarmEngine:
    key: tuple[str, str, str]  # (model path, dtype, GPUs)
    server: VLLMServer
    max_model_len: int
    lora_rank: int = 0  # the largest LoRA rank it serves (--max-lora-rank); 0: no adapters
    family: str | None = None  # model_family of the weights it serves (None: never reloaded)
    reload_seconds: float | None = None  # how long the last reload took
    users: int = 0
    jobs: int = 0  # eval jobs served, this one included
    idle_since: float = field(default_factory=time.monotonic)
    # set once it serves `key`'s weights; clear while a job reloads them into it (outside the lock,
    # up to RELOAD_TIMEOUT): another job of that model waits for it, the others go on
    loaded: threading.Event = field(default_factory=lambda: _set(threading.Event()))


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


_lock = threading.Lock()
_engines: dict[tuple[str, str, str], WarmEngine] = {}


def wants_warm_engine(spec: AnySpec, settings: Settings) -> bool:
    """A job that wants a warm engine (its kind's needs, kinds/<kind>.py: the model the engine
    would serve), warm engines on, and vLLM installed here (else the job process says it is missing)."""
    import importlib.util

    from kinds import home

    if home(spec).needs(spec).engine_model is None:
        return False
    if settings.worker.warm_engines <= 0:
        return False
    return importlib.util.find_spec("vllm") is not None


max_model_len = context_length  # the model's context length, at most the operator's cap


@dataclass
class Adapter:
    """A LoRA checkpoint: an adapter directory (peft's adapter_config.json, no config.json)."""

    path: str
    base: str  # the base model's path or hub id, as training saved it
    rank: int


def adapter_of(model_path: str) -> Adapter | None:
    """The LoRA adapter at `model_path`, or None for a full model (or what cannot be read)."""
    import json

    folder = Path(model_path)
    if not (folder / "adapter_config.json").is_file() or (folder / "config.json").exists():
        return None
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
        return Adapter(str(folder), str(config["base_model_name_or_path"]), int(config["r"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def reload_weights(server: VLLMServer, model_path: str) -> float:
    """Load `model_path`'s weights into the running server in place; the seconds it took."""
    import httpx

    t0 = time.monotonic()
    body = {"method": "reload_checkpoint", "args": [model_path]}  # evaluator.vllm_reload.CheckpointReload
    r = httpx.post(f"{server.url}/collective_rpc", json=body, timeout=RELOAD_TIMEOUT)
    if r.status_code != 200:
        raise RuntimeError(f"reload_weights answered {r.status_code}: {r.text[:300]}")
    r = httpx.post(f"{server.url}/reset_prefix_cache", timeout=60)  # cached prefixes hold the old weights' KV
    if r.status_code != 200:
        raise RuntimeError(f"reset_prefix_cache answered {r.status_code}: {r.text[:300]}")
    return time.monotonic() - t0


def server_command(
    model_path: str, dtype: str, length: int, port: int, gpus: int, lora_rank: int = 0,
    engine: EngineSettings | None = None,
) -> list[str]:  # fmt: skip
    """`vllm serve` for eval jobs, with the engine arguments every engine of ours gets (and the
    operator's `engine` settings); with `lora_rank`, LoRA adapters up to that rank
    (mathrl.specs.lora.VLLM_LORA_RANKS) served too."""
    from evaluator.backends.vllm import engine_options

    opts = engine_options(dtype, max_model_len=length, settings=engine)
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
        "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", opts["dtype"],
        "--max-model-len", str(length), "--tensor-parallel-size", str(max(1, gpus)), "--disable-log-stats",
        "--disable-uvicorn-access-log", "--worker-extension-cls", "evaluator.vllm_reload.CheckpointReload",
        "--enable-prompt-tokens-details",  # usage's cached_tokens: a chat's prompt tokens its prefix cache held
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
    if lora_rank:
        cmd += ["--enable-lora", "--max-lora-rank", str(lora_rank), "--max-loras", str(LORAS_PER_BATCH)]
    return cmd


def log_path(artifact_dir: str | Path, job_id: str) -> Path:
    """Where an engine started for `job_id` logs: the worker's engines/ folder, not the job's own.
    The engine outlives the job and serves other projects' jobs, whose models' paths it logs
    (and reloads name), and a job's folder is its project's to read."""
    folder = Path(artifact_dir).resolve() / "engines"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"vllm-{job_id}.log"


def acquire(
    settings: Settings, model_path: str, dtype: str, gpus: list[str], log_path: Path, preexec: Any, lora_rank: int = 0,
    start: bool = True,
) -> tuple[WarmEngine, str] | None:  # fmt: skip
    """The warm engine for this model, and how it came: 'reused' (it served this model already),
    'reloaded' (an idle engine of the same family now holds this model's weights) or 'started'.
    `lora_rank`: the job's model is a LoRA adapter of `model_path` of that rank bound. None: the
    model's engine is busy and cannot serve the adapter, or there is no warm engine for it and
    `start` is false (a session samples on one only where there is one). Release it with
    `release` when the job ends."""
    key = (model_path, dtype, ",".join(gpus))
    reload = True  # after a failed reload: start an engine
    while True:
        with _lock:
            got = _take(settings, key, model_path, dtype, gpus, log_path, preexec, lora_rank, start, reload)
        if not isinstance(got, _Reload):
            return got
        if got.wait:  # another job is loading this model's weights into its engine: then it is reused
            got.engine.loaded.wait(RELOAD_TIMEOUT)
            continue
        # the reload takes seconds to minutes: outside the lock, so that the other jobs of this worker
        # (other models, other projects) take and give back their engines meanwhile
        engine = got.engine
        try:
            seconds = reload_weights(engine.server, key[0])
        except Exception as exc:
            log.warning("reloading %s into the warm engine of %s failed (%s): starting a new one", key[0], got.was, exc)
            with _lock:
                _stop(lambda e, failed=engine: e is failed)
            engine.loaded.set()
            reload = False
            continue
        with open(log_path, "a") as f:
            f.write(f"mathrl: reloaded {key[0]} into the warm engine of {got.was} in {seconds:.1f}s\n")
        engine.reload_seconds = seconds
        engine.loaded.set()
        return engine, "reloaded"


@dataclass
class _Reload:
    """What `_take` leaves to do outside the lock: wait for `engine`'s reload (`wait`), or reload it."""

    engine: WarmEngine
    wait: bool
    was: str = ""  # the model it served before


def _take(
    settings: Settings, key: tuple[str, str, str], model_path: str, dtype: str, gpus: list[str], log_path: Path,
    preexec: Any, lora_rank: int, start: bool, reload: bool,
) -> tuple[WarmEngine, str] | _Reload | None:  # fmt: skip
    """acquire's part under the lock."""
    _stop(lambda e: e.users == 0 and (e.server.exited() is not None or _expired(e, settings)))
    engine = _engines.get(key)
    if engine is not None and not engine.loaded.is_set():
        return _Reload(engine, wait=True)
    if engine is not None and engine.server.exited() is None and engine.lora_rank < lora_rank:
        if engine.users or not start:
            return None
        _stop(lambda e: e is engine)  # restarted below with LoRA enabled
        engine = None
    if engine is not None and engine.server.exited() is None:
        engine.users += 1
        engine.jobs += 1
        return engine, "reused"
    _engines.pop(key, None)
    family = model_family(model_path)
    idle = _idle_of_family(key, family, lora_rank) if family is not None and reload else None
    if idle is not None:  # taken now (in use, under its new key), its weights reloaded outside the lock
        was = idle.key[0]
        _engines.pop(idle.key, None)
        idle.key, idle.loaded = key, threading.Event()
        idle.users, idle.jobs = 1, idle.jobs + 1
        _engines[key] = idle
        return _Reload(idle, wait=False, was=was)
    if not start:
        return None
    idle_engines = sorted((e for e in _engines.values() if e.users == 0), key=lambda e: e.idle_since)
    for e in idle_engines[: max(0, len(_engines) - settings.worker.warm_engines + 1)]:
        _stop(lambda x, e=e: x is e)
    length = max_model_len(model_path, settings.worker.warm_engine_max_model_len)
    port = free_port()
    # all cores on a small CPU machine; /collective_rpc for reloading weights; the hub token if listed
    env = server_env(model_path, settings.sources.hub_token_repos)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    cmd = server_command(model_path, dtype, length, port, len(gpus), lora_rank, settings.vllm.engine())
    server = launch(cmd, port, env, log_path, preexec)
    engine = WarmEngine(key, server, length, lora_rank=lora_rank, family=family, users=1, jobs=1)
    _engines[key] = engine
    log.info("started a warm vLLM engine for %s at %s (process %d)", model_path, server.url, server.proc.pid)
    return engine, "started"


def _idle_of_family(key: tuple[str, str, str], family: str, lora_rank: int) -> WarmEngine | None:
    """An idle engine of this family, dtype and GPUs (and LoRA rank bound), whose weights a reload can
    replace with key's model (the caller holds the lock)."""
    return next(
        (
            e
            for e in _engines.values()
            if e.users == 0
            and e.family == family
            and e.key[1:] == key[1:]
            and e.lora_rank >= lora_rank
            and e.server.exited() is None
        ),
        None,
    )


def release(engine: WarmEngine, settings: Settings, keep: bool = True) -> None:
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


def reap(settings: Settings) -> None:
    """Stop the engines idle longer than the setting, or whose server has exited."""
    with _lock:
        _stop(lambda e: e.users == 0 and (e.server.exited() is not None or _expired(e, settings)))


def hold_idle() -> list[WarmEngine]:
    """Keep every idle engine through a job that does not use it (a CPU job: an idle engine takes
    memory, not cores): each is counted in use until `release`, so it neither expires nor is
    stopped meanwhile. After a training job, a chat or eval with the model it trained then reloads
    its weights into the engine of that family in seconds, instead of starting one (minutes on a CPU)."""
    with _lock:
        held = [e for e in _engines.values() if e.users == 0 and e.server.exited() is None]
        for e in held:
            e.users += 1
        return held


def stop_idle() -> int:
    """Stop every idle engine (another kind of job needs the GPUs and cores). Returns how many."""
    with _lock:
        return _stop(lambda e: e.users == 0)


def running() -> list[WarmEngine]:
    with _lock:
        return list(_engines.values())


def _expired(e: WarmEngine, settings: Settings) -> bool:
    idle: float = settings.worker.warm_engine_idle_seconds
    return time.monotonic() - e.idle_since >= idle


def _stop(which: Any) -> int:
    """Stop and forget the engines `which` picks (the caller holds the lock)."""
    gone = [e for e in _engines.values() if which(e)]
    for e in gone:
        _engines.pop(e.key, None)
        if e.server.exited() is None:
            log.info("stopping the warm vLLM engine for %s (%d jobs served)", e.key[0], e.jobs)
        e.server.stop()
    return len(gone)
