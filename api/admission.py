"""Admission: what a job may use and how much, checked before anything is stored or fetched.

`admit_spec(spec, settings)` checks one job (sources, benchmarks, per-job limits on its config,
resolved here once and returned for the job row); `check_project_quota` checks a whole submission
(one job, or a pipeline's) against the project's quotas, with one read of the project's counters
after the rows are inserted. api/submit.py calls both for every route that creates jobs. They raise
a `Problem` (422 for a source or a per-job limit, a 429 `QuotaProblem` for a project quota) whose
`errors[]` point at the field. Nothing is fetched: paths are resolved lexically (plus symlinks), URL
hosts checked as literal addresses or by DNS. RELIABILITY.md, "Abuse"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.problems import Problem
from config.settings import Settings
from config.sources import storage_dirs, url_refusal
from kinds import home, resolve_config
from mathrl.specs import AnySpec, DatasetRef, model_refs, split_job_ref
from mathrl.specs.resolved import ResolvedConfig
from runtime.errors import Refused
from store.models import Project


def admit_spec(spec: AnySpec, settings: Settings) -> ResolvedConfig:
    """Refuse the job unless its sources are allowed and it is within the per-job limits;
    return its resolved config (every hyperparameter as the run will use it)."""
    check_sources(spec, settings)
    check_benchmarks(spec)
    kind = home(spec)  # kinds/<kind>.py
    config = resolve_config(spec)
    try:
        kind.admit(spec, config, settings)
    except Refused as exc:
        raise Problem.at(f"/{exc.field}", str(exc), exc.title) from None
    check_job_limits(spec, config, settings)
    check_placement(spec, settings)
    check_memory(spec, config, settings)
    check_engine_fit(spec, settings)
    check_tool_format(spec, settings)
    return config


def check_tool_format(spec: AnySpec, settings: Settings) -> None:
    """`tools.format: chat-template` (or a chat's `function_tools`) on a model whose chat template never
    reads `tools`, refused at that field when the template can be read now: a 'tiny:' ref's (plain
    ChatML), or the tokenizer files of a model the API can see (known_model_dir). The worker checks the
    rest before the job generates (evaluator/function_calls.py: the template must render the calls and
    TRL parse them)."""
    tools, functions = getattr(spec, "tools", None), getattr(spec, "function_tools", None)
    model = home(spec).needs(spec).model
    if tools is not None and tools.format == "chat-template":
        field, fix = "/tools/format", "use format 'code-blocks', or a model whose chat template carries tools"
    elif functions:  # a chat's functions (OpenAI's tools: evaluator/function_calls.py)
        field, fix = "/function_tools", "call it without tools, or a model whose chat template carries tools"
    else:
        return
    if model is None:
        return
    if model.startswith("tiny:"):
        template: str | None = ""  # trainer/tiny.py CHAT_TEMPLATE: messages only
    else:
        root = known_model_dir(model, settings)
        template = read_chat_template(root) if root is not None else None
    if template is not None and "tools" not in template:
        detail = (
            f"the chat template of {model!r} renders no tools, so the model has no tool calls to make: {fix} "
            "(Qwen2.5, Qwen3, SmolLM3)"
        )
        raise Problem.at(field, detail, "Model has no tool calls")


def read_chat_template(root: Path) -> str | None:
    """A local model's chat template (chat_template.jinja, or tokenizer_config.json's); '' for a model
    with tokenizer files and no template; None when its tokenizer files are not there (yet)."""
    try:
        if (root / "chat_template.jinja").is_file():
            return (root / "chat_template.jinja").read_text(encoding="utf-8")
        config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # named templates: any of them
        return "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else ""


def check_engine_fit(spec: AnySpec, settings: Settings) -> None:
    """A job on the CPU that names vLLM (its kind's `vllm_field`) for a model vLLM's CPU build cannot
    run (evaluator.backends.vllm.cpu_refusal: its attention head size), refused at that field, when the
    model's shape is known now: a 'tiny:' ref's, or a config.json the API can read (known_model_config).
    Else the worker checks before it starts an engine; a backend 'auto' is not refused: the worker
    answers on transformers instead, and says so in an event (worker.supervisor)."""
    from evaluator.backends.vllm import cpu_refusal
    from mathrl.modelref import tiny_shape

    needs = home(spec).needs(spec)
    model, field = needs.vllm_loads, needs.vllm_field
    if field is None or model is None or spec.resources.gpus > 0:
        return
    refusal = cpu_refusal(tiny_shape(model) or known_model_config(model, settings))
    if refusal is not None:
        detail = f"{refusal}: set {field} to 'hf' (transformers)"
        raise Problem.at("/" + field.replace(".", "/"), detail, "Model does not fit vLLM's CPU build")


def check_placement(spec: AnySpec, settings: Settings) -> None:
    """A named pool is one the operator runs (settings worker.pools, ray.pools): any other name would
    wait for a worker that never comes, or write to a key the broker keeps itself. A job for the Ray
    cluster needs one configured, and no more GPUs per node than its nodes have. Configuration only:
    Ray is not asked on a submit (a dead address fails the job)."""
    pool, ray = spec.resources.pool, settings.ray
    if pool is not None and pool not in settings.worker.pools and pool not in ray.pools:
        names = ", ".join(sorted({*settings.worker.pools, *ray.pools})) or "none"
        detail = (
            f"resources.pool {pool!r} is not a pool this server runs (its pools: {names}): name one of those, or "
            "drop pool to queue by resources.gpus ('cpu' or 'gpu-N')"
        )
        raise Problem.at("/resources/pool", detail, "Unknown pool")
    queue, pools = spec.resources.queue, settings.worker.pools
    if spec.resources.gpu_type and pools and queue not in pools and not ray.runs(spec):
        # the chart lists every queue its workers consume: a card no pool has would wait for ever
        typed = ", ".join(sorted(q for q in pools if q.startswith("gpu-"))) or "none"
        detail = (
            f"no worker pool here takes {queue!r} (resources.gpus={spec.resources.gpus} on gpu_type "
            f"{spec.resources.gpu_type!r}; its GPU queues: {typed}): ask for a card and a GPU count one of them has"
        )
        raise Problem.at("/resources/gpu_type", detail, "Unknown GPU type")
    if not ray.runs(spec):
        return
    nodes, gpus = spec.resources.nodes, spec.resources.gpus
    if ray.address is None:
        detail = (
            f"resources.nodes={nodes} runs on a Ray cluster, and this server has none configured "
            "(MATHRL_RAY__ADDRESS): set nodes to 1, or ask the operator to configure one"
        )
        raise Problem.at("/resources/nodes", detail, "No Ray cluster")
    if ray.gpus_per_node is not None and gpus > ray.gpus_per_node:
        detail = (
            f"resources.gpus={gpus} is per node, and the Ray cluster's nodes have {ray.gpus_per_node} GPUs each: "
            f"ask for at most {ray.gpus_per_node} and spread the job over more nodes (resources.nodes)"
        )
        raise Problem.at("/resources/gpus", detail, "Too many GPUs per node")


def held_gpus(spec: AnySpec, settings: Settings) -> int:
    """What a job holds against its project's GPU quota while active: its GPUs on each of its nodes,
    and in a pool of GPU workers at least one job slot's GPUs (settings worker.pools), which no one
    else can use while it runs, however few of them it asked for."""
    resources = spec.resources
    slot = 0 if settings.ray.runs(spec) else settings.worker.pools.get(resources.pool or "", 0)
    return max(resources.gpus, slot) * resources.nodes


def check_memory(spec: AnySpec, config: ResolvedConfig, settings: Settings) -> None:
    """The memory plan of a job on GPUs whose kind has one (trainer/memory_plan.py), when the model's
    config.json can be read now: a local path, or another job's model already saved on the artifact
    volume. It is stored in the config (`memory_plan`); one over the GPU memory of the job's pool
    (settings.memory) is refused, with what would fit. A hub id, or a model not saved yet (a
    pipeline's earlier step), is checked by the worker before the model loads (worker.child)."""
    from trainer.memory_plan import check_job

    training, model = home(spec).memory(config), home(spec).needs(spec).model
    if training is None or model is None or spec.resources.gpus == 0:
        return
    model_config = known_model_config(model, settings)
    if model_config is None:
        return
    try:
        plan, refusal = check_job(training, model_config, settings.memory.for_queue(spec.resources.queue))
    except ValueError as exc:  # a config.json this estimate cannot read: left to the run
        config.memory_plan = {"estimate_gib": None, "notes": [str(exc)]}
        return
    config.memory_plan = plan.record()
    if refusal is not None:
        errors = [{"pointer": pointer, "detail": detail} for pointer, detail in refusal.errors]
        raise Problem(422, "Does not fit in GPU memory", refusal.detail, errors)


def known_model_config(ref: str, settings: Settings) -> dict[str, Any] | None:
    """config.json of a model the API can see: a local path (check_sources has put it under a root),
    or 'job:<id>[@final|@step-N]' whose model is saved under the artifact directory (where the
    worker's sink moves it: <artifact_dir>/jobs/<id>/train/final or checkpoint-N). Nothing is
    fetched; None when it is not there (yet)."""
    from trainer.memory_plan import read_model_config

    root = known_model_dir(ref, settings)
    return read_model_config(root) if root is not None else None


def known_model_dir(ref: str, settings: Settings) -> Path | None:
    """Where the files of a model the API can see lie (known_model_config), or None."""
    if ref.startswith("/"):
        return Path(ref)
    target, which = split_job_ref(ref)
    if not target or "/" in target or target.startswith("."):
        return None
    train = Path(settings.artifact_dir).expanduser().resolve() / "jobs" / target / "train"
    if which.startswith("@step-"):
        return train / f"checkpoint-{which.removeprefix('@step-')}"
    return train / "final"


# --- sources ---------------------------------------------------------------------------


def _roots(settings: Settings, extra: list[str]) -> list[Path]:
    """The operator's roots for raw paths, and the offline dataset copies (data_dir). The
    service's own storage is never one of them: see _service_storage."""
    roots = [*extra, settings.data_dir]
    return [Path(r).expanduser().resolve() for r in roots if r]


def _service_storage(settings: Settings) -> list[Path]:
    """config.sources.storage_dirs, this process's view."""
    return storage_dirs(settings.artifact_dir, settings.sources.cache_dirs)


def _refuse(pointer: str, detail: str) -> Problem:
    return Problem.at(pointer, detail, "Source not allowed")


def _under_roots(value: str, roots: list[Path], pointer: str, what: str, settings: Settings) -> None:
    """A local path (or file:// URL) must resolve, symlinks and '..' included, under a root and
    outside the service's own storage. The refusal names no path of this server's."""
    raw = unquote(urlsplit(value).path) if value.startswith("file:") else value
    if value.startswith("file:") and urlsplit(value).netloc not in ("", "localhost"):
        raise _refuse(pointer, f"{value!r}: a file:// URL must name a local file (file:///path)")
    refs = (
        "'job:<id>' or an 'ft:' model name for a model this project trained"
        if what == "model"
        else "an uploaded file's id ('file-...') for a file of this project"
    )
    if "\x00" in raw:  # no file's name holds one (and Path.resolve raises on it)
        raise _refuse(pointer, f"{value!r} holds a NUL character, which no path can: remove it")
    if "::" in raw:  # fsspec (datasets' file access) reads 'a::b' as a chain: b, a file system holding a
        raise _refuse(pointer, f"{value!r} holds '::', which chains file systems: name one plain file")
    if not raw.startswith("/"):  # './x', 'x', '~/x': relative to this server's process, not to anything of yours
        raise _refuse(
            pointer,
            f"{value!r} is a relative path, which would resolve against the API server's own working directory: "
            f"give an absolute path under one of the operator's {what} roots, or {refs}",
        )
    resolved = Path(raw).resolve()
    if any(resolved.is_relative_to(d) for d in _service_storage(settings)):
        raise _refuse(pointer, f"{value!r} is in the service's own storage, which no path may name: use {refs}")
    if not any(resolved.is_relative_to(root) for root in roots):
        raise _refuse(
            pointer,
            f"{value!r} is outside the {what} roots this server allows: use a hub id, {refs}, "
            "or ask the operator which roots hold shared files",
        )


def check_url(value: str, settings: Settings, pointer: str) -> None:
    if (why := url_refusal(value, settings.sources.allowed_url_prefixes)) is not None:
        raise _refuse(pointer, why)


def check_model_source(value: str | None, settings: Settings, pointer: str) -> None:
    if value is None or value.startswith(("job:", "tiny:")):
        return  # another job's output (checked against the project by the worker) or a fresh tiny model
    if "://" in value or value.startswith("file:"):
        raise _refuse(pointer, f"{value!r}: models load from a hub id, a path under a model root, or 'job:<id>'")
    if value.startswith(("/", "./", "../", "~")):
        _under_roots(value, _roots(settings, settings.sources.model_roots), pointer, "model", settings)
    # anything else is a hub id ('org/name'), which the spec already checked syntactically


def check_data_source(value: str | None, settings: Settings, pointer: str) -> None:
    if value is None:
        return
    if value.startswith(("http://", "https://")) or ("://" in value and not value.startswith("file:")):
        check_url(value, settings, pointer)
        return
    _under_roots(value, _roots(settings, settings.sources.data_roots), pointer, "data", settings)


def check_sources(spec: AnySpec, settings: Settings) -> None:
    for path, ref in model_refs(spec).items():  # the model, the policy, reward models, graders' models
        check_model_source(ref, settings, f"/{path}")
    dataset = home(spec).data(spec).dataset
    if dataset is not None:
        check_data_source(dataset.path, settings, "/dataset/path")
        check_dataset_fields(dataset)


def check_dataset_fields(dataset: DatasetRef) -> None:
    """A local file must hold the fields the spec names: a JSON-lines file's first row is read
    now, a parquet file's schema (its footer). The API reads no URL and no hub dataset (the
    worker checks those before any work); a file the API cannot see (on the workers' volume
    only) is left to the worker too."""
    path = dataset.path
    if path is None or "://" in path and not path.startswith("file:"):
        return
    raw = Path(unquote(urlsplit(path).path) if path.startswith("file:") else path)
    if raw.suffix not in (".jsonl", ".json", ".parquet") or not raw.is_file():
        return
    if raw.suffix == ".parquet":
        fields = _parquet_fields(raw, path)
    else:
        try:
            with raw.open(encoding="utf-8") as f:
                first = next((line for line in f if line.strip()), "")
            if raw.suffix == ".json" and first.lstrip().startswith("["):
                return  # a JSON array of rows (datasets reads those too): the worker checks its fields
            row = json.loads(first) if first else {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            detail = f"{path!r}: its first row is not JSON ({exc}): give a JSON-lines file"
            raise _refuse("/dataset/path", detail) from None
        if not isinstance(row, dict):
            raise _refuse("/dataset/path", f"{path!r}: its rows must be JSON objects")
        fields = [str(k) for k in row]
        if dataset.format == "messages":  # OpenAI's chat lines: no question or answer field to name
            from mathrl.jsonl_files import check_line

            if bad := check_line(row):
                detail = f"{path!r}: its first line is not a chat in OpenAI's format: {bad[0][0]}: {bad[0][1]}"
                raise _refuse("/dataset/path", detail)
            return
        if dataset.format == "items":  # OpenAI's evals lines: the prompt is the template, filled from the item
            from mathrl.jsonl_files import check_item_line

            if bad := check_item_line(row):
                detail = f"{path!r}: its first line is not an item in OpenAI's evals format: {bad[0][0]}: {bad[0][1]}"
                raise _refuse("/dataset/path", detail)
            return
    for field in ("question_field", "answer_field"):
        name = getattr(dataset, field)
        if name not in fields:
            has = ", ".join(sorted(fields)) or "none"
            pointer = f"/dataset/{field}"
            detail = f"{path!r} has no field {name!r} (its fields: {has}): set {field} to one of them"
            raise Problem.at(pointer, detail, "Dataset lacks a field")


def _parquet_fields(raw: Path, path: str) -> list[str]:
    from api.parquet_footer import ParquetError, parquet_columns

    try:
        return parquet_columns(raw)
    except (ParquetError, OSError) as exc:  # not parquet, or a damaged footer
        raise _refuse("/dataset/path", f"{path!r}: not a readable parquet file ({exc})") from None


# --- registered benchmarks -------------------------------------------------------------------


def check_benchmarks(spec: AnySpec) -> None:
    """Registered names must exist now: an unknown one was accepted (201) and failed the job later."""
    from evaluator.benchmarks import UnknownBenchmark, find_benchmark, get_benchmark

    def refuse(pointer: str, title: str, detail: str) -> Problem:
        return Problem.at(pointer, detail, title)

    data = home(spec).data(spec)
    dataset, heldout = data.dataset, data.heldout
    try:
        if dataset is not None and dataset.name is not None:
            pointer = "/dataset/name"
            find_benchmark(dataset.name, dataset.split)
        elif data.benchmark is not None:
            pointer = "/benchmark"
            get_benchmark(data.benchmark)
        if heldout is not None and heldout.benchmark is not None:
            pointer = "/eval/benchmark"
            get_benchmark(heldout.benchmark)
    except UnknownBenchmark as exc:
        detail = (
            f"{exc}. Use one of these, or give dataset.path (a file under a data root) "
            "or dataset.hub (a hub dataset id)"
        )
        raise refuse(pointer, "Unknown benchmark", detail) from None
    except ValueError as exc:  # a registered name without that split
        raise refuse("/dataset/split", "Unknown split", f"{exc}: pick one of those") from None


# --- per-job limits (on the resolved config: presets fill values) ---------------------------


def check_job_limits(spec: AnySpec, config: ResolvedConfig, settings: Settings) -> None:
    """The job's values its kind holds to this server's per-job limits (kinds/<kind>.py `limits`)."""
    for limit in home(spec).limits(spec, config):
        cap: int = getattr(settings.limits, limit.limit)
        if limit.value is not None and limit.value > cap:
            raise Problem.at(limit.pointer, limit.refusal(cap), "Over a limit")


# --- project quotas ----------------------------------------------------------------------


class QuotaProblem(Problem):
    """A quota refusal, with the submission's key (a pipeline step; "" for a single job) at
    which the project crossed it."""

    def __init__(self, key: str, detail: str, pointer: str) -> None:
        super().__init__(429, "Quota exceeded", detail, [{"pointer": pointer, "detail": detail}])
        self.key = key


def check_project_quota(session: Session, project_id: str, added: list[tuple[str, int]], settings: Settings) -> None:
    """A submission's jobs (`added`: each one's step key and GPUs, in the order they were added)
    within the project's quotas. Called after their rows are inserted and just before the commit:
    the insert's trigger has raised the project's counters (store.models.Project.active_jobs) and
    holds the project row's lock until the commit, so concurrent submissions queue for that row
    only over the few statements left, and none can take a slot another has counted. One row
    read, whatever the number of active jobs."""
    limits = settings.limits
    counted = session.execute(select(Project.active_jobs, Project.active_gpus).where(Project.id == project_id)).one()
    active = int(counted[0]) - len(added)  # the project's count before this submission
    gpus = int(counted[1]) - sum(g for _, g in added)
    for key, job_gpus in added:
        if active + 1 > limits.max_active_jobs:
            detail = (
                f"your project has {active} active (waiting, queued or running) jobs and may have "
                f"{limits.max_active_jobs}: wait for some to finish or cancel some"
            )
            raise QuotaProblem(key, detail, "/")
        if gpus + job_gpus > limits.max_active_gpus:
            detail = (
                f"this job holds {job_gpus} GPUs (resources.gpus x nodes, and in a named pool at least one of its "
                f"job slots' GPUs), which would bring your project's active jobs to {gpus + job_gpus} GPUs; the "
                f"quota is {limits.max_active_gpus}: ask for fewer or wait for running jobs to finish"
            )
            raise QuotaProblem(key, detail, "/resources/gpus")
        active, gpus = active + 1, gpus + job_gpus
