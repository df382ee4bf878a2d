"""An eval's and a run's request (OpenAI's Evals API, api/routers/openai_evals.py), checked field by
field and mapped to the job a run is: each bad field a 400 naming it (`Problem.at`), before
anything is stored.
- `criteria`: the testing criteria as one `multi` grader, and each one's pass rule;
- `run_job`: a run's data source as its job's spec (as a dict the router parses: `job_spec`):
  `completions` and `responses` an eval job over the run's items, `jsonl` a grade job of the given
  samples."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from sqlalchemy.orm import Session

from api.openai.files import own_file, store_jsonl
from api.openai.models import grading_models_mapped, own_ft_model, trainable_model
from api.problems import Problem, validation_errors
from config.settings import Settings
from mathrl.graders import Grader
from mathrl.jsonl_files import check_item_line, item_of
from mathrl.shallow import JsonObject
from mathrl.specs import AnySpec, parse_spec
from mathrl.specs.generate import DEFAULT_MAX_TOKENS, effort_budget
from store.ids import uuid7

CRITERIA = ("string_check", "text_similarity", "python", "score_model", "label_model")
MAX_CRITERIA = 16  # a multi grader's graders (mathrl/graders.py)
MAX_GRADED = 1000  # items of a jsonl run: a grade job's (mathrl/specs/grade.py)
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


Metadata = dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]]


class _Open(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EvalCreateParams(_Open):
    name: str | None = Field(None, max_length=256)
    data_source_config: JsonObject
    testing_criteria: list[JsonObject] = Field(..., min_length=1)
    metadata: Metadata | None = Field(None, max_length=16)


class EvalUpdateParams(_Open):
    name: str | None = Field(None, max_length=256)
    metadata: Metadata | None = Field(None, max_length=16)


class RunCreateParams(_Open):
    name: str | None = Field(None, max_length=256)
    data_source: JsonObject | None = Field(None, description="Required: checked after the eval is found (a 404 first).")
    metadata: Metadata | None = Field(None, max_length=16)


def check_source_config(config: dict[str, Any]) -> dict[str, Any]:
    kind = config.get("type")
    if kind in ("logs", "stored_completions"):
        raise Problem.at(
            "/data_source_config/type",
            f"{kind!r} reads OpenAI's stored chat completions, which this server does not keep: use 'custom', with "
            "an item_schema of your items, and give the items to each run (a file of purpose 'evals', or inline)",
            status=400,
        )
    if kind != "custom":
        raise Problem.at("/data_source_config/type", f"{kind!r}: the type is 'custom'", status=400)
    unknown = set(config) - {"type", "item_schema", "include_sample_schema"}
    if unknown:
        raise Problem.at(f"/data_source_config/{sorted(unknown)[0]}", "not a field of a custom data source", status=400)
    if not isinstance(config.get("item_schema"), dict):
        raise Problem.at("/data_source_config/item_schema", "the JSON schema of an item (an object)", status=400)
    if not isinstance(config.get("include_sample_schema", False), bool):
        raise Problem.at("/data_source_config/include_sample_schema", "true or false", status=400)
    return config


def criteria(raw: list[dict[str, Any]], aliases: dict[str, str] | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """The testing criteria as one `multi` grader (each criterion a named grader, `c0`, `c1`...), and
    each one's name, type and pass rule. `aliases`: map grading models' names (fine_tuning.model_aliases)."""
    if len(raw) > MAX_CRITERIA:
        raise Problem.at("/testing_criteria", f"{len(raw)} criteria: at most {MAX_CRITERIA} here", status=400)
    graders: dict[str, Any] = {}
    rules: list[dict[str, Any]] = []
    for i, c in enumerate(raw):
        at = f"/testing_criteria/{i}"
        c = dict(c)
        kind = c.get("type")
        if kind not in CRITERIA:
            raise Problem.at(f"{at}/type", f"{kind!r}: a testing criterion is one of {', '.join(CRITERIA)}", status=400)
        if not isinstance(c.get("name"), str) or not c["name"]:
            raise Problem.at(f"{at}/name", "a testing criterion has a name", status=400)
        threshold = c.pop("pass_threshold", None)
        if kind == "text_similarity" and threshold is None:
            raise Problem.at(f"{at}/pass_threshold", "a text_similarity criterion needs its pass_threshold", status=400)
        if threshold is not None and (
            kind in ("string_check", "label_model")
            or not isinstance(threshold, int | float)
            or isinstance(threshold, bool)
        ):
            what = "a number" if kind not in ("string_check", "label_model") else f"not a field of {kind}"
            raise Problem.at(f"{at}/pass_threshold", what, status=400)
        try:
            grader = TypeAdapter(Grader).validate_python(c)
        except ValidationError as e:
            err = validation_errors(e.errors())[0]  # its pointer names the field, past the grader type's tag
            where = err["pointer"].removeprefix(f"/{kind}")
            raise Problem.at(f"{at}{where}", err["detail"], status=400) from None
        if aliases is not None:
            grader = grading_models_mapped(grader, aliases, at)
        graders[f"c{i}"] = grader.model_dump(mode="json", exclude_none=True)
        rules.append({"name": c["name"], "type": kind, "pass_threshold": threshold})
    multi = TypeAdapter(Grader).validate_python({"type": "multi", "graders": graders, "calculate_output": "c0"})
    return multi, rules


def items_file(settings: Settings, session: Session, project_id: str, content: list[Any], at: str) -> str:
    """A run's inline items (file_content), stored as a file of the project (purpose 'evals'), as
    an upload is, within its file quota: the eval job reads them from there."""
    from store.files import OverQuota

    lines = []
    for n, row in enumerate(content):
        if bad := check_item_line(row):
            raise Problem.at(f"{at}/{n}/{bad[0][0]}".rstrip("/"), bad[0][1], status=400)
        lines.append({"item": item_of(row)})
    file_id = "file-" + uuid7().replace("-", "")
    data = {"lines": len(lines), "fields": sorted(item_of(content[0]))}
    try:
        store_jsonl(
            session, settings, project_id, file_id, lines, filename="eval-run-items.jsonl", purpose="evals", data=data
        )
    except OverQuota as e:
        raise Problem(429, "Too many files", f"the run's items are stored as a file of your project: {e}") from None
    return file_id


def source_rows(session: Session, project_id: str, source: dict[str, Any], at: str) -> list[Any]:
    """A jsonl run's rows ({item, sample}), from the request or the project's file."""
    if source.get("type") == "file_content":
        rows = source.get("content")
        if not isinstance(rows, list) or not rows:
            raise Problem.at(f"{at}/content", "a non-empty list of {item, sample}", status=400)
        return rows
    if source.get("type") == "file_id":
        row = file_of(session, project_id, source, at)
        lines = int((row.data or {}).get("lines", 0))
        if lines > MAX_GRADED:  # counted at upload: not read into the API to be refused
            raise Problem.at(f"{at}/id", f"{lines} rows: a jsonl run grades at most {MAX_GRADED}", status=400)
        with open(row.path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    raise Problem.at(f"{at}/type", f"{source.get('type')!r}: a source is 'file_id' or 'file_content'", status=400)


def file_of(session: Session, project_id: str, source: dict[str, Any], at: str) -> Any:
    file_id = source.get("id")
    try:
        return own_file(session, project_id, str(file_id))
    except Problem:
        raise Problem.at(f"{at}/id", f"{file_id!r}: no file with this id in your project", status=400) from None


def template_text(template: Any) -> Any:
    """The template's messages with their content as text: OpenAI's eval items may hold it as an
    `input_text` (or `output_text`) part, or a list of them; an image is a 400."""
    if not isinstance(template, list):
        return template  # the spec names what is wrong
    out = []
    for i, m in enumerate(template):
        content = m.get("content") if isinstance(m, dict) else None
        parts = [content] if isinstance(content, dict) else content if isinstance(content, list) else None
        if parts is not None:
            texts = []
            for part in parts:
                if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
                    at = f"/data_source/input_messages/template/{i}/content"
                    raise Problem.at(at, "text only here: input_text or output_text parts (no images)", status=400)
                texts.append(str(part.get("text", "")))
            m = {**m, "content": "".join(texts)}
        out.append(m)
    return out


def sampling_of(params: dict[str, Any], at: str) -> dict[str, Any]:
    """OpenAI's sampling_params as an eval job's sampling: temperature and top_p 1 where not sent,
    as OpenAI samples."""
    served = {"temperature", "top_p", "max_completion_tokens", "max_completions_tokens", "seed", "reasoning_effort"}
    unknown = set(params) - served
    if unknown:
        raise Problem.at(f"{at}/{sorted(unknown)[0]}", "not a sampling parameter served here", status=400)
    effort = params.get("reasoning_effort")  # a length budget where no max is given, as for chats
    budget = effort_budget(effort) if isinstance(effort, str) and effort in EFFORTS else None
    if effort is not None and budget is None:
        raise Problem.at(f"{at}/reasoning_effort", f"{effort!r}: one of {', '.join(EFFORTS)}", status=400)
    # (the graders' sampling_params spell it max_completions_tokens: a script may carry that over)
    most = params.get("max_completion_tokens") or params.get("max_completions_tokens")
    return {
        "temperature": params.get("temperature", 1.0),
        "top_p": params.get("top_p", 1.0),
        "max_new_tokens": most or budget or DEFAULT_MAX_TOKENS,
        "seed": params.get("seed", 0),
    }


def as_sampled(ds: dict[str, Any]) -> dict[str, Any]:
    """A `responses` run (the current Evals guide's) as the same eval job as a `completions` run: the
    model answers each item's prompt once, and the grader reads its text as {{sample.output_text}}
    (template items may be Responses' `{type: message, role, content}`, a `developer` message the
    system prompt: mathrl.specs.inputs.PromptMessage). Refused by field: stored responses as the items (`source` of type
    'responses'), tools, and a text format other than plain text."""
    source = ds.get("source")
    if isinstance(source, dict) and source.get("type") == "responses":
        detail = "stored responses as items are not served here: give the items as 'file_id' or 'file_content'"
        raise Problem.at("/data_source/source/type", detail, status=400)
    params = dict(ds.get("sampling_params") or {})
    if params.pop("tools", None):
        raise Problem.at("/data_source/sampling_params/tools", "a run's model samples without tools here", status=400)
    text = params.pop("text", None)
    fmt = text.get("format") if isinstance(text, dict) else text
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type", "text") != "text"):
        detail = "plain text only here: {format: {type: text}} (structured outputs are not served)"
        raise Problem.at("/data_source/sampling_params/text/format", detail, status=400)
    return {**ds, "sampling_params": params}


def completions_spec(
    session: Session, settings: Settings, project_id: str, ds: dict[str, Any], grader: Any
) -> tuple[dict[str, Any], str, str | None]:
    """The eval job of a `completions` run, the model's name as the run reports it, and the file its
    inline items were stored as (None: an uploaded file)."""
    model = ds.get("model")
    if not isinstance(model, str) or not model:
        raise Problem.at(
            "/data_source/model", "the model to sample: an 'ft:' model, or a model this server runs", status=400
        )
    aliases = settings.fine_tuning.model_aliases
    if model.startswith("ft:") and model not in aliases:
        try:
            ref = own_ft_model(session, project_id, model)
        except Problem:
            raise Problem.at("/data_source/model", f"{model!r}: no such model in your project", status=400) from None
    else:
        ref = trainable_model(model, aliases, "/data_source/model", "evaluate")
    messages = ds.get("input_messages")
    if not isinstance(messages, dict):
        raise Problem.at("/data_source/input_messages", "the prompt: {type: template, template: [...]}", status=400)
    dataset: dict[str, Any] = {"format": "items"}
    if messages.get("type") == "template":
        dataset["template"] = template_text(messages.get("template"))
    elif messages.get("type") == "item_reference":
        reference = str(messages.get("item_reference") or "")
        if not reference.startswith("item."):
            raise Problem.at(
                "/data_source/input_messages/item_reference", "a field of the item: 'item.<field>'", status=400
            )
        dataset["messages_field"] = reference.removeprefix("item.")
    else:
        detail = f"{messages.get('type')!r}: input_messages is a 'template' or an 'item_reference'"
        raise Problem.at("/data_source/input_messages/type", detail, status=400)
    source = ds.get("source")
    if not isinstance(source, dict):
        raise Problem.at(
            "/data_source/source", "the items: {type: file_id, id} or {type: file_content, content}", status=400
        )
    sampling = sampling_of(dict(ds.get("sampling_params") or {}), "/data_source/sampling_params")
    inline = None
    if source.get("type") == "file_id":
        dataset["file"] = file_of(session, project_id, source, "/data_source/source").id
    elif source.get("type") == "file_content":
        rows = source_rows(session, project_id, source, "/data_source/source")
        dataset["file"] = inline = items_file(settings, session, project_id, rows, "/data_source/source/content")
    else:
        raise Problem.at("/data_source/source/type", f"{source.get('type')!r}: 'file_id' or 'file_content'", status=400)
    spec = {
        "kind": "eval",
        "model": ref,
        "dataset": dataset,
        "recipe": "plain",  # the prompt is the template's messages as written
        "grader": grader.model_dump(mode="json", exclude_none=True),
        "sampling": sampling,
        "backend": "vllm" if settings.fine_tuning.inference_backend == "vllm" else "hf",
    }
    return spec, model, inline


def drop_file(session: Session, file_id: str) -> None:
    """A run's inline items, stored for a run that was then refused: they go with it."""
    from pathlib import Path

    from store.models import File as FileRow

    session.rollback()
    row = session.get(FileRow, file_id)
    if row is not None:
        path = Path(row.path)
        session.delete(row)
        session.commit()
        path.unlink(missing_ok=True)


def jsonl_spec(session: Session, project_id: str, ds: dict[str, Any], grader: Any) -> dict[str, Any]:
    """The grade job of a `jsonl` run: each row's sample scored by the criteria."""
    source = ds.get("source")
    if not isinstance(source, dict):
        raise Problem.at(
            "/data_source/source", "the rows: {type: file_id, id} or {type: file_content, content}", status=400
        )
    rows = source_rows(session, project_id, source, "/data_source/source")
    if len(rows) > MAX_GRADED:
        raise Problem.at(
            "/data_source/source", f"{len(rows)} rows: a jsonl run grades at most {MAX_GRADED}", status=400
        )
    items = []
    for n, row in enumerate(rows):
        sample = row.get("sample") if isinstance(row, dict) else None
        if not isinstance(sample, dict) or not isinstance(sample.get("output_text"), str):
            detail = "a jsonl run grades given samples: each row is {item, sample: {output_text}}"
            raise Problem.at(f"/data_source/source/content/{n}/sample", detail, status=400)
        item = item_of(row)
        answer = item.get("answer") if isinstance(item.get("answer"), str) else None
        items.append({"completion": sample["output_text"], "answer": answer, "fields": item})
    return {"kind": "grade", "grader": grader.model_dump(mode="json", exclude_none=True), "items": items}


def run_job(
    session: Session,
    settings: Settings,
    project_id: str,
    ds: dict[str, Any],
    grader: Any,
    tags: Sequence[str] = (),
    name: str | None = None,
) -> tuple[AnySpec, str, str | None]:
    """A run's job spec by its data source's type (with the run's `tags` and `name`), the model's
    name as the run reports it, and the file its inline items were stored as (None: none stored;
    a spec refused drops it)."""
    if ds.get("type") == "completions":
        fields, model, inline = completions_spec(session, settings, project_id, ds, grader)
    elif ds.get("type") == "jsonl":
        fields, model, inline = jsonl_spec(session, project_id, ds, grader), "", None
    elif ds.get("type") == "responses":
        fields, model, inline = completions_spec(session, settings, project_id, as_sampled(ds), grader)
    else:
        detail = f"{ds.get('type')!r}: 'completions', 'responses' or 'jsonl'"
        raise Problem.at("/data_source/type", detail, status=400)
    fields["tags"] = list(tags)
    if name:
        fields["name"] = name[:200]
    try:
        return job_spec(fields), model, inline
    except Problem:
        if inline is not None:
            drop_file(session, inline)
        raise


# where a field of a run's job spec is in the run's request
SPEC_POINTERS = {"/dataset/template": "/data_source/input_messages/template", "/model": "/data_source/model"}


def job_spec(spec: dict[str, Any]) -> AnySpec:
    """The run's job spec parsed; its first error a 400 at the run's field it came from."""
    try:
        return parse_spec(spec)
    except ValidationError as e:
        first = validation_errors(e.errors())[0]
        where = first["pointer"]
        at = next(
            (v + where.removeprefix(k) for k, v in SPEC_POINTERS.items() if where.startswith(k)), f"/data_source{where}"
        )
        raise Problem.at(at, first["detail"], status=400) from None
