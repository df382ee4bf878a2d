"""Pipelines: named job specs submitted together, ordered by the 'job:<step>' references between them."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, model_validator

from mathrl.errors import FieldError
from mathrl.modelref import split_job_ref
from mathrl.specs.base import StrictModel
from mathrl.specs.job import JobSpec
from mathrl.specs.refs import model_refs

STEP_NAME = r"^[a-z][a-z0-9_-]{0,63}$"
# a job, pipeline or checkpoint id as the API returns it
ID_PATTERN = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


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
                if not target:
                    continue  # not a job reference
                if target not in self.jobs and ID_PATTERN.match(target):
                    continue  # an existing job's id (the API checks it); a step so named is that step
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
