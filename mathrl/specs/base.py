"""What every job spec shares: the strict model, resources (which queue a job goes to), the
common fields of a job, and the field types several kinds use."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from mathrl.backends import GenerationBackend as GenerationBackend  # the backends a job can name
from mathrl.errors import FieldError
from mathrl.recipe import Recipe

Dtype = Literal["auto", "float32", "bfloat16", "float16"]  # a model's weights dtype, as jobs give it


class StrictModel(BaseModel):
    """Unknown fields are errors: a typo must not be silently ignored. NaN and +-Infinity (which
    Python's JSON parser reads) are errors too: JSON cannot store them (they came back as null)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


# seeds go to numpy, torch and random: numpy takes 0 .. 2**32 - 1
MAX_SEED = 2**32 - 1

POOL_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")  # a queue name: resources.pool, settings worker.pools
QUEUE_LENGTH = 32  # the jobs table's queue column: a pool's name, and 'gpu-64-' + gpu_type
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
        max_length=QUEUE_LENGTH - len("gpu-64-"),
        pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="The GPU model a one-node GPU job needs, e.g. 'h100': it goes to queue 'gpu-N-<gpu_type>' (a "
        "worker pool of that card) instead of 'gpu-N'. Needs gpus > 0; not with pool or nodes > 1.",
    )
    pool: str | None = Field(
        None,
        max_length=QUEUE_LENGTH,
        pattern=POOL_NAME.pattern,
        description="A worker pool's queue that the operator runs (e.g. 'h100-vllm'; another name is refused, "
        "with the ones it runs); default: 'cpu' or 'gpu-N' from gpus.",
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


def kind_required(schema: dict[str, Any]) -> None:
    # 'kind' has a default for Python callers, but the API picks the spec by it: say it is required
    schema["required"] = sorted({*schema.get("required", []), "kind"})


class JobBase(StrictModel):
    model_config = ConfigDict(json_schema_extra=kind_required)

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
# LoRA's target_modules tags (mathrl/specs/lora.py) too
LORA_TAGS = ("module-names", "all-linear")
UNION_TAGS = ("by-name", "inline", *LORA_TAGS)
# A training knob's TRL default, in its field's JSON schema (read back by knob_defaults)
TRL_DEFAULT = "x-trl-default"
UNSET = " Unset: the preset's value, else TRL's default"


def Knob(trl_default: Any, description: str, **bounds: Any) -> Any:  # a Field, named like one
    """A training knob, declared once: its help, its bounds and TRL's default. The spec's field is
    unset (None) unless given; a preset's values (mathrl/specs/presets.py) and then TRL's default fill it at
    resolution, and the resolved config (mathrl/specs/resolved.py: `_knob`) reuses this
    declaration's help."""
    shown = (
        "none" if trl_default is None else repr(trl_default).lower() if isinstance(trl_default, bool) else trl_default
    )
    return Field(
        None, description=f"{description}{UNSET} ({shown}).", json_schema_extra={TRL_DEFAULT: trl_default}, **bounds
    )


def knob_defaults(model: type[BaseModel]) -> dict[str, Any]:
    """Every knob of a spec class with TRL's default for it."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra
        if isinstance(extra, dict) and TRL_DEFAULT in extra:
            out[name] = extra[TRL_DEFAULT]
    return out


def knob_help(model: type[BaseModel], name: str) -> str:
    """A knob's help, as its declaration gives it (without the note on what fills it when unset)."""
    return (model.model_fields[name].description or "").split(UNSET)[0]


# GRPO and SFT jobs
GradientCheckpointing = Annotated[
    bool | None,
    Knob(
        True,
        "Recompute each layer's activations in the backward pass instead of keeping them (TRL's "
        "gradient_checkpointing): far less memory for activations, about a third more compute per step.",
    ),
]

RecipeField = Annotated[
    Annotated[Annotated[str, Field(min_length=1, max_length=128)], Tag("by-name")] | Annotated[Recipe, Tag("inline")],
    Discriminator(lambda v: "by-name" if isinstance(v, str) else "inline"),
]
