"""An OpenAI fine-tuning job's request (api/routers/openai_fine_tuning.py), checked and mapped to the
job it is: `JobCreateParams` and its hyperparameters ('auto' or a number in bounds, `auto_or`), and
`to_spec`: a reinforcement request as a GRPO spec, a supervised one as an SFT spec, each
hyperparameter's value as mapped (what 'auto' became), and each refused field a 422 at the
request's own pointer. docs/openai-rft.md has the mapping table."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from sqlalchemy.orm import Session

from api.openai.files import own_file
from api.openai.models import grading_models_mapped, trainable_model
from api.problems import Problem
from mathrl.graders import Grader
from mathrl.modelref import FINE_TUNING_TAG
from mathrl.shallow import JsonObject
from mathrl.specs import GRPOSpec, SFTSpec
from mathrl.specs.base import knob_defaults
from mathrl.specs.generate import REASONING_TOKENS

# OpenAI's hyperparameters -> mathrl's: the values 'auto' takes, and the bases the multipliers scale
AUTO_EPOCHS = 1
AUTO_BATCH = 4  # prompts (OpenAI's examples) per step
# OpenAI's multipliers scale the specs' own defaults, declared once there: TRL's knobs (GRPO's group
# size, learning rate and completion length) and mathrl's SFT learning rate
_GRPO = knob_defaults(GRPOSpec)
GROUP = int(_GRPO["num_generations"])  # completions per prompt, times compute_multiplier
RL_LEARNING_RATE = float(_GRPO["learning_rate"])  # GRPO, times learning_rate_multiplier
SFT_LEARNING_RATE = float(SFTSpec.model_fields["learning_rate"].default)  # SFT, times learning_rate_multiplier
COMPLETION_TOKENS = int(_GRPO["max_completion_length"])  # what a GRPO job generates unless reasoning_effort says
MAX_VALIDATION = 5000  # validation items scored each time (HeldoutEval.limit's cap)


class _Open(BaseModel):
    model_config = ConfigDict(extra="forbid")


Auto = Literal["auto"]


def auto_or(kind: type[int] | type[float], low: int, high: int, *, above: bool = False) -> Any:
    """'auto' or a number in bounds. Its one error names both: pydantic's own, of the union's first
    member ("Input should be 'auto' (and 1 more)", at param 'n_epochs.literal['auto']'), named neither
    the field nor its bounds."""
    bounds = Field(gt=low, le=high) if above else Field(ge=low, le=high)
    what = "an integer" if kind is int else "a number"
    message = f"use 'auto' or {what} {f'above {low} and at most {high}' if above else f'from {low} to {high}'}"

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(message) from None

    return Annotated[Auto | Annotated[kind, bounds], WrapValidator(check)]


class Hyperparameters(_Open):
    batch_size: auto_or(int, 1, 4096) | None = None  # type: ignore[valid-type]
    learning_rate_multiplier: auto_or(float, 0, 100, above=True) | None = None  # type: ignore[valid-type]
    n_epochs: auto_or(int, 1, 50) | None = None  # type: ignore[valid-type]


class ReinforcementHyperparameters(Hyperparameters):
    compute_multiplier: auto_or(float, 0, 16, above=True) | None = None  # type: ignore[valid-type]
    eval_interval: auto_or(int, 1, 100_000) | None = None  # type: ignore[valid-type]
    eval_samples: auto_or(int, 1, 100) | None = None  # type: ignore[valid-type]
    reasoning_effort: Literal["default", "low", "medium", "high"] | None = None


class Reinforcement(_Open):
    grader: Grader
    hyperparameters: ReinforcementHyperparameters | None = None
    response_format: JsonObject | None = None


class Supervised(_Open):
    hyperparameters: Hyperparameters | None = None


class Method(_Open):
    type: Literal["supervised", "reinforcement", "dpo"]
    reinforcement: Reinforcement | None = None
    supervised: Supervised | None = None
    dpo: JsonObject | None = None


class JobCreateParams(_Open):
    model: str = Field(..., min_length=1, max_length=512, description="A model mathrl can load (a path, hub id, job:).")
    training_file: str = Field(..., max_length=64, description="An uploaded file's id (POST /v1/files).")
    validation_file: str | None = Field(None, max_length=64)
    suffix: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    seed: int | None = Field(None, ge=0, le=2**32 - 1)
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        None, max_length=16
    )
    hyperparameters: Hyperparameters | None = None  # OpenAI's older top-level form (supervised)
    method: Method | None = None
    integrations: list[JsonObject] | None = None


def _value(v: Any, auto: Any) -> Any:
    return auto if v is None or v == "auto" else v


def file_lines(session: Session, project_id: str, body: JobCreateParams) -> tuple[int, int]:
    """The lines of the request's training file and of its validation file (0 without one): each a
    file of the project whose every line the method can train (or score) on, else a 422 naming it."""
    try:
        training = own_file(session, project_id, body.training_file)
    except Problem:
        raise Problem.at("/training_file", f"{body.training_file!r}: no file with this id in your project") from None
    validation_lines = 0
    if body.validation_file is not None:
        try:
            validation = own_file(session, project_id, body.validation_file)
        except Problem:
            raise Problem.at(
                "/validation_file", f"{body.validation_file!r}: no file with this id in your project"
            ) from None
        validation_lines = int((validation.data or {}).get("lines", 0))
        rl = (validation.data or {}).get("reinforcement_lines", 0)
        sl = (validation.data or {}).get("supervised_lines", 0)
        if body.method is not None and body.method.type == "reinforcement" and rl != validation_lines:
            detail = f"{validation_lines - rl} of its {validation_lines} lines do not end with a user message"
            raise Problem.at("/validation_file", detail)
        if (body.method is None or body.method.type == "supervised") and sl != validation_lines:
            detail = (
                f"{validation_lines - sl} of its {validation_lines} lines do not end with a user message and the "
                "assistant's answer (a supervised line's last message is what its loss is taken on)"
            )
            raise Problem.at("/validation_file", detail)
    stats = training.data or {}
    lines = int(stats.get("lines", 0))
    kind = body.method.type if body.method else "supervised"
    if kind == "reinforcement":
        if stats.get("reinforcement_lines", 0) != lines:
            raise Problem.at(
                "/training_file",
                f"{lines - stats.get('reinforcement_lines', 0)} of its {lines} lines do not end with a user message: "
                "a reinforcement file's messages are the prompt the model answers",
            )
    if kind == "supervised" and stats.get("supervised_lines", 0) != lines:
        raise Problem.at(
            "/training_file",
            f"{lines - stats.get('supervised_lines', 0)} of its {lines} lines do not end with a user message and "
            "the assistant's answer to learn (a supervised line's last message is its target)",
        )
    return lines, validation_lines


def to_spec(
    body: JobCreateParams,
    lines: int,
    generation_backend: str = "auto",
    validation_lines: int = 0,
    aliases: dict[str, str] | None = None,
) -> tuple[GRPOSpec | SFTSpec, dict[str, Any]]:
    """The mathrl spec of an OpenAI fine-tuning request on a file of `lines` lines, and how each
    hyperparameter was mapped. Its model, and a reinforcement grader's models, are named as the
    operator's `aliases` map them (trainable_model)."""
    aliases = aliases or {}
    method = body.method or Method(type="supervised", supervised=Supervised(hyperparameters=body.hyperparameters))
    if method.type == "dpo":
        raise Problem.at("/method/type", "'dpo' is not trained here: use 'reinforcement' (GRPO) or 'supervised' (SFT)")
    common: dict[str, Any] = {
        "dataset": {"file": body.training_file, "format": "messages"},
        "tags": [FINE_TUNING_TAG],
    }
    if body.suffix:
        common["name"] = body.suffix
    if body.seed is not None:
        common["seed"] = body.seed
    if method.type == "reinforcement":
        if method.reinforcement is None:
            raise Problem.at("/method/reinforcement", "a reinforcement job needs method.reinforcement.grader")
        if method.reinforcement.response_format is not None:  # taken and dropped, every sample scored 0: refused
            raise Problem.at(
                "/method/reinforcement/response_format",
                "structured outputs are not enforced here: the policy generates free text, and a grader's "
                "{{sample.output_json}} is that text parsed as JSON. Leave response_format out and ask for the JSON "
                "in the training file's prompts",
            )
        hp = method.reinforcement.hyperparameters or ReinforcementHyperparameters()
        epochs, batch = _value(hp.n_epochs, AUTO_EPOCHS), _value(hp.batch_size, AUTO_BATCH)
        group = max(2, round(GROUP * _value(hp.compute_multiplier, 1.0)))
        steps = max(1, math.ceil(epochs * lines / batch))
        save_steps = _value(hp.eval_interval, max(1, steps // 4))
        effort = hp.reasoning_effort
        length = REASONING_TOKENS.get(effort or "")
        held_out = None
        if body.validation_file is not None:  # scored by the job's rewards every eval_interval steps
            held_out = {
                "file": body.validation_file,
                "every": save_steps,
                "limit": max(1, min(validation_lines, _value(hp.eval_samples, MAX_VALIDATION))),
                # scored at the length the policy is trained to write (a fixed 256 cut it at half of TRL's 512)
                "max_new_tokens": COMPLETION_TOKENS if length is None else length,
            }
        model = trainable_model(body.model, aliases)
        grader = grading_models_mapped(method.reinforcement.grader, aliases, "/method/reinforcement/grader")
        spec: GRPOSpec | SFTSpec = _built(
            GRPOSpec,
            model=model,
            **common,
            rewards=[{"name": "grader", "grader": grader.model_dump(mode="json")}],
            learning_rate=RL_LEARNING_RATE * _value(hp.learning_rate_multiplier, 1.0),
            num_generations=group,
            global_batch_size=batch * group,
            per_device_train_batch_size=batch * group,
            max_steps=steps,
            logging_steps=1,
            save_steps=save_steps,
            generation={"backend": generation_backend},
            max_completion_length=length,
            eval=held_out,
        )
        mapping = {
            "n_epochs": epochs,
            "batch_size": batch,
            "learning_rate_multiplier": _value(hp.learning_rate_multiplier, 1.0),
            "compute_multiplier": _value(hp.compute_multiplier, 1.0),
            "eval_interval": save_steps,
            "eval_samples": held_out["limit"] if held_out is not None else None,
            "reasoning_effort": effort or "default",
        }
        return spec, mapping
    hp_s = (method.supervised.hyperparameters if method.supervised else None) or body.hyperparameters
    hp_s = hp_s or Hyperparameters()
    epochs, batch = _value(hp_s.n_epochs, AUTO_EPOCHS), _value(hp_s.batch_size, AUTO_BATCH)
    steps = max(1, math.ceil(epochs * lines / batch))
    save_steps = max(1, steps // 4)
    held_out = None
    if body.validation_file is not None:  # its loss at each checkpoint: OpenAI's full_valid_loss
        held_out = {
            "file": body.validation_file,
            "every": save_steps,
            "limit": max(1, min(validation_lines, MAX_VALIDATION)),
        }
    spec = _built(
        SFTSpec,
        model=trainable_model(body.model, aliases),
        **common,
        learning_rate=SFT_LEARNING_RATE * _value(hp_s.learning_rate_multiplier, 1.0),
        per_device_train_batch_size=batch,
        max_steps=steps,
        logging_steps=1,
        save_steps=save_steps,
        eval=held_out,
    )
    mapping = {
        "n_epochs": epochs,
        "batch_size": batch,
        "learning_rate_multiplier": _value(hp_s.learning_rate_multiplier, 1.0),
    }
    return spec, mapping


Spec = TypeVar("Spec", GRPOSpec, SFTSpec)


def _built(kind: type[Spec], **fields: Any) -> Spec:
    """The spec, or the first field it refuses as a 422 at the request's pointer for it (the model's
    and the grader's are the request's own; a hyperparameter's value refused is named as the spec's
    field it became)."""
    try:
        return kind(**fields)
    except ValidationError as e:  # e.g. a model reference mathrl cannot load
        err = e.errors()[0]
        where = "/" + "/".join(str(p) for p in err["loc"] if not str(p).startswith(("grpo", "sft")))
        pointer = {"/model": "/model", "/rewards/0/grader": "/method/reinforcement/grader"}.get(where, where)
        raise Problem.at(pointer, err["msg"]) from None
