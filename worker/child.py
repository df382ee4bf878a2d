"""The job process. The supervisor starts `python -m worker.child <job_id> <owner> <attempt>`; a crash,
an OOM or a hung CUDA context here cannot take the worker down, and the accelerator's memory is
returned when this process exits.

Exit codes: 0 done, 1 error, 2 stopped on request, 3 job kind not available here, 4 lost the job
(its lease lapsed), 5 drained. Each attempt works in <job dir>/attempt-N; what the job keeps is
moved into <job dir>/train and <job dir>/eval by the fenced sink (worker.sink). A multi-process
training job (worker.launch) runs `run_rank` once per rank, and only the main rank writes.
docs/how-jobs-run.md."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from config.settings import Settings, get_settings
from config.sources import local_path, storage_dirs
from kinds import JobRun, home
from mathrl.modelref import tiny_shape
from mathrl.specs import AnySpec, model_refs, parse_spec, with_file_paths
from mathrl.specs.resolved import ResolvedConfig, resolved
from runtime.cpu_threads import apply_thread_count
from runtime.errors import Cancelled, Drained, NotAvailable, StopRequested
from runtime.errors import MemoryRefused as MemoryRefused  # raised here; its callers import it from here
from runtime.processes import rank as rank_of_process
from store.db import error_text, retry_transient, session_scope
from store.models import Job
from worker import hub_access
from worker.attempt import AttemptDir, attempt_dir, job_dir
from worker.launch import die_with_parent, error_file, is_main, world_size
from worker.refs import resolve_model_ref
from worker.sink import DatabaseSink, Fence, LeaseLost, ReadOnlySink

EXIT_OK, EXIT_ERROR, EXIT_STOPPED, EXIT_UNAVAILABLE, EXIT_LOST, EXIT_DRAINED = 0, 1, 2, 3, 4, 5


def load_job(settings: Settings, job_id: str) -> tuple[AnySpec, str, ResolvedConfig]:
    """The job's spec, project and resolved config, read from the store."""

    def load() -> tuple[AnySpec, str, ResolvedConfig]:
        with session_scope(settings.database.url) as s:
            job = s.get(Job, job_id)
            if job is None:
                raise RuntimeError(f"job {job_id} not found")
            return parse_spec(job.spec), job.project_id, resolved(job.resolved_config or {"kind": job.kind})

    return retry_transient(load, f"job {job_id}: loading")


def model_resolver(settings: Settings, job_id: str, project_id: str) -> Callable[[str], tuple[str, str | None]]:
    """Model ref -> (path or hub id, checkpoint label): 'job:' refs through the store, 'tiny:' built."""

    def resolve(ref: str) -> tuple[str, str | None]:
        if ref.startswith("tiny:"):
            return build_tiny(ref, settings.artifact_dir), None

        def lookup() -> tuple[str, str | None]:
            with session_scope(settings.database.url) as s:
                return resolve_model_ref(s, project_id, ref)

        return retry_transient(lookup, f"job {job_id}: resolving {ref}")

    return resolve


def run(job_id: str, owner: str, attempt: int) -> int:
    from evaluator.models import trust_remote_code_for

    settings = get_settings()
    url = settings.database.url
    trust_remote_code_for(settings.sources.trust_remote_code_models)
    hub_access.install(settings.sources.hub_token_repos)  # before anything reads the hub
    spec, project_id, config = load_job(settings, job_id)
    resolve = model_resolver(settings, job_id, project_id)
    _check_available(spec)
    work = attempt_dir(settings.artifact_dir, job_id, attempt)
    _check_raw_paths(spec, settings)  # as submitted: before its file ids and URLs become paths in storage
    spec = _fetch_dataset(spec, settings, work, project_id)
    model = home(spec).needs(spec).model
    model_path, checkpoint = resolve(model) if model is not None else ("", None)
    hub_access.env_for(model_path, os.environ)  # the engine processes vLLM starts from here load this model
    sink_class = DatabaseSink if is_main() else ReadOnlySink
    sink = sink_class(
        url,
        job_id,
        project_id,
        cancel_poll_seconds=settings.worker.heartbeat_seconds,
        fence=Fence(owner, attempt, AttemptDir(work).rejected_writes),
        drain_file=AttemptDir(work).drain_request,
    )
    sink.install_sigterm()
    try:
        _check_memory(spec, config, model_path, settings, sink)  # before the model loads
        _check_engine_fit(spec, model_path, resolve)
        from worker.vllm_server import URL_ENV
        from worker.warm_engine import given_engine

        out = job_dir(settings.artifact_dir, job_id)
        warm, server = given_engine(settings), os.environ.get(URL_ENV)
        run = JobRun(spec, config, sink, settings, job_id, model_path, checkpoint, resolve, work, out, warm, server)
        return _run_kind(run)
    except StopRequested as stop:
        if isinstance(stop, LeaseLost):
            raise
        if sink.lost:  # stopped because this attempt saw it no longer owns the job
            raise LeaseLost(f"attempt {attempt} lost job {job_id}") from None
        if sink.draining():
            raise Drained("drained") from None
        raise Cancelled("cancelled") from None
    finally:
        sink.flush()  # every metric and sample is stored before the process reports its end


def _run_kind(run: JobRun[Any, Any]) -> int:
    """The kind's `run` (kinds/<kind>.py) in this process."""
    world = world_size()
    run.sink.event(
        "started",
        f"job process {os.getpid()} started ({run.spec.kind})" + (f", rank 0 of {world}" if world > 1 else ""),
        data={"pid": os.getpid(), "processes": world},
    )
    home(run.spec).run(run)
    return EXIT_OK


def _check_raw_paths(spec: AnySpec, settings: Settings) -> None:
    """The raw paths the API admitted (a model or dataset under an operator's root, outside the
    service's storage) are checked again here, on this worker's view, before anything loads: a link
    under a root may point elsewhere since, and this worker's caches and mounts are not the API's.
    A path that resolves into the artifact directory or a model cache fails the job, naming the field."""
    storage = storage_dirs(settings.artifact_dir, settings.sources.cache_dirs)
    dataset = home(spec).data(spec).dataset
    named = dict(model_refs(spec))
    if dataset is not None and dataset.path:
        named["dataset/path"] = dataset.path
    for field, value in named.items():
        raw = local_path(value)
        if raw is not None and any(Path(raw).expanduser().resolve().is_relative_to(d) for d in storage):
            raise ValueError(
                f"{field}: {value!r} resolves into the service's own storage on this worker (a link changed "
                "since the job was accepted?): name a model by 'job:<id>' or 'ft:...', a file by 'file-...'"
            )


def _file_path(settings: Settings, project_id: str, field: str, file_id: str) -> str:
    """Where an uploaded file of the job's project is (its row's path), or a ValueError naming the
    field (its path in the spec: 'eval/file')."""
    from store.models import File

    with session_scope(settings.database.url) as s:
        row = s.get(File, file_id)
        path = row.path if row is not None and row.project_id == project_id else None
    if path is None or not Path(path).exists():
        raise ValueError(f"{field.replace('/', '.')}: {file_id!r} is not a file of this project any more (deleted?)")
    return str(path)


def _fetch_dataset(spec: AnySpec, settings: Settings, work: Path, project_id: str) -> AnySpec:
    """Every uploaded file the spec reads ('file-...', each field typed FileRef) is read where the API
    stored it, if the job's project owns it (mathrl.specs.with_file_paths). A dataset URL is fetched
    here, checked again now (config.sources.fetch_url: the prefix, the host's addresses as DNS
    answers now, and every redirect), and the job reads the copy."""
    spec = with_file_paths(spec, lambda where, file_id: _file_path(settings, project_id, where, file_id))
    dataset = home(spec).data(spec).dataset
    if dataset is not None and dataset.file is not None:
        return spec
    url = dataset.path or "" if dataset is not None else ""
    if dataset is None or not url.lower().startswith(("http://", "https://")):
        return spec
    from config.sources import fetch_url

    rank = rank_of_process()
    local = fetch_url(url, settings.sources.allowed_url_prefixes, work / "data" / f"rank-{rank}")
    return spec.model_copy(update={"dataset": dataset.model_copy(update={"path": str(local)})})


def _check_available(spec: AnySpec) -> None:
    """Fail fast, with the reason, when this worker lacks what the job needs."""
    import importlib.util

    needs = home(spec).needs(spec)
    field = needs.vllm_field
    if field is not None and importlib.util.find_spec("vllm") is None:
        raise NotAvailable(
            f"this job asks for vLLM ({field}='vllm'), which is not installed on this worker: "
            f"set {field} to 'hf'"
            + (" or 'auto'" if field == "generation.backend" else "")
            + ", or send it to a pool whose image has vLLM (resources.pool)"
        )
    if needs.deepspeed and importlib.util.find_spec("deepspeed") is None:
        raise NotAvailable(
            "this job asks for deepspeed_zero3, and DeepSpeed is not installed on this worker: "
            "drop deepspeed_zero3, or run a worker image with deepspeed"
        )
    if spec.resources.gpus > 0:
        import torch

        have = torch.cuda.device_count()
        if have < spec.resources.gpus:
            raise NotAvailable(f"the job asks for {spec.resources.gpus} GPU(s); this worker has {have}")


def _check_memory(spec: AnySpec, config: ResolvedConfig, model_path: str, settings: Settings, sink: Any) -> None:
    """The memory plan of a job on GPUs whose kind has one (trainer/memory_plan.py), the same check the API
    makes at submit, for what only the worker can see: a hub id's config.json (fetched alone, into
    the cache the model loads from next) or another job's model once it is saved. The GPU's memory
    is the pool's from settings (MATHRL_MEMORY__POOLS, as at submit), else this worker's first
    visible GPU's (torch). A plan over it fails the job, with what would fit, before the model
    loads; a plan checked at submit is not checked again."""
    training = home(spec).memory(config)
    if training is None or spec.resources.gpus == 0:
        return
    from trainer.memory_plan import check_job

    stored = config.memory_plan or {}
    if stored.get("gpu_memory_gib") is not None:
        return  # checked at submit against the same settings
    gpu_gib = settings.memory.for_queue(spec.resources.queue) or _visible_gpu_gib()
    found = model_config(model_path)
    if found is None:
        model = home(spec).needs(spec).model
        sink.event("memory_plan", f"memory plan not checked: no config.json for {model}", "warning")
        return
    try:
        plan, refusal = check_job(training, found, gpu_gib)
    except ValueError as exc:
        sink.event("memory_plan", f"memory plan not checked: {exc}", "warning")
        return
    if refusal is not None:
        raise MemoryRefused(refusal.detail, plan.record())
    of = f" of {gpu_gib:.1f} GiB" if gpu_gib else ""
    sink.event("memory_plan", f"memory plan: ~{plan.estimate_gib:.1f} GiB per GPU{of}", data=plan.record())


def _check_engine_fit(spec: AnySpec, model_path: str, resolve: Callable[[str], tuple[str, str | None]]) -> None:
    """A job that names vLLM, on a worker whose vLLM is its CPU build, for a model that build cannot run
    fails before its engine loads (which would die at its first request), naming the field (the API
    refused those whose config.json it could read: this is a hub id's, or a pipeline's model saved since)."""
    from evaluator.backends.vllm import cpu_build, cpu_refusal

    needs = home(spec).needs(spec)
    loads = needs.vllm_loads
    if needs.vllm_field is None or loads is None or not cpu_build():
        return
    refusal = cpu_refusal(model_config(model_path if loads == needs.model else resolve(loads)[0]))
    if refusal is not None:
        raise NotAvailable(f"{refusal}: set {needs.vllm_field} to 'hf' (transformers)")


def model_config(model_path: str) -> dict[str, Any] | None:
    """The config.json of a local model directory, or of a hub id (fetched alone, into the cache the
    model loads from); None where there is none to read."""
    from trainer.memory_plan import read_model_config

    if model_path.startswith("/"):
        return read_model_config(model_path)
    try:  # a hub id: its config.json alone (HF_HUB_OFFLINE and the cache are honoured)
        import json

        from huggingface_hub import hf_hub_download

        with open(hf_hub_download(model_path, "config.json"), encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except Exception:  # offline, gated, no such file: the load will say why
        return None


def _visible_gpu_gib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return float(torch.cuda.get_device_properties(0).total_memory) / 1024**3


def build_tiny(ref: str, artifact_dir: str) -> str:
    """'tiny:<layers>x<width>': a fresh tiny Qwen2 with a character tokenizer (built once, cached)."""
    import torch.distributed as dist

    from trainer.tiny import build_tiny_model

    shape = tiny_shape(ref)
    assert shape is not None  # the spec checked the ref
    layers, width = shape["num_hidden_layers"], shape["hidden_size"]
    target = Path(artifact_dir).resolve() / "models" / f"tiny-{layers}x{width}"
    # Under Ray Train the ranks' process group exists before the job's code runs, and transformers
    # then writes a model on rank 0 alone: rank 0 builds it, the others wait for it
    grouped = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if not (target / "config.json").exists() and (not grouped or dist.get_rank() == 0):
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        build_tiny_model(tmp, hidden_size=width, layers=layers, heads=shape["num_attention_heads"])
        try:
            tmp.rename(target)
        except OSError:  # another job (or rank) built it meanwhile
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    if grouped:
        dist.barrier()
    return str(target)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if world_size() > 1:  # a rank: it goes when its launcher goes (killed with the worker)
        die_with_parent()
        if os.getppid() == 1:
            return EXIT_ERROR
    return run_rank(argv[1], argv[2], int(argv[3]))


def run_rank(job_id: str, owner: str, attempt: int) -> int:
    """One rank of the job (the only one, in a plain job process), in this process: also what a
    Ray Train worker runs (worker.ray_train), with RANK and WORLD_SIZE set by Ray Train."""
    settings = get_settings()
    out = attempt_dir(settings.artifact_dir, job_id, attempt)
    out.mkdir(parents=True, exist_ok=True)
    code = _main(job_id, owner, attempt, settings, error_file(out))
    if is_main():
        AttemptDir(out).exit_code.write_text(str(code))
    return code


def _main(job_id: str, owner: str, attempt: int, settings: Settings, err_file: Path) -> int:
    err_file.unlink(missing_ok=True)
    apply_thread_count()  # the worker's share of the cores for this job (runtime/cpu_threads.py)
    try:
        return run(job_id, owner, attempt)
    except Drained:
        return EXIT_DRAINED
    except LeaseLost as exc:
        err_file.write_text(str(exc))
        return EXIT_LOST
    except StopRequested:  # Cancelled
        return EXIT_STOPPED
    except NotAvailable as exc:
        err_file.write_text(str(exc))
        if is_main():
            fence = Fence(owner, attempt, AttemptDir(err_file.parent).rejected_writes)
            try:
                DatabaseSink(settings.database.url, job_id, "", fence=fence).event(
                    exc.event, str(exc), level="error", data=exc.data
                )
            except LeaseLost:
                return EXIT_LOST
        return EXIT_UNAVAILABLE
    except Exception as exc:
        traceback.print_exc()  # the job's log; its error says what failed in words (no SQL, no trace)
        err_file.write_text(f"{type(exc).__name__}: {error_text(exc)}")
        return EXIT_ERROR


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit now: everything the job reports is committed, and interpreter shutdown would wait
    # on helper processes (vLLM's engine core) that the supervisor reaps with the process group.
    os._exit(code)
