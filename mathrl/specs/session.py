"""Training sessions (`kind: session`): a LoRA adapter on a base model held in a worker's memory
while a client drives it call by call (the Tinker API: forward_backward, optim_step, sample,
save_state). The API's Tinker routes (api/routers/tinker.py) submit these; the job serves the
client's calls until the client finishes it, stops sending heartbeats, or it is cancelled."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from mathrl.modelref import ModelRef
from mathrl.specs.base import Dtype, JobBase

DEFAULT_HEARTBEAT_TIMEOUT = 120  # seconds without a client call before a session ends itself


class SessionSpec(JobBase):
    """One training client (or one sampling client) of a Tinker session: the model, its LoRA
    adapter and AdamW optimizer live in the job's process between calls."""

    kind: Literal["session"] = Field("session", description="A client-driven training session (Tinker's API).")
    model: ModelRef
    session: str = Field(..., min_length=1, max_length=100, description="The client's session id (create_session).")
    lora_rank: int = Field(32, ge=1, le=512, description="The LoRA adapter's rank (alpha is fixed at 32).")
    train_attn: bool = Field(True, description="Adapt the attention projections.")
    train_mlp: bool = Field(True, description="Adapt the MLP projections.")
    train_unembed: bool = Field(True, description="Adapt the output projection (lm_head).")
    seed: int | None = Field(None, ge=0, le=2**31 - 1, description="Seed of the adapter's initial weights.")
    train: bool = Field(True, description="false: a sampling client only (no optimizer).")
    load: ModelRef | None = Field(
        None, description="A saved state to start from: 'job:<session job>@step-N' (a save_state or sampler save)."
    )
    load_optimizer: bool = Field(False, description="Restore the optimizer's state with `load`.")
    heartbeat_timeout_seconds: int = Field(
        DEFAULT_HEARTBEAT_TIMEOUT,
        ge=10,
        le=86_400,
        description="The session ends itself (succeeded) when no call or heartbeat came for this long.",
    )
    warm_engine: bool = Field(
        False,
        description="Sample on the worker's warm vLLM engine of the base model where it has one idle (CPU sessions "
        "without an lm_head adapter), else with transformers. The API sets it from sessions.warm_engine.",
    )
    user_metadata: dict[Annotated[str, Field(max_length=128)], Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=dict,
        max_length=64,
        description="The client's own labels for its training run (the SDK's user_metadata), returned with the run.",
    )
    dtype: Dtype = Field("auto", description="Model weights dtype.")
    max_attempts: int = Field(
        1, ge=1, le=1, description="One: a session's state is in its process's memory; a retry would lose it."
    )
