"""Service settings (pydantic-settings), read from MATHRL_* environment variables.

Nested blocks use a double underscore: MATHRL_DATABASE__URL, MATHRL_WORKER__LEASE_SECONDS. The blocks
of what runs jobs (worker, vllm, ray, memory) are in config/worker_settings.py.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from config.worker_settings import MemorySettings, RaySettings, VLLMSettings, WorkerSettings
from mathrl.paths import default_data_dir


class DatabaseSettings(BaseModel):
    url: str = Field("sqlite:///./.mathrl/mathrl.db", description="SQLAlchemy URL (postgresql+psycopg://...).")


class BrokerSettings(BaseModel):
    url: str = Field("redis://127.0.0.1:6379/0", description="Celery broker URL (redis:// or sqla+sqlite://).")
    visibility_timeout: int = Field(3600, description="Redis: seconds before an unacked message is redelivered.")


class AuthSettings(BaseModel):
    admin_token: str | None = Field(None, description="Operator token that may create projects and their keys.")
    key_prefix: str = "mrl_"
    cache_seconds: float = Field(2.0, description="How long an API process trusts a key it has checked.")
    default_key_days: int = Field(
        90,
        ge=0,
        le=3650,
        description="Days a new key lives when its creator gives no expires_in_days (0: keys never expire by default).",
    )


class LimitsSettings(BaseModel):
    """Per-project quotas (checked on every job submission, on the resolved config) and the
    per-key rate limit. A quota refusal is a 4xx problem naming the field and the limit."""

    max_active_jobs: int = Field(50, ge=1, description="Jobs a project may have waiting, queued or running at once.")
    max_active_gpus: int = Field(64, ge=0, description="Sum of resources.gpus over a project's active jobs.")
    max_steps: int = Field(1_000_000, ge=1, description="Optimizer steps one training job may ask for (max_steps).")
    max_generations_per_step: int = Field(
        8192,
        ge=1,
        description="Completions generated per step: a GRPO job's resolved global batch (and num_generations), "
        "an eval's sampling.n, a reward-model job's samples_per_question.",
    )
    max_tokens: int = Field(
        32768,
        ge=1,
        description="Tokens in one sequence: GRPO max_prompt_length + max_completion_length, sampling.max_new_tokens, "
        "max_length of sft and reward-model jobs.",
    )
    max_checkpoints_per_job: int = Field(
        1000,
        ge=1,
        description="Checkpoints one training job may save (max_steps / save_steps): each is a copy of its weights "
        "and optimizer state on the artifact volume every project shares (save_steps 1 over 100,000 steps filled it).",
    )
    rate_per_second: float = Field(
        50.0, gt=0, description="Requests per second per API key (token bucket, per API process; health routes exempt)."
    )
    burst: int = Field(200, ge=1, description="Requests a key may make at once before the rate applies.")
    rate_per_project_per_second: float = Field(
        150.0,
        gt=0,
        description="Requests per second all keys of one project may make together (token bucket, per API "
        "process): more keys do not buy a project more of the service.",
    )
    burst_per_project: int = Field(600, ge=1, description="Requests all keys of one project may make at once.")
    max_keys_per_project: int = Field(
        100,
        ge=1,
        description="Live (neither revoked nor expired) API keys one project may hold; POST /v1/keys past it is 409.",
    )
    max_streams_per_key: int = Field(
        100, ge=1, description="Event streams (SSE) one API key may hold open at once, per API process."
    )
    max_streams_per_project: int = Field(
        300,
        ge=1,
        description="Event streams (SSE) all keys of one project may hold open at once, per API process.",
    )
    rate_per_address_per_second: float = Field(
        10.0,
        gt=0,
        description="Requests per second per client address that come without a valid key (missing, unknown, "
        "revoked or expired): a token bucket per API process; over it, 429 (no key lookup).",
    )
    burst_per_address: int = Field(
        100, ge=1, description="Requests without a valid key one client address may make at once."
    )


class FilesSettings(BaseModel):
    """POST /v1/files: uploaded training and validation files (JSONL), stored per project under
    the artifact directory and checked at upload (mathrl/jsonl_files.py)."""

    max_file_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="The largest file one upload may carry.")
    max_project_bytes: int = Field(
        1024 * 1024 * 1024, ge=1024, description="All of a project's stored files together; past it, 413."
    )
    max_project_files: int = Field(1000, ge=1, description="Files a project may store at once.")
    max_lines: int = Field(1_000_000, ge=1, description="Lines (examples) in one file.")


class FineTuningSettings(BaseModel):
    """POST /v1/fine_tuning/jobs (api/routers/openai_fine_tuning.py): what OpenAI's API leaves to
    the service, which the operator chooses here."""

    generation_backend: Literal["auto", "vllm", "hf"] = Field(
        "auto",
        description="How reinforcement jobs generate: 'auto' (vLLM, colocated, for a job on GPUs, hf where that "
        "worker has no vLLM; transformers for a job on the CPU: generation.backend in mathrl/specs/grpo.py), "
        "'vllm' (vLLM's CPU build too), 'hf'.",
    )
    inference_backend: Literal["auto", "vllm", "hf"] = Field(
        "auto",
        description="What answers POST /v1/chat/completions and /v1/completions for 'ft:' models, and the grading "
        "models of score_model and label_model graders: 'auto' (the worker's warm vLLM engine where it has vLLM, "
        "else transformers), 'vllm', 'hf'.",
    )
    inference_timeout_seconds: float = Field(
        570.0,
        gt=0,
        le=3600,
        description="How long a completion call waits for its job before a 504 (and a cancel); under the "
        "client's read timeout where it sends one (x-stainless-read-timeout, the openai SDK's: 600 s by "
        "default), so that the client reads the 504 rather than timing out and sending the call again.",
    )
    model_aliases: dict[str, str] = Field(
        default_factory=dict,
        description="Model names a fine-tuning request may give -> the model mathrl trains for it (a hub id, a "
        'path under a model root), e.g. {"o4-mini-2025-04-16": "Qwen/Qwen2.5-1.5B-Instruct"}, so that a '
        "script written for OpenAI keeps its model string (MATHRL_FINE_TUNING__MODEL_ALIASES as JSON; the chart: "
        "fineTuning.modelAliases). An OpenAI model's name that is not listed is refused at create (400).",
    )


class SessionsSettings(BaseModel):
    """The Tinker API's training and sampling clients (api/routers/tinker.py; kind `session`)."""

    heartbeat_timeout_seconds: int = Field(
        120,
        ge=20,
        le=86_400,
        description="A session job ends itself (and frees its worker and GPU) when its client sent no call and no "
        "heartbeat for this long. The SDK sends a heartbeat every 10 s while the client lives.",
    )
    warm_engine: bool = Field(
        False,
        description="Sessions sample on their worker's warm vLLM engine of the base model where it has one idle "
        "(LoRA on; not with an lm_head adapter; CPU sessions only), else with transformers in the session's process. "
        "Off by default: on a CPU the engine's LoRA sampling measured 1.09x transformers' speed at 8 x 64 tokens "
        "and 0.55x at 32 x 32 (bench/tinker_sampling.py, docs/tinker.md).",
    )
    max_call_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="The largest body of a Tinker forward_backward call (POST /api/v1/forward_backward), where "
        "other requests may carry max_request_bytes: the SDK sends a batch in chunks of up to about 5 MB of data, "
        "which its JSON encoding makes larger, and cannot be told to send smaller ones.",
    )


class GradersSettings(BaseModel):
    """POST /v1/graders:run for the graders the API runs itself (all but reward models): each call
    grades in its own short-lived process (evaluator/bounded.py), killed at these limits, so one
    call's slow input cannot hold up or fail another's. Per API process, as the rate limit is."""

    max_concurrent_per_project: int = Field(
        4, ge=1, description="Grading calls one project may have in flight at once; the next is 429 with Retry-After."
    )
    max_concurrent: int = Field(
        16,
        ge=1,
        description="Grading calls in flight at once, all projects together; the next is 503 with Retry-After.",
    )
    timeout_seconds: float = Field(
        30.0, gt=0, description="A call's wall-clock limit: past it, its process is killed and the call is 504."
    )
    item_timeout_seconds: float = Field(
        5.0,
        gt=0,
        description="One item's limit: an item with no score by then is killed with its process and scored 0 "
        "('took over ...'); a fresh process goes on with the next item.",
    )
    cpu_seconds_per_call: float = Field(
        30.0, gt=0, description="CPU seconds a call's processes may use together (RLIMIT_CPU); past it, 504."
    )
    memory_mb_per_call: int = Field(
        2048, ge=256, description="Address space of a call's process, in MiB (RLIMIT_AS): past it, that item fails."
    )
    python_cpu_seconds: int = Field(
        4, ge=1, le=600, description="A python grader's CPU seconds per call (RLIMIT_CPU in its sandbox)."
    )
    python_memory_mb: int = Field(
        512, ge=64, description="A python grader's address space in MiB (RLIMIT_AS in its sandbox)."
    )
    python_file_mb: int = Field(16, ge=1, description="The largest file a python grader may write, in MiB.")
    python_sandbox: Literal["kernel", "audit-hook"] = Field(
        "kernel",
        description="Where python graders run. 'kernel': behind bubblewrap's namespaces, never as root, or not at "
        "all (503 naming what to install); 'audit-hook': behind the in-interpreter audit hook alone, which is no "
        "security boundary: only for a single-user install (evaluator/sandbox.py, RELIABILITY.md).",
    )

    pool_url: str | None = Field(
        None,
        description="A grading pool (`mathrl-server grading-pool`; the chart's `grading` block) that runs python "
        "graders for this process, e.g. http://mathrl-grading:8100. Unset: they run on this machine.",
    )
    pool_token: str | None = Field(
        None,
        description="The token a grading pool requires of its callers (the API and workers), and that the pool "
        "itself checks (its only secret: a pool holds no database or broker credentials).",
    )
    pool_concurrency: int = Field(
        4, ge=1, description="A grading pool's sandboxes at once; a call past it waits its turn."
    )

    def sandbox(self) -> Any:
        """The python grader's sandbox limits for one item (evaluator/sandbox.py), inside its item limit."""
        from evaluator.sandbox import SandboxLimits

        return SandboxLimits(
            cpu_seconds=self.python_cpu_seconds,
            memory_mb=self.python_memory_mb,
            file_mb=self.python_file_mb,
            wall_seconds=max(0.5, self.item_timeout_seconds - 0.5),
            mode=self.python_sandbox,
            pool_url=self.pool_url,
            pool_token=self.pool_token,
        )


class SourcesSettings(BaseModel):
    """Where models and datasets may come from. Checked before a job is stored, so nothing is
    fetched for a refused source. Hub ids ('org/name') and 'job:<id>' refs are always allowed."""

    model_roots: list[str] = Field(
        default_factory=lambda: ["./.mathrl/models"],
        description="Directories local model paths must lie under. The artifact directory and the model cache are "
        "never reachable by a path, whatever the roots: a project names its own models by 'job:<id>' or 'ft:...'.",
    )
    data_roots: list[str] = Field(
        default_factory=list,
        description="Directories user dataset files must lie under (data_dir is always allowed). The artifact "
        "directory (uploaded files included) is never reachable by a path: a project names its own files by "
        "'file-...'.",
    )
    cache_dirs: list[str] = Field(
        default_factory=lambda: ["/var/cache/mathrl"],
        description="The workers' caches (HF_HOME, the Triton and vLLM caches under /var/cache/mathrl in the images "
        "and the chart: every project's hub downloads and prepared datasets). Never reachable by a path, like the "
        "artifact directory; nor is the API's own HF_HOME. Set it where workers keep theirs elsewhere.",
    )
    allowed_url_prefixes: list[str] = Field(
        default_factory=list,
        description="http(s) URL prefixes a dataset path may start with; the host must also not be a private, "
        "loopback or link-local address.",
    )
    trust_remote_code_models: list[str] = Field(
        default_factory=list,
        description="Model refs (hub ids or paths) that may run their own modelling code (trust_remote_code); "
        "a job spec cannot ask for it.",
    )
    hub_token_repos: list[str] = Field(
        default_factory=list,
        description="Hub repositories (fnmatch patterns over 'org/name', models and datasets, e.g. 'my-org/*') "
        "that workers fetch with the operator's hub token (HF_TOKEN). Every other hub id a job names is fetched "
        "without it, so no project reads the private or gated repositories the token can (worker/hub_access.py).",
    )


class TrackingSettings(BaseModel):
    """Runs mirrored to an MLflow tracking server (worker/tracking.py): the supervisor of each job
    copies its resolved configuration (params), its metrics by step and its scores from the database
    into a run of the experiment '<experiment_prefix>/<project name>', tagged with the job id. Workers
    only; they need the `mlflow` extra (mlflow-skinny). A tracker that is down never fails a job:
    failed calls are counted and shown in the job's events."""

    mlflow_uri: str | None = Field(
        None,
        description="The MLflow tracking URI the workers log to (http://mlflow.mlflow.svc:5000; credentials, if "
        "any, in MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD). Unset: runs are not mirrored.",
    )
    ui_url: str | None = Field(
        None, description="The MLflow UI as users reach it, for the link from a job to its run; default: mlflow_uri."
    )
    mathrl_url: str | None = Field(
        None,
        description="mathrl's API and pages as users reach them (https://mathrl.example.com): each run links back to "
        "its job's page, <url>/ui/jobs/<id> (tag mathrl.job_url). Unset: the run carries the job id only.",
    )
    experiment_prefix: str = Field(
        "mathrl", min_length=1, description="Each project's runs go to the experiment '<prefix>/<project name>'."
    )
    flush_seconds: float = Field(
        5.0, gt=0, description="How often a running job's new metrics are sent to MLflow (one batch call)."
    )
    request_timeout_seconds: float = Field(
        5.0,
        gt=0,
        description="Timeout of one call to MLflow (no retries inside it: the next flush tries again, less often "
        "while MLflow keeps failing, up to once a minute).",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MATHRL_", env_nested_delimiter="__", extra="ignore")

    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    graders: GradersSettings = Field(default_factory=GradersSettings)
    files: FilesSettings = Field(default_factory=FilesSettings)
    fine_tuning: FineTuningSettings = Field(default_factory=FineTuningSettings)
    sessions: SessionsSettings = Field(default_factory=SessionsSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    sources: SourcesSettings = Field(default_factory=SourcesSettings)
    ray: RaySettings = Field(default_factory=RaySettings)
    vllm: VLLMSettings = Field(default_factory=VLLMSettings)
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)
    artifact_dir: str = Field("./.mathrl/artifacts", description="Checkpoints and per-item results.")
    data_dir: str = Field(default_factory=default_data_dir, description="Offline dataset copies.")
    max_request_bytes: int = 1_000_000
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Addresses (or CIDRs) of the proxies whose X-Forwarded-For and X-Forwarded-Proto the API "
        "believes (uvicorn's forwarded_allow_ips). Empty, the default: none, not even loopback, so a client "
        "cannot pick the address its bad-key requests are counted against (the chart: api.trustedProxies).",
    )


@lru_cache
def get_settings() -> Settings:
    return Settings()
