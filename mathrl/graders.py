"""Graders: typed, composable scoring of a completion against its gold answer, each giving a
score and a reason. The same objects score GRPO rewards (`rewards: [{name: grader, grader:
...}]`), eval items (`EvalSpec.grader`) and `POST /v1/graders:run`, which tries one on given
completions before a run is paid for. They are data, except a python grader's source, which
runs in a sandbox (evaluator/sandbox.py). Their implementations: evaluator/graders.py; the
graders that load a model (reward_model, score_model, label_model) run on a worker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mathrl import formula, templates
from mathrl.errors import FieldError
from mathrl.modelref import ModelRef
from mathrl.regex import check_regex
from mathrl.shallow import JsonObject


class _Grader(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MathGrader(_Grader):
    """1 when the completion's final answer equals the gold answer by math-verify (fractions,
    decimals, percentages, sets, intervals, matrices...), else `wrong_score` (0), or
    `no_answer_score` (0) when it gives no final answer."""

    type: Literal["math"] = "math"
    answer_pattern: str | None = Field(
        None,
        max_length=512,
        description="A regex whose first match's group 1 is the answer; unset: the last \\boxed{}, a '####' "
        "line, 'the answer is ...', else the last number (not for a cut-off completion).",
    )

    wrong_score: float = Field(0.0, ge=-100, le=100, description="The score of an answer that differs from the gold.")
    no_answer_score: float = Field(
        0.0, ge=-100, le=100, description="The score of a completion with no final answer (e.g. -0.5, DeepSeekMath's)."
    )

    @model_validator(mode="after")
    def _pattern(self) -> MathGrader:
        check_regex("answer_pattern", self.answer_pattern, group=True)
        return self


class StringCheckGrader(_Grader):
    """1 when the chosen text passes the comparison with the reference, else 0. OpenAI's form
    (`input` and `reference` as templates such as '{{sample.output_text}}' and
    '{{item.answer}}', operations like and ilike) is this grader too."""

    type: Literal["string_check"] = "string_check"
    name: str | None = Field(None, max_length=200, description="A name for the grader (OpenAI's graders have one).")
    input: str = Field(
        "extracted",
        max_length=4000,
        description="'completion' (the whole completion, stripped), 'extracted' (its final answer), or a "
        "template: '{{sample.output_text}}', '{{sample.output_json.<path>}}', '{{item.<field>}}'.",
    )
    operation: Literal["eq", "ne", "like", "ilike", "contains", "icontains"] = Field(
        "eq", description="How the two are compared: like (contains) and ilike (contains, any case) as OpenAI's."
    )
    reference: str = Field(
        "{answer}",
        max_length=4000,
        description="What it is compared with; '{answer}' is replaced by the gold answer; a template as input.",
    )

    @model_validator(mode="after")
    def _templates(self) -> StringCheckGrader:
        _check_template("input", self.input)
        _check_template("reference", self.reference)
        return self


def _check_template(field: str, template: str) -> None:
    try:
        templates.check(template)
    except templates.TemplateError as e:
        raise FieldError(field, str(e)) from None


SimilarityMetric = Literal[
    "cosine",
    "fuzzy_match",
    "bleu",
    "gleu",
    "meteor",
    "rouge_1",
    "rouge_2",
    "rouge_3",
    "rouge_4",
    "rouge_5",
    "rouge_l",
]
SIMILARITY_METRICS: tuple[str, ...] = tuple(m for m in get_args(SimilarityMetric) if m != "cosine")


class TextSimilarityGrader(_Grader):
    """OpenAI's text_similarity: a similarity in [0, 1] of the input to the reference
    (evaluator/similarity.py says which library computes each metric)."""

    type: Literal["text_similarity"] = "text_similarity"
    name: str | None = Field(None, max_length=200, description="A name for the grader.")
    input: str = Field("{{sample.output_text}}", max_length=4000, description="The text graded: a template.")
    reference: str = Field(..., max_length=100_000, description="The text it is compared with: a template.")
    evaluation_metric: SimilarityMetric = Field(
        ..., description="The metric; 'cosine' needs an embedding model, which this service does not configure."
    )
    pass_threshold: float | None = Field(
        None, ge=0, le=1, description="Set: the score is 1 when the similarity reaches it, else 0."
    )

    @model_validator(mode="after")
    def _metric(self) -> TextSimilarityGrader:
        if self.evaluation_metric == "cosine":
            raise FieldError(
                "evaluation_metric",
                "'cosine' needs an embedding model and none is configured here: use one of "
                + ", ".join(SIMILARITY_METRICS),
            )
        _check_template("input", self.input)
        _check_template("reference", self.reference)
        return self


MAX_PYTHON_SOURCE = 256 * 1024


class PythonGrader(_Grader):
    """OpenAI's python grader: `grade(sample, item) -> float` of the given source, run in a
    sandbox (evaluator/sandbox.py: its own process, resource limits, no network, its own
    directory)."""

    type: Literal["python"] = "python"
    name: str | None = Field(None, max_length=200, description="A name for the grader.")
    source: str = Field(
        ..., min_length=1, max_length=MAX_PYTHON_SOURCE, description="Python source defining grade(sample, item)."
    )
    image_tag: str | None = Field(
        None, max_length=200, description="OpenAI's runtime image: accepted and ignored (one runtime here)."
    )

    @model_validator(mode="after")
    def _compiles(self) -> PythonGrader:
        try:
            compile(self.source, "grader.py", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            line = f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""
            msg = e.msg if isinstance(e, SyntaxError) else str(e)
            raise FieldError("source", f"the source does not compile{line}: {msg}") from None
        return self


class _ModelGrader(_Grader):
    name: str | None = Field(None, max_length=200, description="A name for the grader.")
    model: ModelRef = Field(
        ..., description="The grading model: a hub id, a path, 'job:<id>' or an 'ft:' model of this project."
    )
    input: list[Annotated[JsonObject, Field(max_length=8)]] = Field(
        ..., min_length=1, max_length=64, description="The messages, as templates."
    )
    sampling_params: JsonObject | None = Field(
        None, max_length=16, description="The grading model's sampling parameters."
    )


class ScoreModelGrader(_ModelGrader):
    """OpenAI's score_model: the grading model reads `input` (templates filled) and answers a
    number, kept within `range` (default [0, 1])."""

    type: Literal["score_model"] = "score_model"
    range: list[Annotated[float, Field(ge=-1e6, le=1e6)]] | None = Field(
        None, min_length=2, max_length=2, description="[low, high] of the score."
    )


class LabelModelGrader(_ModelGrader):
    """OpenAI's label_model: the grading model reads `input` (templates filled) and answers one
    of `labels`; 1 when it is one of `passing_labels`."""

    type: Literal["label_model"] = "label_model"
    labels: list[str] = Field(..., min_length=1, max_length=64, description="The labels the model may give.")
    passing_labels: list[str] = Field(..., min_length=1, max_length=64, description="The labels that score 1.")


class RegexGrader(_Grader):
    """A format check: 1 when the pattern is found in the completion (or when it is not, with
    `negate`), else 0."""

    type: Literal["regex"] = "regex"
    pattern: str = Field(
        ...,
        min_length=1,
        max_length=512,
        description="A regular expression, run on RE2 in linear time: Python's syntax without backreferences, "
        "lookarounds, atomic groups or possessive quantifiers (refused); \\d, \\w, \\s and \\b match ASCII "
        "only (\\p{N}, \\p{L} for Unicode).",
    )
    negate: bool = Field(False, description="Score 1 when the pattern is absent instead.")

    @model_validator(mode="after")
    def _pattern(self) -> RegexGrader:
        check_regex("pattern", self.pattern, group=False)
        return self


class BoxedFormatGrader(_Grader):
    """A format check: 1 when the completion ends its answer in a non-empty \\boxed{...} (nested
    braces counted), else 0."""

    type: Literal["boxed_format"] = "boxed_format"


class HashFormatGrader(_Grader):
    """A format check for GSM8K-style answers: 1 when the completion gives its final answer on a
    '#### <number>' line (the format GSM8K's solutions and the gsm8k recipes use), else 0."""

    type: Literal["hash_format"] = "hash_format"


class LengthPenaltyGrader(_Grader):
    """DAPO's soft overlong penalty: 0 up to max_length - buffer, then down linearly to -1 at
    max_length. Lengths are completion tokens where token ids are known (GRPO), else
    whitespace-separated words (eval items, /v1/graders:run)."""

    type: Literal["length_penalty"] = "length_penalty"
    max_length: int = Field(..., ge=1, le=131072, description="The length at which the penalty reaches -1.")
    buffer: int = Field(..., ge=1, le=131072, description="How long before max_length the penalty starts.")


class RewardModelGrader(_Grader):
    """The scalar score of a trained outcome reward model. Needs the model on a worker: GRPO and
    eval jobs run it; /v1/graders:run refuses it (the API runs no model)."""

    type: Literal["reward_model"] = "reward_model"
    model: ModelRef = Field(..., description="An RM path or 'job:<rm-job-id>'.")


# the graders that hold no other graders: a weighted or multi grader's parts
_Simple = (
    MathGrader
    | StringCheckGrader
    | RegexGrader
    | BoxedFormatGrader
    | HashFormatGrader
    | LengthPenaltyGrader
    | RewardModelGrader
    | TextSimilarityGrader
    | PythonGrader
    | ScoreModelGrader
    | LabelModelGrader
)
SimpleGrader = Annotated[_Simple, Field(discriminator="type")]


class WeightedPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grader: SimpleGrader
    weight: float = Field(1.0, ge=-100, le=100, description="This grader's weight in the sum.")


class WeightedGrader(_Grader):
    """The weighted sum of other graders' scores (e.g. math 1.0 + regex format 0.1)."""

    type: Literal["weighted"] = "weighted"
    graders: list[WeightedPart] = Field(..., min_length=1, max_length=16, description="The graders and their weights.")


class MultiGrader(_Grader):
    """OpenAI's multi grader: named graders, and `calculate_output`, a formula over their scores
    (mathrl/formula.py: + - * / ^, min, max, abs, floor, ceil, exp, sqrt, log; never eval)."""

    type: Literal["multi"] = "multi"
    name: str | None = Field(None, max_length=200, description="A name for the grader.")
    graders: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")], SimpleGrader] = Field(
        ..., min_length=1, max_length=16, description="The graders by name; the formula refers to these names."
    )
    calculate_output: str = Field(
        ..., min_length=1, max_length=formula.MAX_LENGTH, description="The formula, e.g. '0.5 * a + 0.5 * b'."
    )

    @model_validator(mode="after")
    def _formula(self) -> MultiGrader:
        try:
            formula.parse(self.calculate_output, self.graders)
        except formula.FormulaError as e:
            raise FieldError("calculate_output", str(e)) from None
        return self


Grader = Annotated[_Simple | WeightedGrader | MultiGrader, Field(discriminator="type")]
# every grader type, read off the union above (a new grader is its class, its name in `_Simple`,
# and its scorer in evaluator/graders.py)
GRADER_TYPES: tuple[str, ...] = tuple(
    c.model_fields["type"].default for c in (*get_args(_Simple), WeightedGrader, MultiGrader)
)
OPENAI_GRADER_TYPES = ("string_check", "text_similarity", "python", "score_model", "label_model", "multi")


def parts(grader: BaseModel, path: str = "") -> Iterator[tuple[str, BaseModel]]:
    """The grader and every grader inside it, each with its JSON pointer below `path`."""
    yield path, grader
    if isinstance(grader, WeightedGrader):
        for j, part in enumerate(grader.graders):
            yield from parts(part.grader, f"{path}/graders/{j}/grader")
    if isinstance(grader, MultiGrader):
        for name, g in grader.graders.items():
            yield from parts(g, f"{path}/graders/{name}")


MODEL_GRADERS = (RewardModelGrader, ScoreModelGrader, LabelModelGrader)  # they load a model: a worker runs them


def needs_model(grader: BaseModel) -> bool:
    return any(isinstance(g, MODEL_GRADERS) for _, g in parts(grader))


def uses_similarity(grader: BaseModel) -> bool:
    """Whether a text_similarity grader is anywhere inside it (its metrics' libraries are the workers')."""
    return any(isinstance(g, TextSimilarityGrader) for _, g in parts(grader))


def runs_code(grader: BaseModel) -> bool:
    """Whether the grader runs a user's source (a python grader, anywhere inside it)."""
    return any(isinstance(g, PythonGrader) for _, g in parts(grader))


def grader_models(grader: BaseModel, path: str = "") -> dict[str, str]:
    """The models a grader loads (reward models, grading models), by field path."""
    return {f"{p}/model": g.model for p, g in parts(grader, path) if isinstance(g, MODEL_GRADERS)}


def with_models(grader: Any, new_ref: Callable[[str], str]) -> Any:
    """A copy of the grader with each model reference inside it replaced by `new_ref(ref)`."""
    if isinstance(grader, MODEL_GRADERS):
        return grader.model_copy(update={"model": new_ref(grader.model)})
    if isinstance(grader, WeightedGrader):
        weighted = [p.model_copy(update={"grader": with_models(p.grader, new_ref)}) for p in grader.graders]
        return grader.model_copy(update={"graders": weighted})
    if isinstance(grader, MultiGrader):
        named = {name: with_models(g, new_ref) for name, g in grader.graders.items()}
        return grader.model_copy(update={"graders": named})
    return grader


class GraderItem(BaseModel):
    """One completion to grade: POST /v1/graders:run's items, and a 'grade' job's. Templates see
    `item` as {answer, prompt, **fields}."""

    model_config = ConfigDict(extra="forbid")

    completion: str = Field(..., max_length=100_000, description="A model's completion.")
    answer: str | None = Field(None, max_length=10_000, description="The gold answer ('math' and '{answer}' need it).")
    prompt: str = Field("", max_length=100_000, description="The prompt it answered (reward models read it).")
    fields: JsonObject | None = Field(
        None, max_length=256, description="More fields of the dataset item, for templates ('{{item.<field>}}')."
    )
