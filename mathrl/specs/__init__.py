"""Job specs: what a user submits, validated the same way by the SDK, the API and the worker.

A spec is discriminated by ``kind``. Every field carries a description (it becomes the OpenAPI
documentation) and every impossible setting fails with a message that says how to fix it. GRPO knobs
left unset are filled by a preset (``mathrl.specs.presets``); the run stores the fully resolved
values.

One module per job kind (eval, grpo, reward_model, sft, grade, generate, session), what they share
(base, inputs, rewards, lora), the union of kinds (job: `AnySpec`, `KINDS`, `parse_spec`),
pipelines, and the models and files a spec refers to (refs). Import from `mathrl.specs`: every name
is here."""

from __future__ import annotations

from mathrl.errors import FieldError as FieldError  # raised by the specs, imported from here by the API
from mathrl.fileref import FileRef as FileRef  # specs' users import it from here
from mathrl.modelref import ModelRef as ModelRef  # specs' users import it from here
from mathrl.modelref import check_model_ref as check_model_ref
from mathrl.modelref import split_job_ref as split_job_ref  # the API imports it from here
from mathrl.specs.base import (
    LORA_TAGS as LORA_TAGS,
)
from mathrl.specs.base import (
    MAX_SEED as MAX_SEED,
)
from mathrl.specs.base import (
    RAY_QUEUE as RAY_QUEUE,
)
from mathrl.specs.base import (
    UNION_TAGS as UNION_TAGS,
)
from mathrl.specs.base import (
    Dtype as Dtype,
)
from mathrl.specs.base import (
    GenerationBackend as GenerationBackend,
)
from mathrl.specs.base import (
    GradientCheckpointing as GradientCheckpointing,
)
from mathrl.specs.base import (
    JobBase as JobBase,
)
from mathrl.specs.base import (
    RecipeField as RecipeField,
)
from mathrl.specs.base import (
    Resources as Resources,
)
from mathrl.specs.base import (
    StrictModel as StrictModel,
)
from mathrl.specs.base import (
    kind_required as kind_required,
)
from mathrl.specs.eval import (
    EvalSpec as EvalSpec,
)
from mathrl.specs.generate import (
    ChatMessage as ChatMessage,
)
from mathrl.specs.generate import (
    GenerateSpec as GenerateSpec,
)
from mathrl.specs.grade import (
    GradeSpec as GradeSpec,
)
from mathrl.specs.grpo import (
    Curriculum as Curriculum,
)
from mathrl.specs.grpo import (
    DynamicSampling as DynamicSampling,
)
from mathrl.specs.grpo import (
    Generation as Generation,
)
from mathrl.specs.grpo import (
    GRPOSpec as GRPOSpec,
)
from mathrl.specs.grpo import (
    HeldoutEval as HeldoutEval,
)
from mathrl.specs.grpo import (
    HeldoutEvalField as HeldoutEvalField,
)
from mathrl.specs.grpo import (
    LossType as LossType,
)
from mathrl.specs.inputs import (
    DEFAULT_MAX_NEW_TOKENS as DEFAULT_MAX_NEW_TOKENS,
)
from mathrl.specs.inputs import (
    DatasetRef as DatasetRef,
)
from mathrl.specs.inputs import (
    Sampling as Sampling,
)
from mathrl.specs.job import (
    JOB_KINDS as JOB_KINDS,
)
from mathrl.specs.job import (
    KINDS as KINDS,
)
from mathrl.specs.job import (
    AnySpec as AnySpec,
)
from mathrl.specs.job import (
    JobSpec as JobSpec,
)
from mathrl.specs.job import (
    parse_spec as parse_spec,
)
from mathrl.specs.lora import (
    LoRA as LoRA,
)
from mathrl.specs.lora import (
    LoraTargets as LoraTargets,
)
from mathrl.specs.pipelines import (
    ID_PATTERN as ID_PATTERN,
)
from mathrl.specs.pipelines import (
    STEP_NAME as STEP_NAME,
)
from mathrl.specs.pipelines import (
    PipelineSpec as PipelineSpec,
)
from mathrl.specs.refs import (
    FileUse as FileUse,
)
from mathrl.specs.refs import (
    HoldsAFile as HoldsAFile,
)
from mathrl.specs.refs import (
    file_refs as file_refs,
)
from mathrl.specs.refs import (
    model_refs as model_refs,
)
from mathrl.specs.refs import (
    with_file_paths as with_file_paths,
)
from mathrl.specs.reward_model import (
    RewardModelSpec as RewardModelSpec,
)
from mathrl.specs.rewards import (
    REWARD_NAMES as REWARD_NAMES,
)
from mathrl.specs.rewards import (
    RewardName as RewardName,
)
from mathrl.specs.rewards import (
    RewardRef as RewardRef,
)
from mathrl.specs.session import (
    SessionSpec as SessionSpec,
)
from mathrl.specs.sft import (
    SFTSpec as SFTSpec,
)
