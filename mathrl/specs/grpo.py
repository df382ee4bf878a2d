"""GRPO policy training jobs (`kind: grpo`): the loss, generation, held-out evals, curriculum and
dynamic sampling settings. Unset knobs are filled by a preset (mathrl/specs/presets.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from mathrl.backends import GENERATION_BACKENDS, uses_vllm
from mathrl.errors import FieldError
from mathrl.fileref import FileRef
from mathrl.modelref import ModelRef
from mathrl.specs.base import (
    MAX_SEED,
    Dtype,
    GenerationBackend,
    GradientCheckpointing,
    JobBase,
    Knob,
    StrictModel,
    knob_defaults,
)
from mathrl.specs.inputs import DatasetRef
from mathrl.specs.loop import Curriculum as Curriculum
from mathrl.specs.loop import DynamicSampling as DynamicSampling
from mathrl.specs.lora import VLLM_LORA_RANKS, LoRA
from mathrl.specs.presets import ASYNC_UNSUPPORTED, resolve_grpo
from mathrl.specs.refs import HoldsAFile
from mathrl.specs.rewards import RewardRef
from mathrl.specs.tools import Tools

LossType = Literal["grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo"]


class HeldoutEval(HoldsAFile):
    """Score the weights being trained on a held-out set every `every` steps, as a series."""

    benchmark: str | None = Field(
        None, min_length=1, max_length=128, description="A registered benchmark (its test split), e.g. add2-words."
    )
    file: FileRef | None = Field(
        None,
        description="Or an uploaded file (POST /v1/files) in OpenAI's fine-tuning format (OpenAI's validation file): "
        "a GRPO job scores its answers with its own rewards, the series heldout/reward; an SFT job takes its loss "
        "and token accuracy on the chats' last assistant messages, the series eval_loss and eval_mean_token_accuracy.",
    )
    limit: int = Field(100, ge=1, le=5000, description="Problems scored each time (the set's first N).")
    every: int = Field(10, ge=1, le=10_000_000, description="Score every N optimizer steps, and after the last.")
    max_new_tokens: int = Field(256, ge=1, le=32768, description="Greedy completion length per problem.")

    @model_validator(mode="after")
    def _one_set(self) -> HeldoutEval:
        if (self.benchmark is None) == (self.file is None):
            raise FieldError(
                "benchmark", "give exactly one of 'benchmark' (a registered set) or 'file' (an uploaded one)"
            )
        return self


# GRPO and SFT jobs
HeldoutEvalField = Annotated[
    HeldoutEval | None,
    Field(
        description="Held-out evaluation during training: accuracy with its 95% CI every N steps, stored as the "
        "series heldout/accuracy, heldout/ci_low and heldout/ci_high.",
    ),
]


HFMode = Literal["dynamic", "static", "continuous"]


class Generation(StrictModel):
    """How a GRPO job samples its completions. The backend that ran is stored with the job
    (resolved config `generation_backend`, and a 'generation' event from the worker)."""

    backend: Literal["auto"] | GenerationBackend = Field(
        "auto",
        description="'vllm': vLLM's engine; 'hf': transformers' generate; 'auto': vLLM (colocated) on GPU "
        "jobs, hf on CPU jobs (vLLM's CPU build runs when asked for explicitly).",
    )
    mode: Literal["colocate", "server"] = Field(
        "colocate",
        description="'colocate': the vLLM engine runs inside each training process and gets the new "
        "weights after every optimizer step. 'server': the worker starts a vLLM server for the job (on "
        "server_gpus of its GPUs, or on the CPU for a CPU job) and stops it when the job ends; with LoRA the "
        "trainer syncs the adapter to it after every step (any device), without LoRA the full weights over NCCL "
        "(GPUs only).",
    )
    server_gpus: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Server mode: GPUs of the job's resources.gpus that serve vLLM; the "
        "others train. Default: a quarter of them, at least 1 (e.g. 8 GPUs: 6 train, 2 generate). On Ray "
        "(resources.nodes > 1) the job has one server, on one node: it takes server_gpus of the job's gpus x nodes, "
        "and Ray places the training workers on the rest.",
    )
    dtype: Dtype = Field(
        "auto",
        description="vLLM weights dtype; 'auto' is bfloat16 on a GPU and float32 on a CPU.",
    )
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Share of each GPU's memory vLLM may take (weights, activations, KV cache); "
        "colocated with training, keep it low (TRL's default 0.3). Default: 0.3.",
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=64,
        description="GPUs one vLLM engine is split over; must divide the job's processes.",
    )
    enable_prefix_caching: bool | None = Field(
        None,
        description="vLLM's prefix caching (the G completions of one question share its prompt); default: vLLM's own.",
    )
    hf_mode: Literal["auto"] | HFMode = Field(
        "auto",
        description="How the 'hf' backend decodes (trainer/hf_generation.py): 'dynamic', transformers' generate "
        "with a growing cache (TRL's default); 'static', a fixed-size cache and a compiled decode step (CUDA "
        "graphs on a GPU, on a bf16 copy of the policy); 'continuous', transformers' continuous batching (paged "
        "attention); 'auto': 'dynamic' for now, on a GPU too, where 'static' generated 2.1-4.6x faster in "
        "bench/hf_generation.py but is not yet proven inside a training run there (docs/gpu.md).",
    )

    overlap: bool = Field(
        False,
        description="'hf' backend: generate the next step's completions on a copy of the policy while this step "
        "trains (trainer/overlap.py), so a step takes about the longer of the two instead of their sum where the "
        "device has room for both. They train one step later (one step stale); the PPO ratio is taken against "
        "the sampler's log-probabilities, as async GRPO does. Not with dynamic_sampling or the curriculum (they "
        "choose the next questions from this step's grades), num_iterations > 1, hf_mode 'continuous', or ZeRO-3.",
    )

    def resolved_hf_mode(self) -> HFMode:
        """The way the hf backend decodes: the spec's, or auto's pick (`dynamic` on CPUs and GPUs:
        on a CPU it measured fastest, and on a GPU `static` has not yet run inside a training run;
        docs/gpu.md)."""
        if self.hf_mode != "auto":
            return self.hf_mode
        return "dynamic"

    def resolved_server_gpus(self, gpus: int) -> int:
        """GPUs the vLLM server gets (0: it runs on the CPU, for a CPU job)."""
        if self.mode != "server" or gpus == 0:
            return 0
        return self.server_gpus or max(1, gpus // 4)

    def resolve(self, gpus: int) -> str:
        """The backend a job with `gpus` GPUs runs: 'vllm' or 'hf'."""
        if self.backend == "auto":
            return "vllm" if gpus > 0 else "hf"
        return self.backend


class GRPOSpec(JobBase):
    """GRPO policy training. Knobs left as null take the preset's value (or TRL's default)."""

    kind: Literal["grpo"] = Field("grpo", description="GRPO policy training.")
    model: ModelRef
    preset: Literal["deepseekmath", "trl-default"] = Field(
        "trl-default", description="Fills every knob left unset; explicit fields override it."
    )
    dataset: DatasetRef = Field(..., description="Training questions with gold answers.")
    rewards: list[RewardRef] = Field(
        default_factory=lambda: [RewardRef(name="accuracy")],
        min_length=1,
        max_length=16,
        description="Reward functions, summed with their weights (default: accuracy against the gold answer).",
    )
    max_steps: int = Field(100, ge=1, le=10_000_000, description="Optimizer steps.")
    # the knobs: each declared once here, with TRL's default (mathrl/specs/presets.py overlays a preset's values)
    learning_rate: float | None = Knob(1e-6, "Peak learning rate.", gt=0, le=1.0)
    # beta, num_generations and delta: their lower bounds are checked by mathrl.specs.presets.resolve_grpo
    # (on the resolved value, with a message that says why); these fields cap them
    beta: float | None = Knob(0.0, "KL coefficient to the frozen reference policy (0 to 100; 0: no KL term).", le=100)
    num_generations: int | None = Knob(8, "Group size G: completions per question (2 to 1024).", le=1024)
    max_prompt_length: int | None = Knob(
        512, "Prompts longer than this (tokens) are dropped from the set.", ge=1, le=131072
    )
    max_completion_length: int | None = Knob(512, "Tokens generated per completion at most.", ge=1, le=131072)
    per_device_train_batch_size: int | None = Knob(8, "Completions per device per micro-step.", ge=1, le=65536)
    global_batch_size: int | None = Knob(
        None,
        "Completions per optimizer step over all devices; sets gradient accumulation (none: one micro-batch "
        "per device).",
        ge=1,
        le=1_048_576,
    )
    num_iterations: int | None = Knob(1, "Policy updates per generation round.", ge=1, le=64)
    loss_type: LossType | None = Knob("dapo", "How token losses are averaged (TRL's loss_type).")
    epsilon: float | None = Knob(0.2, "Lower clip range.", gt=0, lt=1)
    epsilon_high: float | None = Knob(None, "Upper clip range (DAPO clip-higher; none: epsilon).", gt=0, lt=10)
    delta: float | None = Knob(
        None, "Two-sided clipping bound; must exceed 1 + epsilon (at most 100; none: off).", le=100
    )
    importance_sampling_level: Literal["token", "sequence"] | None = Knob(
        "token", "Importance ratios per token (GRPO) or per sequence (GSPO)."
    )
    scale_rewards: Literal["group", "batch", "none"] | None = Knob(
        "group", "Divide advantages by the reward std of the group, the batch, or not at all (Dr. GRPO)."
    )
    mask_truncated_completions: bool | None = Knob(
        False, "Leave completions cut at max_completion_length out of the loss (DAPO)."
    )
    temperature: float | None = Knob(1.0, "Sampling temperature of the rollouts.", gt=0, le=5)
    top_p: float | None = Knob(1.0, "Nucleus sampling mass of the rollouts.", gt=0, le=1)
    warmup_ratio: float | None = Knob(0.0, "Fraction of steps with a linear learning-rate warm-up.", ge=0, lt=1)
    lora: LoRA | None = Field(None, description="Train LoRA adapters through peft.")
    generation: Generation = Field(
        default_factory=Generation,
        description="Generation backend and its vLLM knobs.",
    )
    algorithm: Literal["sync", "async"] = Field(
        "sync",
        description="'sync': generate, then train on what was generated (GRPO as in DeepSeekMath). "
        "'async' (experimental): TRL's AsyncGRPOTrainer; a rollout worker keeps generating on the job's vLLM "
        "server while the trainer trains on samples up to max_staleness updates old (needs generation.mode "
        "'server').",
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        le=1000,
        description="Async only: how many weight updates a sample may lag behind the policy "
        "before it is dropped (0: on-policy). Default: TRL's 4.",
    )
    eval: HeldoutEvalField = None
    tools: Tools | None = Field(
        None,
        description="Tools the policy may call mid-rollout: its code runs in the python graders' sandbox, the output "
        "comes back into its context and is kept out of the loss; max_completion_length counts the whole rollout, "
        "the tool's tokens too (docs/tools.md).",
    )
    dynamic_sampling: DynamicSampling | None = Field(
        None,
        description="Drop groups whose grading signal has zero variance and generate more (true: the defaults "
        "shown; false: off). Unset: from the preset.",
    )
    curriculum: Curriculum | None = Field(
        None,
        description="Draw questions by their pass rate (learnability, Foster and Foerster 2025). Unset: from "
        "the preset.",
    )
    skip_zero_advantage: bool | None = Field(
        None,
        description="Skip the forward and backward of completions with zero advantage where that leaves the "
        "update unchanged (beta 0, no entropy terms). Unset: from the preset.",
    )
    deepspeed_zero3: bool = Field(False, description="Shard with DeepSpeed ZeRO-3 (multi-GPU).")
    gradient_checkpointing: GradientCheckpointing = None
    logging_steps: int = Field(1, ge=1, le=10_000_000, description="Store metrics every N steps.")
    save_steps: int = Field(50, ge=1, le=10_000_000, description="Checkpoint every N steps.")
    sample_every: int = Field(10, ge=1, le=10_000_000, description="Store sampled completions every N steps.")
    seed: int = Field(
        42, ge=0, le=MAX_SEED, description="Seed of the data order, sampling and initialisation (0 to 2**32 - 1)."
    )

    @field_validator("dynamic_sampling", "curriculum", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        """`true` / `false` for the whole block: on with its defaults, or off."""
        return {"enabled": value} if isinstance(value, bool) else value

    @model_validator(mode="before")
    @classmethod
    def _translate_old_vllm_fields(cls, data: Any) -> Any:
        """Specs stored before the `generation` block had `use_vllm` and `vllm_mode`: read them
        as the same request (workers re-parse stored specs, so they must not be rejected)."""
        if not isinstance(data, dict) or ("use_vllm" not in data and "vllm_mode" not in data):
            return data
        data = dict(data)
        use_vllm, mode = data.pop("use_vllm", None), data.pop("vllm_mode", None)
        if "generation" in data:
            raise FieldError(
                "use_vllm",
                "use_vllm / vllm_mode are replaced by 'generation': give only generation.backend and generation.mode",
            )
        if mode is not None and not use_vllm:
            raise FieldError("vllm_mode", "vllm_mode is set but use_vllm is false: use generation.backend='vllm'")
        data["generation"] = {"backend": "vllm" if use_vllm else "hf", **({"mode": mode} if mode else {})}
        return data

    @model_validator(mode="after")
    def _resolvable(self) -> GRPOSpec:
        gen = self.generation
        if gen.gpu_memory_utilization is not None and self.resources.gpus == 0:
            raise FieldError(
                "generation/gpu_memory_utilization",
                "gpu_memory_utilization is for GPU jobs; a CPU "
                "job's KV cache is MATHRL_VLLM__CPU_KV_GIB on the worker: drop it or set resources.gpus",
            )
        if self.resources.num_processes % gen.tensor_parallel_size:
            raise FieldError(
                "generation/tensor_parallel_size",
                f"tensor_parallel_size={gen.tensor_parallel_size} "
                f"must divide the job's {self.resources.num_processes} process(es): use a divisor",
            )
        backend = gen.resolve(self.resources.gpus)
        if GENERATION_BACKENDS[backend].trl is None:
            can = ", ".join(repr(n) for n, info in GENERATION_BACKENDS.items() if info.trl is not None)
            raise FieldError(
                "generation/backend",
                f"GRPO's trainer (TRL) cannot generate with the {backend!r} backend, which serves other jobs: "
                f"set generation.backend to one it runs ({can}, or 'auto')",
            )
        if gen.mode == "server":
            self._check_server_mode(backend)
        elif gen.server_gpus is not None:
            raise FieldError(
                "generation/server_gpus", "server_gpus is for mode 'server': drop it or set generation.mode='server'"
            )
        if gen.tensor_parallel_size > 1 and not uses_vllm(backend):
            raise FieldError(
                "generation/tensor_parallel_size",
                "tensor_parallel_size is a vLLM setting: set generation.backend='vllm' or drop it",
            )
        if gen.hf_mode != "auto" and uses_vllm(backend):
            raise FieldError(
                "generation/hf_mode",
                f"hf_mode is how the 'hf' backend decodes, and this job generates with {backend}: set "
                "generation.backend='hf' or drop hf_mode",
            )
        if gen.hf_mode == "static" and self.deepspeed_zero3:
            raise FieldError(
                "generation/hf_mode",
                "hf_mode 'static' decodes on a full copy of the policy, which ZeRO-3 shards across GPUs: use "
                "hf_mode 'dynamic' or drop deepspeed_zero3",
            )
        if gen.overlap:
            self._check_overlap(backend)
        if self.deepspeed_zero3 and self.resources.gpus < 2:
            raise FieldError(
                "deepspeed_zero3", "deepspeed_zero3 shards over several GPUs: set resources.gpus >= 2 or drop it"
            )
        if self.algorithm == "async" and (not uses_vllm(backend) or gen.mode != "server"):
            raise FieldError(
                "algorithm",
                "async GRPO generates on the job's vLLM server: set generation.backend="
                "'vllm' and generation.mode='server', or algorithm='sync'",
            )
        if self.max_staleness is not None and self.algorithm != "async":
            raise FieldError(
                "max_staleness", "max_staleness is for algorithm='async': drop it or set algorithm='async'"
            )
        if self.algorithm == "async":
            self._check_async_knobs()
        if self.tools is not None:
            self._check_tools(backend)
        resolve_grpo(self)  # raises ValueError with a fix-it message
        return self

    def _check_overlap(self, backend: str) -> None:
        gen = self.generation
        why = None
        if uses_vllm(backend):
            why = (
                f"overlap generates on the 'hf' backend, and this job generates with {backend}: set "
                "generation.backend='hf' or drop overlap"
            )
        elif gen.hf_mode == "continuous":
            why = (
                "continuous batching takes half the GPU's free memory for its paged cache, which training needs "
                "while they overlap: use hf_mode 'dynamic' or 'static', or drop overlap"
            )
        elif self.deepspeed_zero3:
            why = "overlap decodes on a full copy of the policy, which ZeRO-3 shards across GPUs: drop one of them"
        if why:
            raise FieldError("generation/overlap", why)

    def _check_tools(self, backend: str) -> None:
        """Multi-turn rollouts run in mathrl's loop (trainer/tool_grpo.py) on the trainer's own engine:
        the paths that generate elsewhere are refused rather than run without the tool."""
        gen, why = self.generation, None
        if self.algorithm == "async":
            why = "async GRPO's rollout worker generates single turns on its own: use algorithm='sync' with tools"
        elif gen.overlap:
            why = "overlap decodes single turns on a copy of the policy: drop generation.overlap with tools"
        elif uses_vllm(backend) and gen.mode == "server":
            why = "tool rollouts generate on the trainer's own engine: use generation.mode='colocate' with tools"
        elif not uses_vllm(backend) and gen.hf_mode == "continuous":
            why = "continuous batching has no stop string for the call: use hf_mode 'dynamic' or 'static' with tools"
        if why:
            raise FieldError("tools", why)

    def _check_server_mode(self, backend: str) -> None:
        gen, gpus = self.generation, self.resources.gpus
        if not uses_vllm(backend):
            raise FieldError(
                "generation/mode",
                "mode 'server' is a vLLM mode: set generation.backend='vllm' "
                "(or 'auto' with GPUs), or use mode 'colocate'",
            )
        if self.lora is not None and self.lora.enabled and self.lora.r > VLLM_LORA_RANKS[-1]:
            raise FieldError(  # (the job's server failed to start with an empty StopIteration)
                "lora/r",
                f"lora.r={self.lora.r}: mode 'server' serves the adapters on vLLM, which takes ranks up to "
                f"{VLLM_LORA_RANKS[-1]}: lower r, or use mode 'colocate' (weights merged) or backend 'hf'",
            )
        nodes = self.resources.nodes
        if gpus > 0 and nodes == 1 and gen.resolved_server_gpus(gpus) >= gpus:
            raise FieldError(
                "generation/server_gpus",
                f"server_gpus={gen.resolved_server_gpus(gpus)} of "
                f"resources.gpus={gpus} leaves no GPU to train on: lower server_gpus or raise gpus",
            )
        if gpus > 0 and nodes > 1 and gen.resolved_server_gpus(gpus) > gpus:
            raise FieldError(
                "generation/server_gpus",
                f"server_gpus={gen.resolved_server_gpus(gpus)}: the job's vLLM server runs on one node, which has "
                f"resources.gpus={gpus}: lower server_gpus to at most {gpus}",
            )
        if self.resources.processes is not None and gpus > 0:
            raise FieldError(
                "resources/processes",
                "in server mode the training processes are resources.gpus "
                "minus generation.server_gpus: drop resources.processes",
            )
        if gpus == 0 and (self.lora is None or not self.lora.enabled):
            raise FieldError(
                "generation/mode",
                "mode 'server' on a CPU job syncs LoRA adapters to the server "
                "(the full-weight sync needs CUDA/NCCL): add a 'lora' block, or use mode 'colocate'",
            )
        if gen.tensor_parallel_size > 1:
            raise FieldError(
                "generation/tensor_parallel_size",
                "in server mode the server is split over generation.server_gpus: drop tensor_parallel_size",
            )

    def _check_async_knobs(self) -> None:
        """TRL's AsyncGRPOTrainer has its own loss and no KL term: knobs it cannot honour are refused
        rather than stored as if they had run."""
        if self.preset != "trl-default":
            raise FieldError(
                "preset",
                f"preset '{self.preset}' sets knobs async GRPO has no use for (its KL "
                "coefficient, loss type): drop the preset or use algorithm='sync'",
            )
        for knob in ASYNC_UNSUPPORTED:
            if getattr(self, knob) is not None:
                raise FieldError(
                    knob,
                    f"{knob} is not a setting of async GRPO (TRL's AsyncGRPOTrainer has its own "
                    "loss, without a KL term): drop it, or use algorithm='sync'",
                )

    @property
    def training_processes(self) -> int:
        """Processes that train on one node: in server mode the GPUs the vLLM server does not take."""
        server = self.generation.resolved_server_gpus(self.resources.gpus)
        return self.resources.num_processes - server if server else self.resources.num_processes

    @property
    def training_world(self) -> int:
        """Processes that train in all: processes per node x nodes, less the GPUs of the job's one
        vLLM server in server mode (on Ray it sits on one node; the trainers fill the rest)."""
        server = self.generation.resolved_server_gpus(self.resources.gpus)
        return self.resources.num_processes * self.resources.nodes - server


# TRL 1.16's GRPOConfig defaults for every knob, read off the declarations above (checked against the
# installed TRL by tests/unit/mathrl/test_specs.py::test_trl_defaults_match_trl)
TRL_DEFAULTS: dict[str, Any] = knob_defaults(GRPOSpec)
