"""Service settings (pydantic-settings), read from MATHRL_* environment variables.

Nested blocks use a double underscore: MATHRL_DATABASE__URL, MATHRL_WORKER__LEASE_SECONDS.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from evaluator.backends.base import EngineSettings
from mathrl.paths import default_data_dir
from mathrl.specs.base import POOL_NAME, QUEUE_LENGTH

# kombu's own keys in a Redis broker, beside the queues: a queue of this name breaks delivery for every queue
BROKER_KEYS = frozenset({"unacked"})


class DatabaseSettings(BaseModel):
    url: str = Field("sqlite:///./.mathrl/mathrl.db", description="SQLAlchemy URL (postgresql+psycopg://...).")


class BrokerSettings(BaseModel):
    url: str = Field("redis://127.0.0.1:6379/0", description="Celery broker URL (redis:// or sqla+sqlite://).")
    visibility_timeout: int = Field(3600, description="Redis: seconds before an unacked message is redelivered.")


class WorkerSettings(BaseModel):
    lease_seconds: float = Field(30.0, description="A claimed job's lease; renewed by the heartbeat.")
    heartbeat_seconds: float = Field(5.0, description="How often the supervisor renews the lease and checks cancel.")
    cancel_grace_seconds: float = Field(20.0, description="SIGTERM, then SIGKILL after this many seconds.")
    session_host: str = Field(
        "127.0.0.1",
        description="The address a session job (the Tinker API's clients) listens on, and the API reaches it "
        "at: 127.0.0.1 where the API and the worker share a machine; the pod's IP on a cluster (the chart sets it).",
    )
    drain_seconds: float = Field(
        120.0,
        ge=0,
        description="When the worker gets SIGTERM (a pod stopped): how long its running job has to save a "
        "checkpoint at its next step and stop before it is killed; either way the job goes back to the queue "
        "and resumes from its newest checkpoint. Keep it under the pod's terminationGracePeriodSeconds "
        "(the chart adds 30 s).",
    )
    fork_jobs: Literal["auto", "true", "false"] = Field(
        "auto",
        description="Start single-process jobs by forking a process that imported torch, transformers and TRL "
        "once (worker/job_forkserver.py): a job starts without its interpreter's start and imports (9.4 s for a "
        "training job, 3.9 s for an eval on a 2-core CPU). auto: where torch is a CPU build (a CUDA build's "
        "imports are not known here to leave the driver untouched, which a fork needs; jobs on GPUs are long "
        "enough not to notice); false: a fresh interpreter per job.",
    )
    job_slots: int = Field(
        1,
        ge=1,
        le=1024,
        description="Jobs this worker runs at once (`mathrl-server worker --concurrency` sets it): a job process "
        "computes with the worker's cores divided by it (runtime/cpu_threads.py).",
    )
    job_threads: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="CPU threads of each job process (OMP_NUM_THREADS); default: the cores the worker may use "
        "(affinity and the cgroup's CPU quota) divided by job_slots. Idle threads sleep (OMP_WAIT_POLICY=PASSIVE).",
    )
    pools: dict[str, int] = Field(
        default_factory=dict,
        description="The queues this service's workers consume, which a job may name as resources.pool -> GPUs "
        'of one job slot there (0: CPU), e.g. {"cpu": 0, "gpu-8": 8, "h100-vllm": 8} (MATHRL_WORKER__POOLS as '
        "JSON; the chart sets it from workerPools: each queue, gpus over concurrency). A job naming another pool "
        "is refused at submit (it would wait for a worker that never comes); a job in a pool holds at least one "
        "slot's GPUs against its project's quota, since a slot it takes is unusable by anyone else. Unset: "
        "resources.pool is refused, but for the Ray cluster's pools (ray.pools).",
    )
    reconcile_seconds: float = Field(15.0, description="How often the reconciler re-delivers lost jobs.")
    redeliver_after_seconds: float = Field(60.0, description="A queued job unclaimed this long is sent again.")
    warm_engines: int = Field(
        1,
        ge=0,
        description="vLLM engines this worker keeps warm between eval jobs with backend 'vllm' (one per model; "
        "worker/warm_engine.py). 0: each such job starts its own engine (minutes on a CPU).",
    )
    warm_engine_idle_seconds: float = Field(
        600.0, gt=0, description="A warm engine no eval job has used for this long is stopped."
    )
    warm_engine_start_seconds: float = Field(
        900.0,
        gt=0,
        description="How long a job given a warm engine waits for it to answer (a new engine on a CPU compiles "
        "for minutes) before it fails.",
    )
    warm_engine_max_model_len: int = Field(
        4096,
        ge=256,
        description="Context length of a warm engine (the model's own, at most this): an eval whose prompt plus "
        "max_new_tokens is longer loads an engine of its own instead.",
    )

    @field_validator("pools")
    @classmethod
    def _pool_names(cls, pools: dict[str, int]) -> dict[str, int]:
        for name, gpus in pools.items():
            if not POOL_NAME.fullmatch(name) or len(name) > QUEUE_LENGTH:
                raise ValueError(f"worker.pools: {name!r} is not a queue name (a-z, 0-9, '-'; {QUEUE_LENGTH} at most)")
            if name in BROKER_KEYS:
                raise ValueError(f"worker.pools: {name!r} is a key the broker keeps itself (kombu's): rename it")
            if gpus < 0:
                raise ValueError(f"worker.pools: {name!r} has {gpus} GPUs: give 0 (a CPU pool) or more")
        return pools


class VLLMSettings(BaseModel):
    """Every vLLM engine of ours: eval jobs' own and warm engines, GRPO's colocated engine and its
    server (MATHRL_VLLM__ENFORCE_EAGER=1 and so on)."""

    memory_fraction: float = Field(
        0.9, gt=0, le=1, description="A GPU engine's share of GPU memory, unless the job's spec sets one."
    )
    cpu_kv_gib: float = Field(
        2.0, gt=0, description="A CPU engine's KV cache in GiB (vLLM's own CPU rule leaves a small model too little)."
    )
    enforce_eager: bool = Field(
        False, description="No torch.compile: engines start sooner and step slower (compiled graphs are cached)."
    )

    def engine(self) -> EngineSettings:
        """What the evaluator and trainer take as an argument."""
        return EngineSettings(**self.model_dump())


class RaySettings(BaseModel):
    """The Ray cluster that jobs past one node run on (worker/ray_submit.py submits them through
    its Jobs API; worker/ray_train.py is what runs there). API and workers read the same values:
    the API refuses resources.nodes > 1 when no address is set, without asking Ray."""

    address: str | None = Field(
        None,
        description="The Ray cluster's Jobs API (dashboard) URL, e.g. http://mathrl-ray-head-svc:8265. "
        "Unset: no Ray cluster; jobs with resources.nodes > 1 are refused at submit.",
    )
    pools: list[str] = Field(
        default_factory=list,
        description="Pools (resources.pool) whose jobs all run on the Ray cluster, one node or more; jobs with "
        "resources.nodes > 1 and no pool go to the 'ray' queue. Run workers for these queues with the address set.",
    )
    gpus_per_node: int | None = Field(
        None,
        ge=0,
        description="GPUs on each node of the Ray cluster's worker groups: a Ray job asking for more per node "
        "(resources.gpus) is refused at submit. Unset: not checked.",
    )
    python: str = Field(
        "python",
        description="The Python on the Ray nodes that has mathrl installed (the worker image's), which runs the job.",
    )
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs Ray reserves for each training worker.")
    server_cpus: float = Field(
        1.0,
        gt=0,
        description="CPUs Ray reserves for a GRPO job's vLLM server in generation.mode 'server' (beside its "
        "generation.server_gpus GPUs on a GPU job): Ray places it on a node with these free, apart from the "
        "training workers.",
    )
    lost_after_seconds: float = Field(
        60.0,
        gt=0,
        description="A Ray job whose status cannot be read (the head restarted, the submission vanished) for "
        "this long fails the mathrl job.",
    )

    def runs(self, spec: object) -> bool:
        """Whether this job goes to the Ray cluster: more than one node, or a pool set to run on Ray."""
        resources = getattr(spec, "resources", None)
        if resources is None:
            return False
        return resources.nodes > 1 or (resources.pool is not None and resources.pool in self.pools)


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


class MemorySettings(BaseModel):
    """The GPU memory of the worker pools, for the memory plan (trainer/memory_plan.py). A GRPO or
    SFT job with GPUs whose estimated peak exceeds one of its pool's GPUs is refused at submit (422)
    when the API can read the model's config.json (a local path, another job's saved model), else
    failed by the worker before the model loads. API and workers read the same values."""

    gpu_memory_gib: float | None = Field(
        None,
        gt=0,
        description="Memory of one GPU, in GiB, in the pools `pools` does not list. Unset: such pools are not "
        "checked at submit; the worker checks against its own GPU's memory (torch) before the model loads.",
    )
    pools: dict[str, float] = Field(
        default_factory=dict,
        description="Queue (resources.pool, or 'gpu-N' from resources.gpus) -> memory of one of its GPUs in GiB, "
        'e.g. {"gpu-1": 80, "l40s": 48} (MATHRL_MEMORY__POOLS as JSON; the chart sets it from workerPools).',
    )

    def for_queue(self, queue: str) -> float | None:
        """GiB of one GPU of the pool serving `queue`; None: not known."""
        return self.pools.get(queue, self.gpu_memory_gib)


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
