"""A model reference in a spec: a hub id, a local path, or another job's output."""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from mathrl.marks import field_mark

# A model reference: a hub id ("org/name"), a local path ("/models/x", "./x"), or the
# output of another job ("job:<id>" or "job:<id>@step-200").
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_JOB_REF = re.compile(r"^job:[A-Za-z0-9_-]+(@(step-\d+|latest|final))?$")


def is_hub_id(ref: str) -> bool:
    """'org/name' (or 'name'): what a model reference names on the hub, not a path or a job."""
    return bool(_HUB_ID.match(ref))


def split_job_ref(ref: str) -> tuple[str, str]:
    """The one parser of a 'job:' reference: 'job:grpo@step-200' -> ('grpo', '@step-200');
    ('', '') for anything else."""
    if not ref.startswith("job:"):
        return "", ""
    target, at, which = ref[4:].partition("@")
    return target, at + which


# OpenAI's names for a fine-tuning job and the models it made: 'ftjob-<32 hex>' (the job's id
# without dashes) and 'ft:<base>:<suffix>:ftjob-<hex>[:ckpt-step-N]'
_HEX32 = re.compile(r"[0-9a-f]{32}")
_FT_MODEL = re.compile(r"^ft:[^:]{1,200}:[^:]{1,200}:(ftjob-[0-9a-f]{32})(?::ckpt-step-(\d{1,9}))?$")


def ftjob_id(job_id: str) -> str:
    """A job's id as OpenAI's fine-tuning API shows it: 'ftjob-' and the id without dashes."""
    return "ftjob-" + job_id.replace("-", "")


def job_uuid(ft_id: str) -> str | None:
    """The job id behind 'ftjob-<hex>', or None for anything else."""
    return uuid_after("ftjob-", ft_id)


def uuid_after(prefix: str, value: str) -> str | None:
    """The uuid behind '<prefix><32 hex>' (an OpenAI-shaped id: 'ftjob-', 'evalrun_', 'resp_',
    'outputitem_'), or None for anything else."""
    hexpart = value.removeprefix(prefix)
    if not value.startswith(prefix) or not _HEX32.fullmatch(hexpart):
        return None
    return str(uuid.UUID(hexpart))


FINE_TUNING_TAG = "openai:fine_tuning"  # the jobs POST /v1/fine_tuning/jobs made
RESULTS_PURPOSE = "fine-tune-results"  # a succeeded fine-tuning job's step metrics file (its result_files)
# A fine-tuning job's metrics under OpenAI's names, as its checkpoints' `metrics` and its `metrics`
# events carry them (mathrl's name -> OpenAI's)
OPENAI_METRICS = {
    "loss": "train_loss",
    "mean_token_accuracy": "train_mean_token_accuracy",
    "reward": "train_reward_mean",
    "heldout/reward": "valid_reward_mean",
    # a supervised job's validation file (trainer/sft.py), scored whole (up to eval.limit) at each checkpoint
    "eval_loss": "full_valid_loss",
    "eval_mean_token_accuracy": "full_valid_mean_token_accuracy",
}
# The results file's columns: OpenAI's names (its fine-tuning guide reads `train_loss` and
# `train_accuracy` there), before the job's other metrics under mathrl's names.
RESULTS_COLUMNS = {
    **OPENAI_METRICS,
    "mean_token_accuracy": "train_accuracy",
    "eval_loss": "valid_loss",
    "eval_mean_token_accuracy": "valid_mean_token_accuracy",
}


def results_file_id(job_id: str) -> str:
    """The id of a fine-tuning job's results file: 'file-' and the job's id without dashes (both uuid7s:
    ordered, and never another file's)."""
    return "file-" + job_id.replace("-", "")


# on a job whose final model was deleted (DELETE /v1/models/{model}): its name and 'job:<id>@final' are gone
FINAL_DELETED_TAG = "model:final-deleted"
SESSION_SUFFIX = "tinker"  # a Tinker session's saves: ft:<base>:tinker:ftjob-<id>:ckpt-step-<save number>


def ft_model_name(base: str, suffix: str, job_id: str, step: int | None = None) -> str:
    """The `ft:` name of a fine-tuning job's model (or of its checkpoint at `step`). A base that is
    no hub id or path ('job:<id>@final', 'tiny:2x64') keeps its text without ':' or '@', which end
    the name's parts: with them the name was one no route could read back."""
    shown = base.rstrip("/").rsplit("/", 1)[-1].replace(":", "-").replace("@", "-") or "model"
    name = f"ft:{shown}:{suffix}:{ftjob_id(job_id)}"
    return name if step is None else f"{name}:ckpt-step-{step}"


def ft_model_ref(name: str) -> str | None:
    """The 'job:' reference an `ft:` model name stands for ('job:<id>@final' or
    'job:<id>@step-N'); None when `name` is not one."""
    m = _FT_MODEL.match(name)
    if m is None:
        return None
    job_id = job_uuid(m.group(1))
    return f"job:{job_id}@" + (f"step-{m.group(2)}" if m.group(2) else "final")


TINY_LAYERS, TINY_WIDTH = 8, 1024  # 'tiny:<layers>x<width>' at most: a model for tests and demos


def tiny_shape(ref: str) -> dict[str, int] | None:
    """The shape of the model a 'tiny:<layers>x<width>' ref names (worker.child.build_tiny builds it), as
    its config.json has it; None for any other ref."""
    m = re.fullmatch(r"tiny:(\d{1,2})x(\d{2,4})", ref)
    if m is None:
        return None
    width = int(m.group(2))
    return {
        "num_hidden_layers": int(m.group(1)),
        "hidden_size": width,
        "num_attention_heads": 4 if width % 4 == 0 else 1,
    }


def check_model_ref(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValueError("must not be empty: give a hub id such as 'Qwen/Qwen2.5-0.5B', a path, or 'job:<id>'")
    if m := re.fullmatch(r"tiny:(\d{1,2})x(\d{2,4})", value):  # a fresh tiny model built by the worker
        layers, width = int(m.group(1)), int(m.group(2))
        if not (1 <= layers <= TINY_LAYERS and 16 <= width <= TINY_WIDTH and width % 8 == 0):
            raise ValueError(  # (tiny:99x9999 was ~100 billion weights, built on the worker until it ran out of memory)
                f"{value!r}: a tiny model has 1 to {TINY_LAYERS} layers and a width of 16 to {TINY_WIDTH}, a "
                "multiple of 8 (its attention heads' size must be even), e.g. 'tiny:2x64'"
            )
        return value
    if value.startswith("ft:"):
        ref = ft_model_ref(value)
        if ref is None:
            raise ValueError(
                f"{value!r} is not a fine-tuned model's name: 'ft:<base>:<suffix>:ftjob-<id>[:ckpt-step-N]'"
            )
        return ref
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
    if not is_hub_id(value):
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


def names_a_model(field: Any) -> bool:
    """Whether a pydantic field (its FieldInfo) is typed ModelRef, alone or in a union (`ModelRef |
    None`): the one test by which mathrl.specs.model_refs finds every model a spec loads."""
    return field_mark(field, _is_check) is not None


def _is_check(meta: Any) -> bool:
    return isinstance(meta, AfterValidator) and meta.func is check_model_ref
