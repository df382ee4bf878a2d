"""What the graders of mathrl/graders.py compute: per completion a score and a reason. The one
implementation of each formula: GRPO's named rewards (trainer/rewards.py), eval graders and POST
/v1/graders:run all grade here.

A grader type is its data class in mathrl/graders.py and one function here, registered with
`@scores(TheGrader)` (SCORERS). `grade_items(grader, completions, answers)` scores a batch; a
reward-model grader needs the caller's scorer (`rm_scorer`), else it is refused. Math answers are
compared by `match` (`match_here` by default; GRPO passes evaluator.bounded.BoundedMatch).
`grade_item` is one item of POST /v1/graders:run, and `grade_openai` one call of OpenAI's graders
route, as evaluator/bounded.py runs them. docs/using.md, "Graders"."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from evaluator.grading import check_answers, extract, find_answer, last_boxed
from evaluator.sandbox import SandboxLimits, run_python
from mathrl import formula, templates
from mathrl.graders import (
    BoxedFormatGrader,
    HashFormatGrader,
    LabelModelGrader,
    LengthPenaltyGrader,
    MathGrader,
    MultiGrader,
    PythonGrader,
    RegexGrader,
    RewardModelGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
    WeightedGrader,
)
from mathrl.regex import compile_pattern
from mathrl.registry import Registry

RMScorer = Callable[[Sequence[str], Sequence[str]], list[float]]  # (prompts, completions) -> scores
# (chats, sampling_params) -> each chat's answer by a grading model (score_model, label_model)
Judge = Callable[[Sequence[list[dict[str, str]]], Mapping[str, Any]], list[str]]
# (answer, gold) pairs -> per pair (equal?, a note when they were not compared)
Matcher = Callable[[Sequence[tuple[str, str]]], list[tuple[bool, str | None]]]


def match_here(pairs: Sequence[tuple[str, str]]) -> list[tuple[bool, str | None]]:
    return [check_answers(answer, gold) for answer, gold in pairs]


@dataclass
class Result:
    score: float
    reason: str
    # OpenAI's error kinds (grader run metadata.errors): invalid_variable_error, formula_parse_error,
    # python_grader_runtime_error, python_grader_server_error, other_error; with a detail
    error: str | None = None
    detail: str | None = None
    sub: dict[str, float] | None = None  # a multi grader's graders' scores by name


@dataclass
class Batch:
    """What a grader may read besides the completions: gold answers, prompts, token ids (GRPO:
    lengths in tokens), which completions were cut off, and the services it may call."""

    completions: Sequence[str]
    answers: Sequence[str | None]
    prompts: Sequence[str]
    completion_ids: Sequence[Sequence[int]] | None
    truncated: Sequence[bool]
    rm_scorer: Callable[[str], RMScorer] | None
    judge: Callable[[str], Judge] | None  # model ref -> what generates a grading model's answers
    match: Matcher
    items: Sequence[Mapping[str, Any]]  # what templates read as `item` (the dataset row)
    sandbox: SandboxLimits


Scorer = Callable[[Any, Batch], list[Result]]
SCORERS: Registry[Scorer] = Registry("grader type")


def scores(grader_type: type[BaseModel]) -> Callable[[Scorer], Scorer]:
    """Register the function that scores `grader_type` (a class of mathrl/graders.py), under
    its `type`."""

    def register(fn: Scorer) -> Scorer:
        return SCORERS.add(grader_type.model_fields["type"].default, fn)

    return register


@scores(MathGrader)
def _math(g: MathGrader, b: Batch) -> list[Result]:
    found = [
        find_answer(c, g.answer_pattern, t) if a is not None else (None, None)
        for c, a, t in zip(b.completions, b.answers, b.truncated, strict=True)
    ]
    todo = [i for i, (x, _) in enumerate(found) if x is not None]
    verdicts = dict(zip(todo, b.match([(str(found[i][0]), str(b.answers[i])) for i in todo]), strict=True))
    out = []
    for i, ((extracted, method), answer, truncated) in enumerate(zip(found, b.answers, b.truncated, strict=True)):
        if answer is None:
            out.append(Result(0.0, "no gold answer to compare with"))
            continue
        if extracted is None:
            how = f"no match of {g.answer_pattern!r}" if g.answer_pattern else "no final answer found"
            cutoff = " (cut off: no last-number fallback)" if truncated and not g.answer_pattern else ""
            out.append(Result(g.no_answer_score, how + cutoff))
            continue
        correct, note = verdicts[i]
        score = 1.0 if correct else g.wrong_score
        if note is not None:
            out.append(Result(score, f"{extracted!r} ({method}) {note}"))
        elif correct:
            out.append(Result(score, f"{extracted!r} ({method}) equals the gold {answer!r}"))
        else:
            out.append(Result(score, f"{extracted!r} ({method}) differs from the gold {answer!r}"))
    return out


@scores(StringCheckGrader)
def _string(g: StringCheckGrader, b: Batch) -> list[Result]:
    return [
        _string_one(g, c, a, t, item)
        for c, a, t, item in zip(b.completions, b.answers, b.truncated, b.items, strict=True)
    ]


def _string_one(
    g: StringCheckGrader, completion: str, answer: str | None, truncated: bool, item: Mapping[str, Any]
) -> Result:
    try:
        if g.input == "completion":
            text: str | None = completion.strip()
        elif g.input == "extracted":
            text = extract(completion, truncated)[0]
        else:
            text = templates.render(g.input, templates.sample_namespace(completion), item)
        reference = templates.render(g.reference, templates.sample_namespace(completion), item)
    except templates.TemplateError as e:
        return Result(0.0, str(e), error="invalid_variable_error", detail=str(e))
    reference = reference.replace("{answer}", answer or "")
    if text is None:
        return Result(0.0, "no final answer found")
    ok = {
        "eq": text == reference,
        "ne": text != reference,
        "contains": reference in text,
        "like": reference in text,
        "icontains": reference.lower() in text.lower(),
        "ilike": reference.lower() in text.lower(),
    }[g.operation]
    return Result(float(ok), f"{text[:80]!r} {g.operation} {reference[:80]!r}: {'yes' if ok else 'no'}")


@scores(TextSimilarityGrader)
def _similarity(g: TextSimilarityGrader, b: Batch) -> list[Result]:
    from evaluator.similarity import similarity

    out = []
    for completion, item in zip(b.completions, b.items, strict=True):
        sample = templates.sample_namespace(completion)
        try:
            text, reference = templates.render(g.input, sample, item), templates.render(g.reference, sample, item)
        except templates.TemplateError as e:
            out.append(Result(0.0, str(e), error="invalid_variable_error", detail=str(e)))
            continue
        value = similarity(g.evaluation_metric, text, reference)
        if g.pass_threshold is not None:
            ok = value >= g.pass_threshold
            out.append(
                Result(float(ok), f"{g.evaluation_metric} {value:.4g} {'>=' if ok else '<'} {g.pass_threshold:g}")
            )
        else:
            out.append(Result(value, f"{g.evaluation_metric} {value:.4g}"))
    return out


@scores(PythonGrader)
def _python(g: PythonGrader, b: Batch) -> list[Result]:
    cases = [(templates.sample_namespace(c), dict(item)) for c, item in zip(b.completions, b.items, strict=True)]
    out = []
    for r in run_python(g.source, cases, b.sandbox):
        if r.error is None and r.score is not None:
            out.append(Result(r.score, f"grade() returned {r.score:g}"))
        elif r.error == "runtime":
            out.append(Result(0.0, f"grade() raised: {r.detail}", error="python_grader_runtime_error", detail=r.detail))
        else:
            out.append(
                Result(0.0, f"the sandbox stopped it: {r.detail}", error="python_grader_server_error", detail=r.detail)
            )
    return out


@scores(ScoreModelGrader)
@scores(LabelModelGrader)
def _model_grader(g: ScoreModelGrader | LabelModelGrader, b: Batch) -> list[Result]:
    """A grading model reads the grader's messages (templates filled from each sample and item)
    and answers with a score or a label (evaluator/judge.py generates it)."""
    if b.judge is None:
        raise ValueError(f"a {g.type} grader needs its grading model loaded: it runs on a worker ('grade' jobs)")
    chats: list[list[dict[str, str]] | None] = []
    out: list[Result | None] = []
    for completion, item in zip(b.completions, b.items, strict=True):
        try:
            chats.append(judge_chat(g.input, templates.sample_namespace(completion), item))
            out.append(None)
        except templates.TemplateError as e:
            chats.append(None)
            out.append(Result(0.0, str(e), error="invalid_variable_error", detail=str(e)))
    todo = [(i, c) for i, c in enumerate(chats) if c is not None]
    answers = b.judge(g.model)([c for _, c in todo], g.sampling_params or {}) if todo else []
    for (i, _), answer in zip(todo, answers, strict=True):
        out[i] = read_score(g, answer) if isinstance(g, ScoreModelGrader) else read_label(g, answer)
    return [r for r in out if r is not None]


def judge_chat(
    messages: Sequence[Mapping[str, Any]], sample: Mapping[str, Any], item: Mapping[str, Any]
) -> list[dict[str, str]]:
    """A model grader's `input` with its templates filled: OpenAI's messages (content a string or
    a list of text parts; role 'developer' is a system message here)."""
    chat = []
    for m in messages:
        content = m.get("content", "")
        if isinstance(content, list):
            content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        role = str(m.get("role", "user"))
        chat.append(
            {"role": "system" if role == "developer" else role, "content": templates.render(str(content), sample, item)}
        )
    return chat


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def read_score(g: ScoreModelGrader, answer: str) -> Result:
    """score_model: the first number of the model's answer (or its JSON's `score`), kept within
    `range` (default [0, 1]); no number scores the range's low end."""
    low, high = g.range or [0.0, 1.0]
    value: Any = None
    text = answer.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text).get("score")
        except (ValueError, AttributeError):
            value = None
    if not isinstance(value, int | float):
        m = _NUMBER.search(text)
        value = float(m.group(0)) if m else None
    if value is None or value != value:
        why = f"no score in the grading model's answer {text[:80]!r}"
        return Result(low, why, error="model_grader_parse_error", detail=why)
    clipped = min(max(float(value), low), high)
    note = "" if clipped == value else f", clipped to [{low:g}, {high:g}]"
    return Result(clipped, f"the grading model scored {float(value):g}{note}")


def read_label(g: LabelModelGrader, answer: str) -> Result:
    """label_model: the label the model answered (its whole answer, else the first label named
    in it, case-insensitive); 1 when it is a passing label."""
    text = answer.strip().strip(".\"'` ").lower()
    by_name = {label.lower(): label for label in g.labels}
    label = by_name.get(text)
    if label is None:
        found = [(m.start(), x) for x in g.labels if (m := re.search(rf"\b{re.escape(x.lower())}\b", text))]
        label = min(found)[1] if found else None
    if label is None:
        why = f"the grading model gave none of the labels: {answer.strip()[:80]!r}"
        return Result(0.0, why, error="model_grader_parse_error", detail=why)
    passed = label in g.passing_labels
    return Result(float(passed), f"the grading model labelled it {label!r}: {'passing' if passed else 'not passing'}")


@scores(MultiGrader)
def _multi(g: MultiGrader, b: Batch) -> list[Result]:
    parts = {name: _score(sub, b) for name, sub in g.graders.items()}
    out = []
    for i in range(len(b.completions)):
        values = {name: r[i].score for name, r in parts.items()}
        failed = next((r[i] for r in parts.values() if r[i].error), None)
        try:
            score = formula.evaluate(g.calculate_output, values)
        except formula.FormulaError as e:
            kind = "invalid_variable_error" if isinstance(e, formula.FormulaVariableError) else "formula_parse_error"
            out.append(Result(0.0, str(e), error=kind, detail=str(e), sub=values))
            continue
        reason = f"{g.calculate_output} = {score:.4g} with " + ", ".join(f"{k}={v:.4g}" for k, v in values.items())
        out.append(
            Result(
                score,
                reason,
                error=failed.error if failed else None,
                detail=failed.detail if failed else None,
                sub=values,
            )
        )
    return out


@scores(RegexGrader)
def _regex(g: RegexGrader, b: Batch) -> list[Result]:
    pattern = compile_pattern(g.pattern)  # RE2: linear time (mathrl/regex.py)
    out = []
    for completion in b.completions:
        found = pattern.search(completion) is not None
        ok = found != g.negate
        out.append(
            Result(float(ok), f"pattern {'found' if found else 'not found'}" + (" (negated)" if g.negate else ""))
        )
    return out


@scores(BoxedFormatGrader)
def _boxed(g: BoxedFormatGrader, b: Batch) -> list[Result]:
    out = []
    for completion in b.completions:
        boxed = last_boxed(completion)
        ok = boxed is not None and bool(boxed.strip())
        out.append(Result(float(ok), "a non-empty \\boxed{} answer" if ok else "no non-empty \\boxed{} answer"))
    return out


HASH_ANSWER = re.compile(r"^####[ \t]*[-$]{0,2}[\d,]*\.?\d+[ \t]*$", re.M)  # a sign or a dollar: -3.5, $12


@scores(HashFormatGrader)
def _hash(g: HashFormatGrader, b: Batch) -> list[Result]:
    out = []
    for completion in b.completions:
        ok = HASH_ANSWER.search(completion) is not None
        out.append(Result(float(ok), "a '#### <number>' answer line" if ok else "no '#### <number>' answer line"))
    return out


@scores(LengthPenaltyGrader)
def _length(g: LengthPenaltyGrader, b: Batch) -> list[Result]:
    """DAPO's soft overlong penalty, in tokens where the ids are known, else in words."""
    if b.completion_ids is not None:
        lengths, unit = [len(ids) for ids in b.completion_ids], "tokens"
    else:
        lengths, unit = [len(c.split()) for c in b.completions], "words"
    buffer = max(1, min(g.buffer, g.max_length))
    start = g.max_length - buffer
    out = []
    for length in lengths:
        if length <= start:
            out.append(Result(0.0, f"{length} {unit} <= {start}: no penalty"))
        else:
            out.append(Result(-min(1.0, (length - start) / buffer), f"{length} {unit}, {length - start} over {start}"))
    return out


@scores(RewardModelGrader)
def _reward_model(g: RewardModelGrader, b: Batch) -> list[Result]:
    if b.rm_scorer is None:
        raise ValueError("a reward_model grader needs its model loaded: it runs in GRPO and eval jobs")
    values = b.rm_scorer(g.model)(list(b.prompts), list(b.completions))
    return [Result(float(s), f"reward model score {s:.4g}") for s in values]


@scores(WeightedGrader)
def _weighted(g: WeightedGrader, b: Batch) -> list[Result]:
    parts = [_score(p.grader, b) for p in g.graders]
    out = []
    for i in range(len(b.completions)):
        score = sum(p.weight * r[i].score for p, r in zip(g.graders, parts, strict=True))
        reason = " + ".join(
            f"{p.weight:g} x {p.grader.type} {r[i].score:g} ({r[i].reason})"
            for p, r in zip(g.graders, parts, strict=True)
        )
        out.append(Result(score, reason))
    return out


def _score(grader: Any, batch: Batch) -> list[Result]:
    return SCORERS[grader.type](grader, batch)


def grade_items(
    grader: Any,
    completions: Sequence[str],
    answers: Sequence[str | None],
    *,
    prompts: Sequence[str] | None = None,
    completion_ids: Sequence[Sequence[int]] | None = None,
    truncated: Sequence[bool] | None = None,
    rm_scorer: Callable[[str], RMScorer] | None = None,
    judge: Callable[[str], Judge] | None = None,
    match: Matcher = match_here,
    items: Sequence[Mapping[str, Any]] | None = None,
    sandbox: SandboxLimits | None = None,
) -> list[Result]:
    """Score each completion against its gold answer. `completion_ids` (GRPO) measure lengths in
    tokens, else in words; `truncated` marks completions cut off at the length limit; `items`
    are what templates read as `item` (default: {answer, prompt}); `sandbox`: the python
    grader's limits."""
    n = len(completions)
    if len(answers) != n:
        raise ValueError(f"{n} completions but {len(answers)} answers")
    prompts = list(prompts) if prompts is not None else [""] * n
    rows = list(items) if items is not None else [{}] * n
    batch = Batch(
        completions=completions,
        answers=answers,
        prompts=prompts,
        completion_ids=completion_ids,
        truncated=list(truncated) if truncated is not None else [False] * n,
        rm_scorer=rm_scorer,
        judge=judge,
        match=match,
        items=[{"answer": a, "prompt": p, **dict(row)} for a, p, row in zip(answers, prompts, rows, strict=True)],
        sandbox=sandbox or SandboxLimits(),
    )
    return _score(grader, batch)


@functools.lru_cache(maxsize=8)
def _grader(grader_json: str) -> Any:
    from pydantic import TypeAdapter

    from mathrl.graders import Grader

    return TypeAdapter(Grader).validate_json(grader_json)


def grade_item(
    grader_json: str,
    completion: str,
    answer: str | None,
    prompt: str,
    fields: dict[str, Any] | None = None,
    sandbox: SandboxLimits | None = None,
) -> tuple[float, str]:
    """One item of POST /v1/graders:run: (score, reason). Plain data in and out, for the call's
    own process (evaluator/bounded.py); the grader as JSON, parsed once per process."""
    r = grade_items(
        _grader(grader_json), [completion], [answer], prompts=[prompt], items=[fields or {}], sandbox=sandbox
    )[0]
    return r.score, r.reason


def grade_openai(grader_json: str, model_sample: str, item: dict[str, Any], sandbox: SandboxLimits) -> dict[str, Any]:
    """One call of POST /v1/fine_tuning/alpha/graders/run: the reward, the named graders' rewards,
    the error kind if any, in the call's own process (evaluator/bounded.py). The item's
    `answer` field, if any, is the gold answer that math graders compare with."""
    answer = item.get("answer") if isinstance(item.get("answer"), str) else None
    r = grade_items(_grader(grader_json), [model_sample], [answer], items=[item], sandbox=sandbox)[0]
    return {"reward": r.score, "reason": r.reason, "error": r.error, "detail": r.detail, "sub": r.sub or {}}
