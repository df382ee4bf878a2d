"""The settings of what runs jobs (config/settings.py `Settings` holds them): the worker
(`WorkerSettings`, MATHRL_WORKER__*), every vLLM engine of ours (`VLLMSettings`), the Ray cluster
past one node (`RaySettings`) and the GPU memory the memory plan checks against (`MemorySettings`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from evaluator.backends.base import EngineSettings
from mathrl.specs.base import POOL_NAME, QUEUE_LENGTH

# kombu's own keys in a Redis broker, beside the queues: a queue of this name breaks delivery for every queue
BROKER_KEYS = frozenset({"unacked"})


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
