"""The vLLM server a GRPO job in server mode generates with, managed by the worker (on a Ray cluster,
by the job's driver: worker.ray_vllm runs the same `server_command` in a Ray actor).

`start_server` starts it on the job's last `generation.server_gpus` GPUs (`split_gpus`), on a free
loopback port, and hands its URL to the job process in MATHRL_VLLM_SERVER_URL; it is stopped,
process group and all, when the job ends. It runs under a guard (`python -m worker.vllm_server
--guard PPID -- CMD`) that leads its process group and kills the whole group when the worker dies
(PR_SET_PDEATHSIG). LoRA jobs get `vllm serve --enable-lora`; full-weight jobs TRL's `trl
vllm-serve` (NCCL, GPUs only). `engine_reason` says why an engine died. docs/vllm.md, "GRPO
generation"."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluator.backends.base import EngineSettings
from mathrl.specs import AnySpec, GRPOSpec
from mathrl.specs.lora import VLLM_LORA_RANKS
from mathrl.specs.resolved import ResolvedGRPO
from runtime.processes import free_port as free_port  # the warm engines and Ray import it from here

# what triton's bindings print at interpreter exit (hundreds of lines), which buried the error
_EXIT_NOISE = re.compile(r"^(nanobind: |See https://nanobind|\s+- leaked |\s+- \.\.\. skipped remainder)")
# a log line's prefixes: its process's ('(EngineCore pid=7) '), vLLM's logger's ('ERROR 12-01 23:42:58 [core.py:9] ')
_PREFIX = re.compile(r"^(?:\((?P<proc>[\w-]+) pid=\d+\) )?(?:[A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]*\] )?")
_EXCEPTION = re.compile(r"[\w.]*(?:Error|Exception): \S.*")  # a Python exception's line, after the prefixes
_POINTERS = ("See stack trace (above)", "See root cause above")  # an exception that points at the one before it
_SERVING = "Application startup complete."  # the API server answers requests from here on
_FATAL = "EngineCore encountered a fatal error."  # the engine core's last words: its traceback follows
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
REASON_CHARS = 300


def engine_reason(log: str, shared: bool = False) -> str | None:
    """Why an engine died, from its log: the last Python exception line that is not one pointing
    at another above it (EngineDeadError's 'See stack trace (above)'), with the indented lines that
    go on with its message (pydantic's 'Value error, ...'), without the log's prefixes, at most
    REASON_CHARS long; None when the log holds none. `shared` (a warm engine, whose log holds other
    projects' requests): only what holds no request's text, the whole log of one that never came up
    (it served no one), else what the process that logged the engine core's fatal error logged after
    it, with quoted values left out."""
    lines = [_unprefixed(line) for line in log.splitlines()]
    served = next((i for i, (_, text) in enumerate(lines) if _SERVING in text), None)
    reason, fatal = None, None  # fatal: the process that logged the engine core's fatal error
    for i, (proc, text) in enumerate(lines):
        fatal = proc if fatal is None and _FATAL in text else fatal
        if not _EXCEPTION.fullmatch(text) or any(p in text for p in _POINTERS):
            continue
        if shared and served is not None and (i < served or proc != fatal):
            continue  # what it logged while serving: a request's, maybe another project's
        for _, more in lines[i + 1 : i + 3]:
            if not more.startswith(" ") or more.lstrip().startswith(("File ", "For further information")):
                break
            text += " " + more.strip()
        reason = _QUOTED.sub("'...'", text) if shared and served is not None else text
    return None if reason is None else reason[:REASON_CHARS]


def _unprefixed(line: str) -> tuple[str, str]:
    """(the process that logged it, '' if none said; the line without its prefixes)."""
    m = _PREFIX.match(line)
    assert m is not None  # its groups are optional: it matches every line
    return m["proc"] or "", line[m.end() :]


def error_tail(log: str, chars: int) -> str:
    """The end of a server's log for a job's error: the last `chars` characters without the lines
    triton prints at exit, and the engine's reason (`engine_reason`) in front when the tail lacks it."""
    lines = [line for line in log.splitlines() if not _EXIT_NOISE.match(line)]
    tail = "\n".join(lines)[-chars:]
    reason = engine_reason(log)
    if reason is not None and reason not in tail:
        tail = f"{reason}\n...{tail[-(chars - len(reason)) :]}"
    return tail


URL_ENV = "MATHRL_VLLM_SERVER_URL"


def needs_server(spec: AnySpec) -> bool:
    """The job wants a vLLM server of its own beside it (its kind's needs: kinds/<kind>.py)."""
    from kinds import home

    return home(spec).needs(spec).vllm_server


def lora_rank(r: int) -> int:
    """The max_lora_rank vLLM serves an adapter of rank `r` under; ValueError past its largest."""
    served = next((x for x in VLLM_LORA_RANKS if x >= r), None)
    if served is None:  # (a StopIteration that failed the job with an empty message)
        raise ValueError(
            f"a LoRA adapter of rank {r}: vLLM serves ranks up to {VLLM_LORA_RANKS[-1]}; use backend 'hf' "
            f"for this model, or train with lora.r at most {VLLM_LORA_RANKS[-1]}"
        )
    return served


def split_gpus(spec: GRPOSpec, visible: list[str]) -> tuple[list[str], list[str]]:
    """(training GPUs, server GPUs): the server takes the job's last `server_gpus`."""
    gpus = visible[: spec.resources.gpus]
    n = spec.generation.resolved_server_gpus(spec.resources.gpus)
    return gpus[: len(gpus) - n], gpus[len(gpus) - n :]


def server_command(
    spec: GRPOSpec, config: ResolvedGRPO, model_path: str, port: int, on_gpu: bool, host: str = "127.0.0.1",
    engine: EngineSettings | None = None,
) -> list[str]:  # fmt: skip
    """The server's command line, listening on host:port (loopback on the worker; the node's address
    on a Ray node, where the trainers reach it from other nodes: worker.ray_vllm), with the
    operator's `engine` settings."""
    from evaluator.backends.vllm import engine_options

    gen = spec.generation
    max_len = config.max_prompt_length + config.max_completion_length
    opts = engine_options(
        gen.dtype, gen.gpu_memory_utilization, gen.enable_prefix_caching, max_model_len=max_len, settings=engine
    )
    tp = str(max(1, gen.resolved_server_gpus(spec.resources.gpus)))
    # adapters loaded at once: the new one before the old is unloaded; async GRPO also keeps every
    # version a queued request may still name (max_staleness + 1, TRL's default staleness 4)
    loras = (4 if spec.max_staleness is None else spec.max_staleness) + 2 if spec.algorithm == "async" else 2
    if spec.lora is None or not spec.lora.enabled:
        # TRL's server: full weights over NCCL (GPU only; the spec check refuses it on CPU)
        return [
            sys.executable,
            "-m",
            "trl.scripts.vllm_serve",
            "--model",
            model_path,
            "--host",
            host,
            "--port",
            str(port),
            "--tensor_parallel_size",
            tp,
            "--dtype",
            opts["dtype"],
            "--max_model_len",
            str(max_len),
            "--gpu_memory_utilization",
            str(opts.get("gpu_memory_utilization", 0.9)),
            *(["--enforce_eager", "true"] if opts.get("enforce_eager") else []),
        ]
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        opts["dtype"],
        "--max-model-len",
        str(max_len),
        "--seed",
        str(spec.seed),
        "--enable-lora",
        "--max-lora-rank",
        str(lora_rank(spec.lora.r)),
        "--max-loras",
        str(loras),
        "--logprobs-mode",
        "processed_logprobs",
        "--tensor-parallel-size",
        tp,
        "--disable-log-stats",
    ]
    if on_gpu:
        cmd += ["--gpu-memory-utilization", str(opts["gpu_memory_utilization"])]
    else:
        cmd += [
            "--kv-cache-memory-bytes",
            str(opts["kv_cache_memory_bytes"]),
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            str(opts["max_num_batched_tokens"]),
        ]  # see engine_options
    if opts.get("enable_prefix_caching") is not None:
        cmd.append("--enable-prefix-caching" if opts["enable_prefix_caching"] else "--no-enable-prefix-caching")
    if opts.get("enforce_eager"):  # MATHRL_VLLM__ENFORCE_EAGER=1, as for every engine of ours
        cmd.append("--enforce-eager")
    return cmd


@dataclass
class VLLMServer:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def exited(self) -> int | None:
        return self.proc.poll()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return error_tail(self.log_path.read_text(errors="replace"), chars)
        except OSError:
            return ""

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after `grace` seconds."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                return
            try:
                self.proc.wait(timeout=grace)
                if sig == signal.SIGTERM:
                    os.killpg(self.proc.pid, signal.SIGKILL)  # anything it left in its group
            except subprocess.TimeoutExpired:
                continue
            except (ProcessLookupError, PermissionError):
                return
            return


def start_server(
    spec: GRPOSpec, config: ResolvedGRPO, model_path: str, log_path: Path, preexec: Any, visible_gpus: list[str],
    engine: EngineSettings | None = None, hub_token_repos: Sequence[str] = (),
) -> tuple[VLLMServer, dict[str, str]]:  # fmt: skip
    """Start the job's vLLM server. Returns it and the environment the job's process needs
    (the server's URL; on GPUs, the training share of the devices)."""
    port = free_port()
    on_gpu = spec.resources.gpus > 0
    env = server_env(model_path, hub_token_repos)
    job_env: dict[str, str] = {}
    if on_gpu:
        train, serve = split_gpus(spec, visible_gpus)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(serve)
        job_env["CUDA_VISIBLE_DEVICES"] = ",".join(train)
    cmd = server_command(spec, config, model_path, port, on_gpu, engine=engine)
    server = launch(cmd, port, env, log_path, preexec)
    job_env[URL_ENV] = server.url
    return server, job_env


def server_env(model: str = "", hub_token_repos: Sequence[str] = ()) -> dict[str, str]:
    """This process's environment, with the engine's own settings (evaluator.backends.vllm.engine_env:
    on a small CPU machine every core generates) and what our syncs need of the server: adapters
    loaded at run time, and the development routes (/collective_rpc, /reset_prefix_cache). The hub
    token only where `model` is a listed repository (worker/hub_access.py)."""
    from evaluator.backends.vllm import engine_env
    from worker.hub_access import env_for

    env = {**os.environ, **engine_env(), "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_SERVER_DEV_MODE": "1"}
    return dict(env_for(model, env, hub_token_repos))


def launch(
    cmd: list[str], port: int, env: dict[str, str], log_path: Path, preexec: Any, host: str = "127.0.0.1"
) -> VLLMServer:
    """Start a server command under the guard, in a process group of its own, logging to log_path."""
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(
            guarded(cmd),
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=preexec,
        )
    return VLLMServer(proc, f"http://{host}:{port}", log_path)


def guarded(cmd: list[str]) -> list[str]:
    """`cmd` run under the guard, which kills its process group when this process dies."""
    return [sys.executable, "-m", "worker.vllm_server", "--guard", str(os.getpid()), "--", *cmd]


def guard(parent: int, cmd: list[str]) -> int:
    """Run `cmd` as a child in this process's group (the guard is started as a group leader);
    SIGKILL the whole group on SIGTERM or SIGINT, which the kernel sends when `parent` dies.
    Returns the server's exit code."""
    import subprocess as sp

    from worker.launch import die_with_parent

    def kill_group(*_: object) -> None:
        os.killpg(os.getpgrp(), signal.SIGKILL)

    signal.signal(signal.SIGTERM, kill_group)
    signal.signal(signal.SIGINT, kill_group)
    die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the death signal was armed
        kill_group()
    return sp.Popen(cmd).wait()


if __name__ == "__main__":
    if len(sys.argv) < 5 or sys.argv[1] != "--guard" or sys.argv[3] != "--":
        sys.exit("usage: python -m worker.vllm_server --guard PARENT_PID -- COMMAND...")
    sys.exit(guard(int(sys.argv[2]), sys.argv[4:]))
