"""Job specs: what a user submits, validated the same way by the SDK, the API and the worker.

A spec is discriminated by ``kind``. Every field carries a description (it becomes the
OpenAPI documentation) and every impossible setting fails with a message that says how
to fix it. GRPO knobs left unset are filled by a preset (see ``mathrl.presets``); the
run stores the fully resolved values, never the preset name alone.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    TypeAdapter,
    field_validator,
    model_validator,
)

from mathrl.errors import FieldError as FieldError  # raised here, imported from here by the API
from mathrl.graders import (
    BoxedFormatGrader,
    Grader,
    GraderItem,
    LengthPenaltyGrader,
    MathGrader,
    RewardModelGrader,
    grader_models,
)
from mathrl.kinds import JobKind
from mathrl.modelref import ModelRef as ModelRef  # specs' users import it from here
from mathrl.modelref import check_model_ref as check_model_ref
from mathrl.modelref import split_job_ref as split_job_ref  # the API imports it from here
from mathrl.presets import ASYNC_UNSUPPORTED, resolve_grpo
from mathrl.recipe import Recipe
from mathrl.registry import Registry

Dtype = Literal["auto", "float32", "bfloat16", "float16"]  # a model's weights dtype, as jobs give it
# the generation backends a job can name: evaluator/backends' BACKENDS (a quick test holds them equal)
GenerationBackend = Literal["hf", "vllm"]


class StrictModel(BaseModel):
    """Unknown fields are errors: a typo must not be silently ignored. NaN and +-Infinity (which
    Python's JSON parser reads) are errors too: JSON cannot store them (they came back as null)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


# seeds go to numpy, torch and random: numpy takes 0 .. 2**32 - 1
MAX_SEED = 2**32 - 1

RAY_QUEUE = "ray"  # the queue of jobs with resources.nodes > 1 (workers that submit to a Ray cluster)


class Resources(StrictModel):
    gpus: int = Field(
        0,
        ge=0,
        le=64,
        description="GPUs for the job, per node (see nodes); picks the worker queue ('cpu' or 'gpu-N'). "
        "Quotas count gpus x nodes.",
    )
    nodes: int = Field(
        1,
        ge=1,
        le=256,
        description="Nodes a training job spans. Above 1 the job runs on the operator's Ray cluster (queue 'ray', "
        "or resources.pool): resources.processes (default: gpus, or 1 on CPU) Ray Train workers on each node.",
    )
    gpu_type: str | None = Field(
        None,
        max_length=32,
        pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="The GPU model a one-node GPU job needs, e.g. 'h100': it goes to queue 'gpu-N-<gpu_type>' (a "
        "worker pool of that card) instead of 'gpu-N'. Needs gpus > 0; not with pool or nodes > 1.",
    )
    pool: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="A named worker pool's queue (e.g. 'h100-vllm'); default: 'cpu' or 'gpu-N' from gpus.",
    )
    processes: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Data-parallel processes for a training job (accelerate launch); default: gpus, or 1 on CPU. "
        "With gpus > 0 it must equal gpus (one process per GPU); with gpus = 0 it runs that many CPU processes.",
    )

    @model_validator(mode="after")
    def _one_process_per_gpu(self) -> Resources:
        if self.gpu_type is not None and (self.gpus == 0 or self.pool is not None or self.nodes > 1):
            raise FieldError(
                "gpu_type",
                f"gpu_type {self.gpu_type!r} routes a one-node GPU job to queue 'gpu-N-{self.gpu_type}': give gpus > 0 "
                "and no pool or nodes > 1 with it (a pool names its queue itself), or drop gpu_type",
            )
        if self.gpus > 0 and self.processes is not None and self.processes != self.gpus:
            raise FieldError(
                "processes",
                f"processes={self.processes} with gpus={self.gpus}: a GPU job runs one "
                f"process per GPU; set processes={self.gpus} or drop it",
            )
        return self

    @property
    def num_processes(self) -> int:
        """How many processes the job runs as on each node (1: a plain job process)."""
        return self.processes or max(self.gpus, 1)

    @property
    def total_gpus(self) -> int:
        """What the job holds against its project's GPU quota: gpus on each of its nodes."""
        return self.gpus * self.nodes

    @property
    def queue(self) -> str:
        if self.pool:
            return self.pool
        if self.nodes > 1:
            return RAY_QUEUE
        if self.gpus == 0:
            return "cpu"
        return f"gpu-{self.gpus}-{self.gpu_type}" if self.gpu_type else f"gpu-{self.gpus}"


DEFAULT_MAX_NEW_TOKENS = 512


class Sampling(StrictModel):
    temperature: float = Field(0.0, ge=0.0, le=5.0, description="0 means greedy decoding.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        le=32768,
        description="Completion length limit in tokens; unset: an eval recipe's default, "
        f"else {DEFAULT_MAX_NEW_TOKENS}.",
    )
    n: int = Field(1, ge=1, le=1024, description="Samples per problem (pass@k and maj@k need n >= k).")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Sampling seed (0 to 2**32 - 1).")

    @model_validator(mode="after")
    def _greedy_single(self) -> Sampling:
        if self.temperature == 0.0 and self.n > 1:
            raise FieldError("n", "n > 1 needs temperature > 0: greedy decoding gives n identical samples")
        return self


class DatasetRef(StrictModel):
    """Training or evaluation questions: a registered benchmark/split, a user file or URL, or a
    dataset on the Hugging Face hub."""

    name: str | None = Field(None, max_length=128, description="Registered dataset, e.g. 'gsm8k' or 'math'.")
    split: str = Field("train", max_length=32, description="Split of the registered dataset or of the hub dataset.")
    path: str | None = Field(
        None, max_length=1024, description="A jsonl/parquet file under a configured data root, or an allowed URL."
    )
    hub: str | None = Field(
        None,
        max_length=256,
        description="A hub dataset id ('org/name'), loaded by the worker with datasets.load_dataset(hub, config, "
        "split=split); the API does not fetch it (the worker checks it, and its fields, before any work).",
        examples=["openai/gsm8k"],
    )
    config: str | None = Field(None, max_length=64, description="The hub dataset's configuration, e.g. 'main'.")
    file: str | None = Field(
        None,
        pattern=r"^file-[0-9a-f]{32}$",
        description="A file uploaded to this project (POST /v1/files), by its id: resolved by the worker.",
    )
    format: Literal["fields", "messages"] = Field(
        "fields",
        description="'fields': a question and an answer field per row; 'messages': OpenAI's fine-tuning JSONL, the "
        "chat `messages` as the prompt (rendered with the model's chat template) and every other field kept for "
        "graders' templates ('{{item.<field>}}'); answer_field, if a row has it, is the gold answer.",
    )
    question_field: str = Field(
        "question", max_length=64, description="Field holding the question (user files, hub datasets)."
    )
    answer_field: str = Field(
        "answer", max_length=64, description="Field holding the gold answer (user files, hub datasets)."
    )
    limit: int | None = Field(None, ge=1, le=100_000_000, description="Use only the first N rows (at most 10^8).")

    @model_validator(mode="after")
    def _one_source(self) -> DatasetRef:
        if sum(x is not None for x in (self.name, self.path, self.hub, self.file)) != 1:
            raise FieldError(
                "name",
                "give exactly one of 'name' (a registered dataset), 'path' (a user file or URL), 'hub' (a hub id) "
                "or 'file' (an uploaded file's id)",
            )
        if self.format == "messages" and self.name is not None:
            raise FieldError("format", "'messages' is for a user's file (path or file), not a registered dataset")
        if self.hub is not None and (self.hub.startswith(("/", ".", "~")) or not _HUB_DATASET.match(self.hub)):
            raise FieldError("hub", f"{self.hub!r} is not a hub dataset id: write 'org/name' (a file goes in 'path')")
        if self.config is not None and self.hub is None:
            raise FieldError("config", "'config' is for a hub dataset: remove it or give 'hub'")
        return self


_HUB_DATASET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


RewardName = Literal["accuracy", "binary", "format", "overlong", "reward_model", "grader"]
REWARD_NAMES: tuple[str, ...] = RewardName.__args__  # type: ignore[attr-defined]


class RewardRef(StrictModel):
    name: RewardName = Field(
        ...,
        description="A named reward (each is a grader: RewardRef.as_grader), or 'grader' for the one in 'grader'.",
    )
    grader: Grader | None = Field(
        None, description="For 'grader': a grader (mathrl/graders.py) whose score is the reward."
    )
    weight: float = Field(1.0, ge=-100, le=100, description="Weight of this reward in the sum.")
    model: ModelRef | None = Field(None, description="For 'reward_model': the RM (a path or 'job:<id>').")
    buffer: int | None = Field(
        None,
        ge=1,
        le=131072,
        description="For 'overlong': tokens before max_completion_length over which the penalty ramps to -1 "
        "(DAPO's soft overlong punishment); default a quarter of max_completion_length.",
    )

    @model_validator(mode="after")
    def _model_only_for_rm(self) -> RewardRef:
        if self.name == "grader" and self.grader is None:
            raise FieldError("grader", "the 'grader' reward needs 'grader': e.g. {type: math}")
        if self.name != "grader" and self.grader is not None:
            raise FieldError("grader", f"'grader' is only for the 'grader' reward, not {self.name!r}: remove it")
        if self.buffer is not None and self.name != "overlong":
            raise FieldError("buffer", f"'buffer' is only for the 'overlong' reward, not {self.name!r}: remove it")
        if self.name == "reward_model" and self.model is None:
            raise FieldError("model", "the 'reward_model' reward needs 'model': an RM path or 'job:<rm-job-id>'")
        if self.name != "reward_model" and self.model is not None:
            raise FieldError("model", f"'model' is only for the 'reward_model' reward, not {self.name!r}: remove it")
        return self

    def as_grader(self, max_completion_length: int) -> Any:
        """The grader (mathrl/graders.py) this reward is: every named reward is one, so its
        formula has one implementation (evaluator/graders.py) in GRPO, eval and the graders
        route. `max_completion_length` is the run's, which 'overlong' penalises against."""
        if self.name == "grader":
            return self.grader
        if self.name == "accuracy":
            return MathGrader()
        if self.name == "binary":  # DeepSeekMath's rule reward: +1 right, -1 wrong, -0.5 no answer
            return MathGrader(wrong_score=-1.0, no_answer_score=-0.5)
        if self.name == "format":
            return BoxedFormatGrader()
        if self.name == "overlong":
            buffer = self.buffer or max(1, max_completion_length // 4)
            return LengthPenaltyGrader(max_length=max_completion_length, buffer=min(buffer, max_completion_length))
        assert self.name == "reward_model" and self.model is not None
        return RewardModelGrader(model=self.model)


# 'all-linear' or a list of module names; tagged (like RecipeField below) so an error points at
# target_modules, not at a union member
_LORA_TAGS = ("module-names", "all-linear")
LoraTargets = Annotated[
    Annotated[list[Annotated[str, Field(min_length=1, max_length=128)]], Field(max_length=256), Tag("module-names")]
    | Annotated[Literal["all-linear"], Tag("all-linear")],
    Discriminator(lambda v: "all-linear" if isinstance(v, str) else "module-names"),
]


class LoRA(StrictModel):
    enabled: bool = Field(True, description="Train LoRA adapters instead of all weights.")
    r: int = Field(16, ge=1, le=1024, description="LoRA rank.")
    alpha: int = Field(32, ge=1, le=4096, description="LoRA alpha.")
    dropout: float = Field(0.05, ge=0.0, lt=1.0, description="LoRA dropout.")
    target_modules: LoraTargets = Field(
        "all-linear", description="Modules to adapt: 'all-linear', or at most 256 module names."
    )

    @model_validator(mode="after")
    def _options_need_lora(self) -> LoRA:
        if not self.enabled:
            changed = sorted(
                name
                for name, f in type(self).model_fields.items()
                if name != "enabled" and getattr(self, name) != f.get_default(call_default_factory=True)
            )
            if changed:
                raise FieldError(
                    changed[0], f"LoRA options {changed} given with enabled=false: remove them or set enabled=true"
                )
        return self


def _kind_required(schema: dict[str, Any]) -> None:
    # 'kind' has a default for Python callers, but the API picks the spec by it: say it is required
    schema["required"] = sorted({*schema.get("required", []), "kind"})


class _JobBase(StrictModel):
    model_config = ConfigDict(json_schema_extra=_kind_required)

    name: str | None = Field(None, max_length=200, description="A human-readable name.")
    tags: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=32, description="Free labels; jobs can be listed by tag."
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="What the job runs on: GPUs (routes it to a pool with that many), CPU processes, the pool.",
    )
    max_attempts: int = Field(3, ge=1, le=20, description="Deliveries before the job fails for good.")

    @field_validator("tags")
    @classmethod
    def _tags_plain(cls, tags: list[str]) -> list[str]:
        for tag in tags:
            if not re.match(r"^[A-Za-z0-9._:=-]+$", tag):
                raise ValueError(f"tag {tag!r} may hold only letters, digits and . _ : = -")
        return tags


# a recipe by name or inline; the tags pick the member by type (so an error names one of them,
# not both), and the API's error pointers leave them out (UNION_TAGS)
UNION_TAGS = ("by-name", "inline", *_LORA_TAGS)
# GRPO and SFT jobs; unset, mathrl.presets resolves it to TRL's default (TRL_DEFAULTS)
GradientCheckpointing = Annotated[
    bool | None,
    Field(
        description="Recompute each layer's activations in the backward pass instead of keeping them (TRL's "
        "gradient_checkpointing): far less memory for activations, about a third more compute per step. "
        "Unset: TRL's default, on.",
    ),
]

RecipeField = Annotated[
    Annotated[Annotated[str, Field(min_length=1, max_length=128)], Tag("by-name")] | Annotated[Recipe, Tag("inline")],
    Discriminator(lambda v: "by-name" if isinstance(v, str) else "inline"),
]


class EvalSpec(_JobBase):
    kind: Literal["eval"] = Field("eval", description="Benchmark evaluation.")
    job: ClassVar[JobKind] = JobKind(
        "worker.runners:run_eval", warm_engine=True, admit="api.admission:resolve_eval_recipe"
    )
    model: ModelRef
    benchmark: str = Field("gsm8k", min_length=1, max_length=128, description="A registered benchmark.")
    dataset: DatasetRef | None = Field(None, description="A user set instead of a registered benchmark.")
    recipe: RecipeField | None = Field(
        None,
        description="How questions become prompts: a registered recipe's name (e.g. 'lm-eval-gsm8k', which "
        "reproduces lm-evaluation-harness's 5-shot gsm8k) or a recipe given inline; unset: the benchmark's "
        "own. 'few_shot', 'system_prompt' and 'sampling.max_new_tokens', when given, override the recipe's.",
    )
    limit: int | None = Field(None, ge=1, le=1_000_000, description="Evaluate only the first N problems.")
    backend: GenerationBackend = Field("hf", description="Generation backend.")
    batch_size: int = Field(16, ge=1, le=4096, description="Prompts per generation batch (hf backend).")
    sampling: Sampling = Field(default_factory=Sampling, description="Decoding: greedy by default; n > 1 for pass@k.")
    k: list[Annotated[int, Field(ge=1, le=1024)]] = Field(
        default_factory=lambda: [1], max_length=32, description="k values for pass@k and maj@k (at most 32)."
    )
    few_shot: int | None = Field(
        None, ge=0, le=64, description="Worked examples put before each question; unset: the recipe's count."
    )
    grader: Grader | None = Field(
        None,
        description="A grader (mathrl/graders.py) scoring each item besides the accuracy: its score and reason "
        "are stored per item and its mean as the 'grader/mean' score.",
    )
    system_prompt: str | None = Field(None, max_length=4000, description="Overrides the recipe's system prompt.")
    dtype: Dtype = Field("auto", description="Model weights dtype.")

    @model_validator(mode="after")
    def _k_fits_n(self) -> EvalSpec:
        for k in self.k:
            if k < 1 or k > self.sampling.n:
                raise FieldError("k", f"k={k} needs sampling.n >= {k}: raise sampling.n or drop k={k}")
        if (self.resources.processes or 1) > 1 or self.resources.nodes > 1:
            raise FieldError(
                "resources",
                "resources.processes > 1 and resources.nodes > 1 are for training jobs (grpo, sft, reward_model); "
                "an eval job runs as one process on one node: drop them",
            )
        return self


LossType = Literal["grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo"]


class HeldoutEval(StrictModel):
    """Score the weights being trained on a held-out set every `every` steps, as a series."""

    benchmark: str | None = Field(
        None, min_length=1, max_length=128, description="A registered benchmark (its test split), e.g. add2-words."
    )
    file: str | None = Field(
        None,
        pattern=r"^file-[0-9a-f]{32}$",
        description="Or an uploaded file (POST /v1/files) in OpenAI's fine-tuning format, scored by the GRPO job's "
        "own rewards: the series heldout/reward (OpenAI's validation file).",
    )
    limit: int = Field(100, ge=1, le=5000, description="Problems scored each time (the set's first N).")
    every: int = Field(10, ge=1, le=10_000_000, description="Score every N optimizer steps, and after the last.")
    max_new_tokens: int = Field(256, ge=1, le=32768, description="Greedy completion length per problem.")
    # where the worker found `file` (worker.child resolves it; never part of a spec)
    _path: str | None = PrivateAttr(None)

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


class DynamicSampling(StrictModel):
    """Drop groups with no grading signal and generate more questions in their place (DAPO)."""

    enabled: bool = Field(True, description="false: off (true or false may also stand for the whole block).")
    metric: Literal["correct", "reward"] = Field(
        "correct",
        description="The signal whose variance within a group decides whether it is kept: 'correct', the "
        "correctness verdict of an accuracy or binary reward (the safe default: a length or format term varies "
        "among all-wrong answers too), or 'reward', the weighted sum of the rewards.",
    )
    max_rounds: int = Field(
        3, ge=1, le=16, description="Generation rounds per step at most; a step still short trains on what it has."
    )


class Curriculum(StrictModel):
    """Draw questions by their pass rate so far, favouring those neither always nor never solved."""

    enabled: bool = Field(True, description="false: off (true or false may also stand for the whole block).")
    decay: float = Field(0.5, gt=0, le=1, description="Weight of a question's newest group in its pass rate.")
    floor: float = Field(
        0.01, gt=0, le=1, description="Added to every question's weight, so that none is never drawn again."
    )


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


class GRPOSpec(_JobBase):
    """GRPO policy training. Knobs left as null take the preset's value (or TRL's default)."""

    kind: Literal["grpo"] = Field("grpo", description="GRPO policy training.")
    job: ClassVar[JobKind] = JobKind(
        "worker.runners:run_grpo", training=True, memory_plan=True, resolve="mathrl.presets:resolve_grpo"
    )
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
    learning_rate: float | None = Field(None, gt=0, le=1.0, description="Peak learning rate. Unset: from the preset.")
    # beta, num_generations and delta: their lower bounds are checked by mathrl.presets.resolve_grpo
    # (on the resolved value, with a message that says why); these fields cap them
    beta: float | None = Field(None, le=100, description="KL coefficient to the frozen reference policy (0 to 100).")
    num_generations: int | None = Field(
        None, le=1024, description="Group size G: completions per question (2 to 1024)."
    )
    max_prompt_length: int | None = Field(
        None,
        ge=1,
        le=131072,
        description="Prompts longer than this (tokens) are dropped from the set. Unset: from the preset.",
    )
    max_completion_length: int | None = Field(
        None,
        ge=1,
        le=131072,
        description="Tokens generated per completion at most. Unset: from the preset.",
    )
    per_device_train_batch_size: int | None = Field(
        None, ge=1, le=65536, description="Completions per device per micro-step."
    )
    global_batch_size: int | None = Field(
        None,
        ge=1,
        le=1_048_576,
        description="Completions per optimizer step over all devices; sets gradient accumulation.",
    )
    num_iterations: int | None = Field(None, ge=1, le=64, description="Policy updates per generation round.")
    loss_type: LossType | None = Field(
        None,
        description="How token losses are averaged (TRL's loss_type). Unset: from the preset.",
    )
    epsilon: float | None = Field(None, gt=0, lt=1, description="Lower clip range.")
    epsilon_high: float | None = Field(None, gt=0, lt=10, description="Upper clip range (DAPO clip-higher).")
    delta: float | None = Field(
        None, le=100, description="Two-sided clipping bound; must exceed 1 + epsilon (at most 100)."
    )
    importance_sampling_level: Literal["token", "sequence"] | None = Field(
        None,
        description="Importance ratios per token (GRPO) or per sequence (GSPO). Unset: from the preset.",
    )
    scale_rewards: Literal["group", "batch", "none"] | None = Field(
        None,
        description="Divide advantages by the reward std of the group, the batch, or not at all (Dr. GRPO). "
        "Unset: from the preset.",
    )
    mask_truncated_completions: bool | None = Field(
        None,
        description="Leave completions cut at max_completion_length out of the loss (DAPO). Unset: from the preset.",
    )
    temperature: float | None = Field(
        None,
        gt=0,
        le=5,
        description="Sampling temperature of the rollouts. Unset: from the preset.",
    )
    top_p: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Nucleus sampling mass of the rollouts. Unset: from the preset.",
    )
    warmup_ratio: float | None = Field(None, ge=0, lt=1, description="Fraction of steps with a linear LR warm-up.")
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
                "job's KV cache is MATHRL_VLLM_CPU_KV_GIB on the worker: drop it or set resources.gpus",
            )
        if self.resources.num_processes % gen.tensor_parallel_size:
            raise FieldError(
                "generation/tensor_parallel_size",
                f"tensor_parallel_size={gen.tensor_parallel_size} "
                f"must divide the job's {self.resources.num_processes} process(es): use a divisor",
            )
        backend = gen.resolve(self.resources.gpus)
        if gen.mode == "server":
            self._check_server_mode(backend)
        elif gen.server_gpus is not None:
            raise FieldError(
                "generation/server_gpus", "server_gpus is for mode 'server': drop it or set generation.mode='server'"
            )
        if gen.tensor_parallel_size > 1 and backend != "vllm":
            raise FieldError(
                "generation/tensor_parallel_size",
                "tensor_parallel_size is a vLLM setting: set generation.backend='vllm' or drop it",
            )
        if self.deepspeed_zero3 and self.resources.gpus < 2:
            raise FieldError(
                "deepspeed_zero3", "deepspeed_zero3 shards over several GPUs: set resources.gpus >= 2 or drop it"
            )
        if self.algorithm == "async" and (backend != "vllm" or gen.mode != "server"):
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
        resolve_grpo(self)  # raises ValueError with a fix-it message
        return self

    def _check_server_mode(self, backend: str) -> None:
        gen, gpus = self.generation, self.resources.gpus
        if backend != "vllm":
            raise FieldError(
                "generation/mode",
                "mode 'server' is a vLLM mode: set generation.backend='vllm' "
                "(or 'auto' with GPUs), or use mode 'colocate'",
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


class RewardModelSpec(_JobBase):
    """Reward-model training: sample, label automatically (Math-Shepherd), train."""

    kind: Literal["reward_model"] = Field("reward_model", description="Reward-model training.")
    job: ClassVar[JobKind] = JobKind("worker.runners:run_reward_model", training=True)
    model: ModelRef = Field(..., description="Base model the RM is trained from.")
    policy: ModelRef | None = Field(None, description="Model that samples solutions; defaults to 'model'.")
    type: Literal["outcome", "process"] = Field("outcome", description="Outcome (ORM) or process (PRM) labels.")
    dataset: DatasetRef = Field(..., description="Questions with gold answers; the policy's solutions are graded.")
    samples_per_question: int = Field(8, ge=2, le=1024, description="Solutions sampled per question.")
    completions_per_step: int = Field(4, ge=1, le=256, description="Process RM: rollouts from each step prefix.")
    learning_rate: float = Field(2e-5, gt=0, le=1.0, description="Peak learning rate.")
    num_train_epochs: float = Field(1.0, gt=0, le=100, description="Passes over the labelled data.")
    per_device_train_batch_size: int = Field(8, ge=1, le=65536, description="Rows per device per step.")
    max_length: int = Field(1024, ge=16, le=131072, description="Prompt + solution tokens; longer rows are cut.")
    heldout_fraction: float = Field(0.1, gt=0, lt=1, description="Questions kept for pairwise and best-of-N accuracy.")
    sampling: Sampling = Field(
        default_factory=lambda: Sampling(temperature=0.7, n=8, max_new_tokens=512),
        description="How the policy samples solutions (temperature, length).",
    )
    backend: GenerationBackend = Field(
        "hf",
        description="Backend that samples the policy's solutions (and the process RM's step rollouts): "
        "'hf' (transformers) or 'vllm' (vLLM's offline engine; needs a worker with vLLM).",
    )
    lora: LoRA | None = Field(None, description="Train LoRA adapters through peft.")
    seed: int = Field(42, ge=0, le=MAX_SEED, description="Seed of the split, sampling and training (0 to 2**32 - 1).")

    @model_validator(mode="after")
    def _process_needs_steps(self) -> RewardModelSpec:
        default = type(self).model_fields["completions_per_step"].default
        if self.type == "outcome" and self.completions_per_step != default:
            raise FieldError(
                "completions_per_step", "completions_per_step is for type='process': remove it or set type='process'"
            )
        if self.sampling.max_new_tokens is None:
            self.sampling.max_new_tokens = DEFAULT_MAX_NEW_TOKENS
        return self


class SFTSpec(_JobBase):
    """Supervised fine-tuning on worked solutions (prompt -> completion), the usual start for RL."""

    kind: Literal["sft"] = Field("sft", description="Supervised fine-tuning.")
    job: ClassVar[JobKind] = JobKind(
        "worker.runners:run_sft", training=True, memory_plan=True, resolve="mathrl.presets:resolve_sft"
    )
    model: ModelRef = Field(..., description="Model to fine-tune; 'tiny:<layers>x<width>' builds a fresh tiny one.")
    dataset: DatasetRef = Field(..., description="Questions with worked solutions (or gold answers) to imitate.")
    max_steps: int = Field(200, ge=1, le=10_000_000, description="Optimizer steps.")
    learning_rate: float = Field(2e-5, gt=0, le=1.0, description="Peak learning rate.")
    per_device_train_batch_size: int = Field(8, ge=1, le=65536, description="Rows per device per micro-step.")
    gradient_accumulation_steps: int = Field(1, ge=1, le=4096, description="Micro-steps per optimizer step.")
    max_length: int = Field(1024, ge=8, le=131072, description="Prompt + completion tokens; longer rows are cut.")
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="Fraction of steps with a linear LR warm-up.")
    lora: LoRA | None = Field(None, description="Train LoRA adapters through peft.")
    gradient_checkpointing: GradientCheckpointing = None
    logging_steps: int = Field(10, ge=1, le=10_000_000, description="Store metrics every N steps.")
    save_steps: int = Field(100, ge=1, le=10_000_000, description="Checkpoint every N steps.")
    seed: int = Field(42, ge=0, le=MAX_SEED, description="Seed of the data order and initialisation (0 to 2**32 - 1).")
    eval: HeldoutEvalField = None

    @model_validator(mode="after")
    def _heldout_benchmark(self) -> SFTSpec:
        if self.eval is not None and self.eval.file is not None:
            raise FieldError(
                "eval", "eval.file is scored by a GRPO job's rewards; an SFT job has none: give a benchmark"
            )
        return self


class GradeSpec(_JobBase):
    """Score given completions with a grader that loads a model (reward_model, score_model,
    label_model): what the graders routes submit for such graders, and wait for. Nothing is
    trained; each item's score and reason are stored as the job's samples."""

    kind: Literal["grade"] = Field("grade", description="Grading given completions.")
    job: ClassVar[JobKind] = JobKind("worker.runners:run_grade", warm_engine=True, loads_model=False)
    grader: Grader = Field(..., description="The grader (mathrl/graders.py), with a reward model in it.")
    items: list[GraderItem] = Field(..., min_length=1, max_length=1000, description="At most 1000 per job.")
    backend: GenerationBackend | Literal["auto"] = Field(
        "hf",
        description="Where a score_model or label_model grader's model answers: 'vllm' the worker's warm vLLM "
        "engine, 'auto' that engine where the worker has vLLM, 'hf' transformers in the job's process.",
    )
    dtype: Dtype = Field("auto", description="The grading model's dtype.")

    @model_validator(mode="after")
    def _one_node(self) -> GradeSpec:
        if self.resources.nodes > 1 or (self.resources.processes or 1) > 1:
            raise FieldError("resources", "a grade job runs as one process on one node: drop resources.nodes/processes")
        return self


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant"] = Field(..., description="Who said it.")
    content: str = Field(..., max_length=100_000, description="What was said.")

    @model_validator(mode="after")
    def _developer_is_system(self) -> ChatMessage:
        if self.role == "developer":  # OpenAI's newer name for the system message
            self.role = "system"
        return self


class GenerateSpec(_JobBase):
    """Answer one chat (through the model's chat template) or one plain prompt: what
    POST /v1/chat/completions and /v1/completions submit for an `ft:` model, and relay. The
    choices are stored as the job's samples; with `stream`, the text also as 'delta' events
    while it is generated (evaluator/chat.py)."""

    kind: Literal["generate"] = Field("generate", description="Answering a chat or a prompt.")
    job: ClassVar[JobKind] = JobKind("worker.runners:run_generate", warm_engine=True)
    model: ModelRef
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=256, description="The chat to answer.")
    prompt: str | None = Field(None, max_length=100_000, description="A plain prompt to continue (no chat template).")
    max_tokens: int = Field(256, ge=1, le=32_768, description="New tokens per choice at most.")
    temperature: float = Field(1.0, ge=0, le=2, description="0: greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    n: int = Field(1, ge=1, le=16, description="Choices.")
    stop: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None, max_length=4, description="Strings that end a choice (cut off)."
    )
    seed: int | None = Field(None, ge=0, le=2**32 - 1, description="Sampling seed.")
    stream: bool = Field(False, description="Store the text as 'delta' events while it is generated.")
    backend: GenerationBackend | Literal["auto"] = Field(
        "hf", description="vllm: the worker's warm vLLM engine; auto: that engine where the worker has vLLM, else hf."
    )
    dtype: Dtype = Field("auto", description="Model weights dtype.")

    @model_validator(mode="after")
    def _one_input(self) -> GenerateSpec:
        if (self.messages is None) == (self.prompt is None):
            raise FieldError("messages", "give either messages (a chat) or prompt (plain text), not both or neither")
        if self.resources.nodes > 1 or (self.resources.processes or 1) > 1:
            raise FieldError(
                "resources", "a generate job runs as one process on one node: drop resources.nodes/processes"
            )
        return self


# The job kinds. A new kind is its spec class above, with its `job` entry (mathrl/kinds.py: its
# runner, how it launches, its admission hooks), and its name here.
AnySpec = EvalSpec | GRPOSpec | RewardModelSpec | SFTSpec | GradeSpec | GenerateSpec
JobSpec = Annotated[AnySpec, Field(discriminator="kind")]
KINDS: Registry[type[AnySpec]] = Registry("job kind")
for _cls in AnySpec.__args__:
    KINDS.add(_cls.model_fields["kind"].default, _cls)
# the job kinds' names (the API's errors and the status pages' filters list them)
JOB_KINDS: tuple[str, ...] = tuple(KINDS)

_adapter: TypeAdapter[AnySpec] = TypeAdapter(JobSpec)


def parse_spec(data: Any) -> AnySpec:
    """Validate a spec from plain data (raises pydantic.ValidationError)."""
    return _adapter.validate_python(data)


# ---- pipelines -------------------------------------------------------------------------

STEP_NAME = r"^[a-z][a-z0-9_-]{0,63}$"
# a job, pipeline or checkpoint id as the API returns it
ID_PATTERN = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def model_refs(spec: AnySpec) -> dict[str, str]:
    """Every model reference in a spec, by its field path ('model', 'rewards/1/model', ...)."""
    out: dict[str, str] = {}
    for name in ("model", "policy"):
        value = getattr(spec, name, None)
        if value:
            out[name] = value
    for i, reward in enumerate(getattr(spec, "rewards", None) or []):
        if reward.model:
            out[f"rewards/{i}/model"] = reward.model
        if reward.grader is not None:
            out.update(grader_models(reward.grader, f"rewards/{i}/grader"))
    grader = getattr(spec, "grader", None)
    if grader is not None:
        out.update(grader_models(grader, "grader"))
    return out


class PipelineSpec(StrictModel):
    """Named job specs submitted together. A spec refers to an earlier step's output with
    'job:<step>' or 'job:<step>@step-200'; it starts when the steps it refers to succeed."""

    name: str | None = Field(None, max_length=200, description="A human-readable name.")
    tags: list[Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:=-]+$")]] = Field(
        default_factory=list, max_length=32, description="Labels copied onto every job of the pipeline."
    )
    jobs: dict[Annotated[str, Field(pattern=STEP_NAME)], JobSpec] = Field(
        ...,
        min_length=1,
        max_length=32,
        description="Step name -> job spec. Step names: lowercase letters, digits, '-' and '_'.",
    )

    def dependencies(self) -> dict[str, list[str]]:
        """Step -> the steps it refers to (in order of first reference)."""
        deps: dict[str, list[str]] = {}
        for step, spec in self.jobs.items():
            deps[step] = []
            for path, ref in model_refs(spec).items():
                target, _ = split_job_ref(ref)
                if not target or ID_PATTERN.match(target):
                    continue  # not a job reference, or an existing job's id (the API checks it)
                if target not in self.jobs:
                    known = ", ".join(sorted(self.jobs))
                    raise FieldError(
                        f"jobs/{step}/{path}",
                        f"{ref!r} refers to no step of this pipeline: use one of {known}, or an existing job's id",
                    )
                if target == step:
                    raise FieldError(f"jobs/{step}/{path}", f"{ref!r}: a step cannot use its own output")
                if target not in deps[step]:
                    deps[step].append(target)
        return deps

    @model_validator(mode="after")
    def _acyclic(self) -> PipelineSpec:
        deps = self.dependencies()
        state: dict[str, int] = {}  # 1 visiting, 2 done

        def visit(step: str, path: list[str]) -> None:
            state[step] = 1
            for nxt in deps[step]:
                if state.get(nxt) == 1:
                    cycle = path[path.index(nxt) :] + [nxt] if nxt in path else [step, nxt]
                    raise FieldError("jobs", "the steps form a cycle: " + " -> ".join(cycle) + "; remove one reference")
                if nxt not in state:
                    visit(nxt, path + [nxt])
            state[step] = 2

        for step in self.jobs:
            if step not in state:
                visit(step, [step])
        return self
