"""A model reference in a spec: a hub id, a local path, or another job's output."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

# A model reference: a hub id ("org/name"), a local path ("/models/x", "./x"), or the
# output of another job ("job:<id>" or "job:<id>@step-200").
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_JOB_REF = re.compile(r"^job:[A-Za-z0-9_-]+(@(step-\d+|latest|final))?$")


def split_job_ref(ref: str) -> tuple[str, str]:
    """The one parser of a 'job:' reference: 'job:grpo@step-200' -> ('grpo', '@step-200');
    ('', '') for anything else."""
    if not ref.startswith("job:"):
        return "", ""
    target, at, which = ref[4:].partition("@")
    return target, at + which


def check_model_ref(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValueError("must not be empty: give a hub id such as 'Qwen/Qwen2.5-0.5B', a path, or 'job:<id>'")
    if re.fullmatch(r"tiny:\d{1,2}x\d{2,4}", value):
        return value  # a fresh tiny model built by the worker (sft jobs)
    if value.startswith("job:"):
        if not _JOB_REF.match(value):
            raise ValueError(
                f"{value!r} is not a job reference: write 'job:<id>', 'job:<id>@step-200' or 'job:<id>@final'"
            )
        return value
    if value.startswith(("/", "./", "../", "~")):
        return value
    if "://" in value:
        raise ValueError(
            f"{value!r}: URLs are not accepted; use a hub id, a path under a configured root, or 'job:<id>'"
        )
    if not _HUB_ID.match(value):
        raise ValueError(f"{value!r} is not a hub id ('org/name'), an absolute path, or 'job:<id>'")
    return value


ModelRef = Annotated[
    str,
    AfterValidator(check_model_ref),
    Field(
        min_length=1,
        max_length=512,
        description="Hub id ('org/name'), a local path, or another job's output ('job:<id>[@step-N]').",
        examples=["HuggingFaceTB/SmolLM2-135M-Instruct"],
    ),
]
