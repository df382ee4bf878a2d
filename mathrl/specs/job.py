"""The job kinds: the union of every kind's spec, its registry, and `parse_spec`."""

from __future__ import annotations

from typing import Annotated, Any, get_args

from pydantic import Field, TypeAdapter

from mathrl.registry import Registry
from mathrl.specs.eval import EvalSpec
from mathrl.specs.generate import GenerateSpec
from mathrl.specs.grade import GradeSpec
from mathrl.specs.grpo import GRPOSpec
from mathrl.specs.reward_model import RewardModelSpec
from mathrl.specs.session import SessionSpec
from mathrl.specs.sft import SFTSpec

# The job kinds. A new kind is its spec class (a module of mathrl/specs/) and its name here; its home on the server,
# everything the server does with it, is kinds/<kind>.py (registered in kinds.HOMES).
AnySpec = EvalSpec | GRPOSpec | RewardModelSpec | SFTSpec | GradeSpec | GenerateSpec | SessionSpec
JobSpec = Annotated[AnySpec, Field(discriminator="kind")]
KINDS: Registry[type[AnySpec]] = Registry("job kind")
for _cls in get_args(AnySpec):
    KINDS.add(_cls.model_fields["kind"].default, _cls)
# the job kinds' names (the API's errors and the status pages' filters list them)
JOB_KINDS: tuple[str, ...] = tuple(KINDS)

_adapter: TypeAdapter[AnySpec] = TypeAdapter(JobSpec)


def parse_spec(data: Any) -> AnySpec:
    """Validate a spec from plain data (raises pydantic.ValidationError)."""
    return _adapter.validate_python(data)
