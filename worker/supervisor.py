"""Supervising one job: claim its row, prepare the attempt (its directory, a warm vLLM engine or
the job's own vLLM server, or a Ray job), start it, and hand it to the watch loop (worker.watch),
which keeps the lease alive, passes on cancels and drains, and records the end (worker.record)."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config.settings import Settings
from evaluator.backends.vllm import cpu_build, cpu_refusal
from kinds import home
from mathrl.modelref import is_hub_id
from mathrl.specs import parse_spec
from mathrl.specs.resolved import ResolvedConfig, ResolvedGRPO, resolved
from runtime.cpu_threads import job_thread_env
from runtime.errors import EngineUnfit as EngineUnfit  # raised here; its callers import it from here
from store.db import session_scope
from store.jobs import claim
from worker import hub_access, warm_engine
from worker.attempt import AttemptDir, attempt_dir
from worker.child import (
    EXIT_ERROR,
    EXIT_STOPPED,
    model_config,
    model_resolver,
)
from worker.gpu_slots import SLOTS
from worker.job_handle import ForkedJob, prepare_child, start_job
from worker.launch import (
    child_args,
    describe,
    job_command,
)
from worker.lease import LeaseKeeper
from worker.record import event, record_end
from worker.refs import check_hub_model
from worker.tracking import start_mirror
from worker.vllm_server import lora_rank, needs_server, start_server
from worker.warm_engine import ENGINE_ADAPTER_ENV, ENGINE_SALT_ENV, ENGINE_URL_ENV, wants_warm_engine
from worker.watch import shutting_down, watch

log = logging.getLogger("mathrl.worker")

START_SECONDS = 180.0  # submitting to Ray (earlier attempts stopped first) must be done within this


def worker_identity(task_id: str | None = None) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}" + (f":{task_id}" if task_id else "")


def supervise(settings: Settings, job_id: str, owner: str) -> str:
    """Run one job to the end. Returns the final status, or 'skipped' if it was not ours to run."""
    url = settings.database.url
    w = settings.worker
    if shutting_down.is_set():  # not claimed: the reconciler sends it again, to another worker
        log.info("job %s not started: this worker is shutting down", job_id)
        return "skipped"
    with session_scope(url) as s:
        job = claim(s, job_id, owner, w.lease_seconds)
        if job is None:
            log.info("job %s not claimable (already taken, cancelled or finished); skipping", job_id)
            return "skipped"
        attempt = job.attempts
        spec = None
        try:
            spec = parse_spec(job.spec)
            cmd = job_command(spec, job_id, owner, attempt)
        except ValueError:  # a spec this version cannot read: the job process reports why
            cmd = [sys.executable, *child_args(job_id, owner, attempt)]
        project_id, config = job.project_id, resolved(job.resolved_config or {"kind": job.kind})
    out = attempt_dir(settings.artifact_dir, job_id, attempt)  # this attempt's own (worker.child)
    out.mkdir(parents=True, exist_ok=True)
    claimed = Claimed(settings, job_id, owner, attempt, spec, cmd, config, project_id, out)
    mirror = start_mirror(settings, job_id)  # None unless runs are mirrored to MLflow (worker.tracking)
    status: str | None = None
    try:
        status = _run_attempt(claimed)
        return status
    finally:
        if mirror is not None:  # after the job's end is recorded: MLflow never delays it
            mirror.close(status)


@dataclass(frozen=True)
class Claimed:
    """The attempt this worker claimed, as read from the job's row at the claim."""

    settings: Settings
    job_id: str
    owner: str
    attempt: int
    spec: Any  # None: a spec this version cannot read (the job's process says why)
    cmd: list[str]
    config: ResolvedConfig
    project_id: str
    out: Path  # the attempt's directory

    @property
    def log_path(self) -> Path:
        return AttemptDir(self.out).log

    def fail(self, message: str) -> str:
        """The attempt ends before its process starts: the job fails with `message`."""
        AttemptDir(self.out).write_error(message)
        return record_end(self.settings, self.job_id, self.owner, EXIT_ERROR, False, self.log_path)


def _run_attempt(a: Claimed) -> str:
    """The claimed attempt, on this worker or on Ray, to its recorded end. The lease is kept alive
    throughout (worker.lease); the watch loop acts on its renewals."""
    w = a.settings.worker
    with LeaseKeeper(a.settings.database.url, a.job_id, a.owner, w.lease_seconds, w.heartbeat_seconds) as lease:
        if a.spec is not None and a.settings.ray.runs(a.spec):
            return _run_on_ray(a, lease)
        env = dict(hub_access.job_env({**os.environ, "PYTHONUNBUFFERED": "1"}))  # it sends the token per repository
        env.update(job_thread_env(env, w.job_slots, w.job_threads))
        gpus: list[str] = []
        if a.spec is not None and a.spec.resources.gpus:
            taken = SLOTS.take(a.spec.resources.gpus, _visible_gpus(), lease.still_ours, w.heartbeat_seconds)
            if taken is None:
                log.info("job %s attempt %d: lost or cancelled waiting for this worker's GPUs", a.job_id, a.attempt)
                if lease.beat.owned:
                    return record_end(a.settings, a.job_id, a.owner, EXIT_STOPPED, True, a.log_path)
                return "lost"
            gpus = taken
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)  # its own devices, not the pod's first ones
        try:
            return _run_local(a, env, gpus, lease)
        finally:
            SLOTS.give(gpus)


def _run_local(a: Claimed, env: dict[str, str], gpus: list[str], lease: LeaseKeeper) -> str:
    """The attempt's process on this worker, on the GPUs lent to it (`gpus`; none on the CPU)."""
    settings, spec, job_id = a.settings, a.spec, a.job_id
    server = engine = None
    held: list[warm_engine.WarmEngine] = []  # idle engines kept through a CPU job (worker/warm_engine.py)
    if spec is not None and wants_warm_engine(spec, settings):
        try:
            engine_log = warm_engine.log_path(settings.artifact_dir, job_id)  # the worker's, not this job's
            acquired = _warm_engine(settings, spec, a.project_id, engine_log, job_id, gpus)
        except EngineUnfit as exc:  # the job named vLLM: none, rather than an engine that dies at its first request
            return a.fail(str(exc))
        except Exception as exc:  # a model ref that does not resolve: the job fails with it
            return a.fail(f"starting the vLLM engine failed: {type(exc).__name__}: {exc}")
        if isinstance(acquired, str):  # ON_TRANSFORMERS
            held = warm_engine.hold_idle()  # a CPU job on transformers, as any other
        elif acquired is not None:
            engine, adapter = acquired
            server = engine.server
            env[ENGINE_URL_ENV] = server.url
            env[ENGINE_SALT_ENV] = warm_engine.cache_salt(a.project_id)  # its cached prompts its own
            if adapter is not None:
                env[ENGINE_ADAPTER_ENV] = adapter
        elif home(spec).needs(spec).engine_if_warm:
            held = warm_engine.hold_idle()  # none to use (a session on the CPU): the others kept, as for a CPU job
        else:
            warm_engine.stop_idle()
    elif spec is not None and spec.resources.gpus == 0:
        held = warm_engine.hold_idle()  # idle engines take memory, not cores: kept for the model it trains
    elif spec is not None:
        warm_engine.stop_idle()  # a GPU job needs the GPUs' memory
    if spec is not None and needs_server(spec):
        try:
            server_log = a.out / "vllm-server.log"
            server, server_env = _start_vllm_server(settings, spec, a.config, a.project_id, server_log, job_id, gpus)
        except Exception as exc:  # a model ref that does not resolve, no vLLM here: the job fails with it
            for kept in held:  # (they were kept for ever: the job never reached the release below)
                warm_engine.release(kept, settings)
            failed = f"starting the vLLM server failed: {type(exc).__name__}: {exc}"
            return a.fail(str(exc) if isinstance(exc, EngineUnfit) else failed)
        env.update(server_env)
        event(
            settings.database.url,
            job_id,
            "vllm_server",
            f"started a vLLM server for this job at {server.url} (process "
            f"{server.proc.pid}, log {server.log_path.name})",
            {"url": server.url, "pid": server.proc.pid},
        )
    try:
        job = start_job(settings, a.cmd, env, a.log_path)
        how = "forked" if isinstance(job, ForkedJob) else "started"
        log.info(
            "job %s attempt %d: process %d %s, %s, log %s", job_id, a.attempt, job.pid, how, describe(a.cmd), a.log_path
        )
        shared = engine is not None and server is engine.server
        return watch(settings, job_id, a.owner, job, a.out, a.attempt, lease, server, shared)
    finally:
        for kept in held:
            warm_engine.release(kept, settings)
        if engine is not None:
            warm_engine.release(engine, settings)
        elif server is not None:
            server.stop()


def _run_on_ray(a: Claimed, lease: LeaseKeeper) -> str:
    """The job past one node (or in a pool set to run on Ray): a Ray job on the operator's cluster
    (worker.ray_submit), watched by the same loop as a local job process."""
    from worker.ray_submit import RayJob, RayUnavailable

    settings, url = a.settings, a.settings.database.url
    if settings.ray.address is None:
        return a.fail(
            f"the job asks for resources.nodes={a.spec.resources.nodes} and this worker has no Ray cluster "
            "configured: set MATHRL_RAY__ADDRESS on the workers of this queue"
        )
    warm_engine.stop_idle()

    def job_event(kind: str, message: str, data: dict[str, Any] | None = None, level: str = "info") -> None:
        event(url, a.job_id, kind, message, data, level)

    ray_job = RayJob(settings, a.spec, a.job_id, a.owner, a.attempt, a.out, a.log_path, job_event)
    failed: list[str] = []

    def start() -> None:
        try:
            ray_job.start()
        except RayUnavailable as exc:
            failed.append(str(exc))
        except Exception as exc:
            failed.append(f"submitting to the Ray cluster failed: {type(exc).__name__}: {exc}")

    # the Jobs API can take seconds (a busy head; earlier attempts to stop), while the lease is kept
    starting = threading.Thread(target=start, name=f"mathrl-ray-submit-{a.job_id}", daemon=True)
    starting.start()
    starting.join(START_SECONDS)
    if starting.is_alive():
        failed.append(
            f"the Ray cluster at MATHRL_RAY__ADDRESS={settings.ray.address!r} did not take the job within "
            f"{START_SECONDS:g} s"
        )
    if failed:
        return a.fail(failed[0])
    log.info("job %s attempt %d: Ray job %s, log %s", a.job_id, a.attempt, ray_job.id, a.log_path)
    return watch(settings, a.job_id, a.owner, ray_job, a.out, a.attempt, lease)


ON_TRANSFORMERS = "transformers"  # _warm_engine: no engine, the job's model does not fit it ('auto' answers on HF)


def _warm_engine(
    settings: Settings, spec: Any, project_id: str, log_path: Path, job_id: str, gpus: list[str]
) -> tuple[warm_engine.WarmEngine, str | None] | str | None:
    """This worker's warm vLLM engine for the job's model, started if there is none, and the LoRA
    adapter to load into it: a LoRA checkpoint's engine is its base model's, with LoRA on, and the
    job process loads the adapter (ENGINE_ADAPTER_ENV). None: the base's engine is busy without LoRA.
    A model this worker's vLLM, its CPU build, cannot run (its config.json read here): EngineUnfit where the
    job names vLLM, else ON_TRANSFORMERS, with an event saying so."""
    needs = home(spec).needs(spec)
    model = needs.engine_model
    assert model is not None  # wants_warm_engine checked that it has one
    model_path, _ = model_resolver(settings, job_id, project_id)(model)  # as the job's process does
    adapter = warm_engine.adapter_of(model_path)
    if adapter is not None and is_hub_id(adapter.base):
        # the engine serves the adapter's base: a hub repository, checked as a model the job names is
        # (its owner may have made it load another path in its place since the adapter was trained)
        check_hub_model(adapter.base)
    served, rank = (adapter.base, lora_rank(adapter.rank)) if adapter else (model_path, 0)
    refusal = cpu_refusal(model_config(served)) if cpu_build() else None
    if refusal is not None and needs.vllm_field is not None:
        raise EngineUnfit(f"{refusal}: set {needs.vllm_field} to 'hf' (transformers)")
    if refusal is not None:  # backend 'auto'
        event(
            settings.database.url, job_id, "vllm_engine", f"{refusal}: answering with transformers instead",
            {"how": "transformers", "reason": refusal}, "warning",
        )  # fmt: skip
        return ON_TRANSFORMERS
    if needs.engine_lora_rank:  # the job loads adapters of its own (a session's samplers)
        rank = max(rank, lora_rank(needs.engine_lora_rank))
    acquired = warm_engine.acquire(
        settings, served, spec.dtype, gpus, log_path, prepare_child, lora_rank=rank, start=not needs.engine_if_warm
    )
    if acquired is None and needs.engine_if_warm:
        event(
            settings.database.url,
            job_id,
            "vllm_engine",
            f"this worker has no idle warm vLLM engine of {model} with LoRA up to rank {rank}: sampling with "
            "transformers",
            {"how": "none"},
        )
        return None
    if acquired is None:
        event(
            settings.database.url,
            job_id,
            "vllm_engine",
            f"{model} is a LoRA adapter and this worker's engine of its base is busy without LoRA: no warm engine",
        )
        return None
    engine, came = acquired
    how = {
        # no count of the jobs before this one on the engine: other projects' among them, theirs to know
        "reused": "reused this worker's warm vLLM engine",
        "reloaded": f"loaded this model's weights into this worker's warm vLLM engine of the same model family in "
        f"{engine.reload_seconds or 0:.1f} s instead of starting one",
        "started": "started a vLLM engine",
    }[came]
    event(
        settings.database.url,
        job_id,
        "vllm_engine",
        f"{how} at {engine.server.url} (process {engine.server.proc.pid})"
        + (f", serving LoRA adapters of {served} up to rank {rank}" if rank else "")
        + f"; it stays warm for the next eval of this model for {settings.worker.warm_engine_idle_seconds:.0f} s",
        {
            "url": engine.server.url,
            "pid": engine.server.proc.pid,
            "reused": came != "started",
            "how": came,
            "reload_seconds": engine.reload_seconds if came == "reloaded" else None,
            "adapter": adapter.path if adapter else None,
        },
    )
    return engine, adapter.path if adapter else None


def _visible_gpus() -> list[str]:
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    if not visible:
        import torch

        visible = [str(i) for i in range(torch.cuda.device_count())]
    return visible


def _start_vllm_server(
    settings: Settings, spec: Any, config: ResolvedConfig, project_id: str, log_path: Path, job_id: str,
    gpus: list[str],
) -> Any:  # fmt: skip
    model_path, _ = model_resolver(settings, job_id, project_id)(spec.model)  # 'job:' and 'tiny:' refs too
    refusal = cpu_refusal(model_config(model_path)) if cpu_build() else None
    if refusal is not None:
        raise EngineUnfit(f"{refusal}: set generation.backend to 'hf' (transformers)")
    return start_server(
        spec, config.of(ResolvedGRPO), model_path, log_path, prepare_child, gpus, settings.vllm.engine(),
        settings.sources.hub_token_repos,
    )  # fmt: skip
