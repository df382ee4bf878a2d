"""LoRA adapters (peft) for GRPO and SFT jobs."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from mathrl.errors import FieldError
from mathrl.specs.base import StrictModel

# 'all-linear' or a list of module names; tagged (like base.RecipeField) so an error points at
# target_modules, not at a union member
LoraTargets = Annotated[
    Annotated[list[Annotated[str, Field(min_length=1, max_length=128)]], Field(max_length=256), Tag("module-names")]
    | Annotated[Literal["all-linear"], Tag("all-linear")],
    Discriminator(lambda v: "all-linear" if isinstance(v, str) else "module-names"),
]


# max_lora_rank values vLLM accepts (a capacity bound: an r=4 adapter is served under 8): a job whose
# adapters vLLM serves (GRPO's server mode, an eval of a LoRA checkpoint on vLLM) has r at most the last
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


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
