"""OpenAI's Evals API, for code written against the `openai` SDK (`client.evals.*`,
`client.evals.runs.*`, `client.evals.runs.output_items.*`). An eval is a row (store.models.Eval):
its items' schema and its testing criteria, graders in OpenAI's JSON (mathrl/graders.py). A run is
a job of the project, and the run's routes are a view over it:
- `completions` data source: an **eval job** (kind: eval) over the run's items (an uploaded file of
  purpose 'evals', or the request's own items, stored as such a file), each prompt the run's
  `input_messages` template filled from its item (dataset format 'items'), sampled from the
  run's model, and scored by the testing criteria as one `multi` grader;
- `jsonl` data source (items with their samples): a **grade job** (kind: grade) scoring the given
  samples by the same grader.
Each output item is one of the job's samples; a criterion's `passed` is its score against its
`pass_threshold` (string_check and label_model: a score of 1)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Response
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from api.deps import CallerDep, SessionDep, SettingsDep
from api.eval_run_counts import Tally, passed, run_criteria, tallies
from api.idempotency import commit_or_replay, earlier, replayed, request_hash
from api.openai.resource import listed
from api.problems import Problem, validation_errors
from api.routers.openai_files import own_file
from api.routers.openai_fine_tuning import grading_models_mapped, trainable_model
from api.routers.openai_models import own_ft_model
from api.submit import admit, check_job_refs, job_row, submit_keyed
from config.settings import Settings
from mathrl.graders import Grader
from mathrl.jsonl_files import check_item_line, item_of
from mathrl.modelref import uuid_after
from mathrl.shallow import JsonObject
from mathrl.specs import model_refs, parse_spec
from mathrl.specs.generate import DEFAULT_MAX_TOKENS, effort_budget
from mathrl.status import TERMINAL
from store.files import Quota, store_file
from store.ids import uuid7
from store.jobs import has_tag, request_cancel
from store.models import Eval, Job, Sample

router = APIRouter(prefix="/v1/evals", tags=["openai: evals"])

TAG = "openai:eval_run"  # every run's job
NOT_FOUND = "no eval with this id in your project"
RUN_NOT_FOUND = "no run with this id in this eval"
CRITERIA = ("string_check", "text_similarity", "python", "score_model", "label_model")
MAX_CRITERIA = 16  # a multi grader's graders (mathrl/graders.py)
MAX_GRADED = 1000  # items of a jsonl run: a grade job's (mathrl/specs/grade.py)
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
STATUS = {
    "waiting": "queued",
    "queued": "queued",
    "paused": "queued",
    "running": "in_progress",
    "succeeded": "completed",
    "failed": "failed",
    "cancelled": "canceled",
}


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


# ---- evals ----------------------------------------------------------------------------------


def _schema(config: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's `data_source_config` as an eval returns it: the JSON schema of a run's rows."""
    properties: dict[str, Any] = {"item": config["item_schema"]}
    required = ["item"]
    if config.get("include_sample_schema"):
        properties["sample"] = {
            "type": "object",
            "properties": {"output_text": {"type": "string"}, "output_json": {"type": "object"}},
            "required": ["output_text"],
        }
        required.append("sample")
    return {"type": "custom", "schema": {"type": "object", "properties": properties, "required": required}}


def eval_object(row: Eval) -> dict[str, Any]:
    return {
        "object": "eval",
        "id": row.id,
        "name": row.name,
        "created_at": int(row.created_at.timestamp()),
        "data_source_config": _schema(row.data_source_config),
        "testing_criteria": row.testing_criteria,
        "metadata": row.meta or {},
    }


def _check_source_config(config: dict[str, Any]) -> dict[str, Any]:
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


def own_eval(session: Session, project_id: str, eval_id: str) -> Eval:
    row = session.get(Eval, eval_id) if eval_id.startswith("eval_") else None
    if row is None or row.project_id != project_id:
        raise Problem(404, "Not found", NOT_FOUND)
    return row


@router.post(
    "",
    responses={
        400: {"description": "A field is invalid; the error names it."},
        409: {"description": "This Idempotency-Key was used with a different request."},
    },
)
def create_eval(
    body: EvalCreateParams,
    caller: CallerDep,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    x_stainless_retry_count: Annotated[str | None, Header(max_length=8, include_in_schema=False)] = None,
) -> Any:
    """An eval: its items' schema and the testing criteria its runs are scored by. A retry with the
    same Idempotency-Key (or the SDK's own retry, which sends none) returns the same eval."""
    digest = request_hash(body.model_dump(mode="json"))
    if existing := earlier(session, Eval, caller.project_id, idempotency_key, digest, x_stainless_retry_count):
        replayed(response)
        return eval_object(existing)
    config = _check_source_config(dict(body.data_source_config))
    criteria([dict(c) for c in body.testing_criteria], settings.fine_tuning.model_aliases)  # checked now, not per run
    row = Eval(
        id="eval_" + uuid7().replace("-", ""),
        project_id=caller.project_id,
        name=body.name or "",
        data_source_config=config,
        testing_criteria=[dict(c) for c in body.testing_criteria],
        meta=body.metadata,
        idempotency_key=idempotency_key,
        request_hash=digest,
    )
    session.add(row)
    return eval_object(commit_or_replay(session, row, response)[0])


@router.get("", responses={400: {"description": "`after` is not an eval id."}})
def list_evals(
    caller: CallerDep,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], Query()] = "asc",
    order_by: Annotated[Literal["created_at", "updated_at"], Query()] = "created_at",
) -> dict[str, Any]:
    """The project's evals, oldest first by default (OpenAI's order); `after` an eval id of the
    previous page. An eval is not changed but by name and metadata: updated_at orders as created_at."""
    q = select(Eval).where(Eval.project_id == caller.project_id)
    if after is not None:
        if not after.startswith("eval_"):
            raise Problem(400, "Bad cursor", "query:/after: an eval id from a previous page")
        q = q.where(Eval.id > after if order == "asc" else Eval.id < after)
    q = q.order_by(Eval.id.asc() if order == "asc" else Eval.id.desc())
    rows = list(session.scalars(q.limit(limit + 1)))
    return listed([eval_object(r) for r in rows[:limit]], len(rows) > limit)


@router.get("/{eval_id}", responses={404: {"description": NOT_FOUND}})
def retrieve_eval(eval_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    return eval_object(own_eval(session, caller.project_id, eval_id))


@router.post("/{eval_id}", responses={404: {"description": NOT_FOUND}})
def update_eval(eval_id: str, body: EvalUpdateParams, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    """A new name or metadata (OpenAI's update); the criteria and schema stay as created."""
    row = own_eval(session, caller.project_id, eval_id)
    if body.name is not None:
        row.name = body.name
    if body.metadata is not None:
        row.meta = body.metadata
    session.commit()
    return eval_object(row)


def _runs(session: Session, project_id: str, eval_id: str) -> Any:
    return select(Job).where(Job.project_id == project_id, has_tag(session, _eval_tag(eval_id)))


@router.delete("/{eval_id}", responses={404: {"description": NOT_FOUND}, 409: {"description": "A run is under way."}})
def delete_eval(eval_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    """The eval goes; its runs stay as the project's jobs (tagged with its id). A 409 while a run
    has not ended: cancel it first."""
    row = own_eval(session, caller.project_id, eval_id)
    going = session.scalars(_runs(session, caller.project_id, eval_id).where(Job.status.not_in(TERMINAL))).first()
    if going is not None:
        detail = f"run {run_id_of(going.id)} of this eval has not ended: cancel it first"
        raise Problem(409, "Conflict", detail)
    session.delete(row)
    session.commit()
    return {"object": "eval.deleted", "deleted": True, "eval_id": eval_id}


# ---- runs -----------------------------------------------------------------------------------


def _eval_tag(eval_id: str) -> str:
    return f"openai:eval={eval_id}"


def run_id_of(job_id: str) -> str:
    return "evalrun_" + job_id.replace("-", "")


def _job_id(run_id: str) -> str | None:
    return uuid_after("evalrun_", run_id)


def own_run(session: Session, project_id: str, eval_id: str, run_id: str) -> Job:
    own_eval(session, project_id, eval_id)
    job_id = _job_id(run_id)
    job = session.get(Job, job_id) if job_id else None
    if job is None or job.project_id != project_id or _eval_tag(eval_id) not in (job.tags or []):
        raise Problem(404, "Not found", RUN_NOT_FOUND)
    return job


def _openai(job: Job) -> dict[str, Any]:
    return dict((job.resolved_config or {}).get("openai") or {})


SCAN_BATCH = 200  # samples read at a time when paging output items


def _samples_after(session: Session, job: Job, descending: bool, after: Sample | None) -> Iterator[Sample]:
    """The job's samples in (index, id) order, or the reverse, after `after`: read from the database a
    batch at a time (keyset paging), so a page of a large run loads no more than it shows and skips."""
    q = select(Sample).where(Sample.job_id == job.id)
    order = (Sample.index.desc(), Sample.id.desc()) if descending else (Sample.index.asc(), Sample.id.asc())
    cursor = (after.index, after.id) if after is not None else None
    while True:
        page = q
        if cursor is not None:
            index, sample_id = cursor
            if descending:
                page = page.where(or_(Sample.index < index, and_(Sample.index == index, Sample.id < sample_id)))
            else:
                page = page.where(or_(Sample.index > index, and_(Sample.index == index, Sample.id > sample_id)))
        rows = list(session.scalars(page.order_by(*order).limit(SCAN_BATCH)))
        yield from rows
        if len(rows) < SCAN_BATCH:
            return
        cursor = (rows[-1].index, rows[-1].id)


def _graded(job: Job, sample: Sample) -> tuple[dict[str, float], str | None, str]:
    """A sample's criterion scores by name (c0, c1...), its grader error, and the reason."""
    data = sample.data or {}
    if job.kind == "grade":
        return dict(data.get("sub") or {}), data.get("error"), str(data.get("reason") or "")
    return dict(data.get("grader_sub") or {}), data.get("grader_error"), str(data.get("grader_reason") or "")


def _results(job: Job, sample: Sample) -> tuple[list[dict[str, Any]], str | None, str]:
    rules = run_criteria(job)
    scores, error, reason = _graded(job, sample)
    results = []
    for i, rule in enumerate(rules):
        score = float(scores.get(f"c{i}", 0.0))
        results.append({"name": rule["name"], "type": rule["type"], "score": score, "passed": passed(rule, score)})
    return results, error, reason


def run_object(session: Session, job: Job, tally: Tally | None = None) -> dict[str, Any]:
    """The run as OpenAI's `eval.run`; `tally`: its counts, already read with a page of runs
    (api/eval_run_counts.py, in the database), else read here."""
    info = _openai(job)
    request = info.get("request") or {}
    tally = tally if tally is not None else tallies(session, [job])[job.id]
    model = info.get("model") or ""
    per_model = []
    if tally.invocations:
        usage = {
            "invocation_count": tally.invocations,
            "prompt_tokens": tally.prompt_tokens,
            "completion_tokens": tally.completion_tokens,
            "cached_tokens": 0,
        }
        per_model = [{"model_name": model, **usage, "total_tokens": tally.prompt_tokens + tally.completion_tokens}]
    error: dict[str, str] | None = None
    if job.status == "failed":
        error = {"code": "job_failed", "message": job.error or "the run's job failed"}
    return {
        "object": "eval.run",
        "id": run_id_of(job.id),
        "eval_id": info.get("eval_id"),
        "name": request.get("name") or job.name or "",
        "model": model,
        "status": STATUS.get(job.status, "queued"),
        "created_at": int(job.created_at.timestamp()),
        "data_source": request.get("data_source"),
        "metadata": request.get("metadata") or {},
        "result_counts": tally.counts(),
        "per_testing_criteria_results": tally.per,
        "per_model_usage": per_model,
        "report_url": f"/ui/jobs/{job.id}",
        "error": error,
        "shared_with_openai": False,
    }


def _items_file(settings: Settings, session: Session, project_id: str, content: list[Any], at: str) -> str:
    """A run's inline items (file_content), stored as a file of the project (purpose 'evals'), as
    an upload is, within its file quota: the eval job reads them from there."""
    from store.files import OverQuota

    lines = []
    for n, row in enumerate(content):
        if bad := check_item_line(row):
            raise Problem.at(f"{at}/{n}/{bad[0][0]}".rstrip("/"), bad[0][1], status=400)
        lines.append(json.dumps({"item": item_of(row)}))
    data = ("\n".join(lines) + "\n").encode()
    file_id = "file-" + uuid7().replace("-", "")
    try:
        store_file(
            session,
            settings.artifact_dir,
            Quota.of(settings.files),
            file_id=file_id,
            project_id=project_id,
            suffix=".jsonl",
            content=data,
            filename="eval-run-items.jsonl",
            purpose="evals",
            data={"lines": len(lines), "fields": sorted(item_of(content[0]))},
        )
    except OverQuota as e:
        raise Problem(429, "Too many files", f"the run's items are stored as a file of your project: {e}") from None
    return file_id


def _source_rows(session: Session, project_id: str, source: dict[str, Any], at: str) -> list[Any]:
    """A jsonl run's rows ({item, sample}), from the request or the project's file."""
    if source.get("type") == "file_content":
        rows = source.get("content")
        if not isinstance(rows, list) or not rows:
            raise Problem.at(f"{at}/content", "a non-empty list of {item, sample}", status=400)
        return rows
    if source.get("type") == "file_id":
        row = _file(session, project_id, source, at)
        lines = int((row.data or {}).get("lines", 0))
        if lines > MAX_GRADED:  # counted at upload: not read into the API to be refused
            raise Problem.at(f"{at}/id", f"{lines} rows: a jsonl run grades at most {MAX_GRADED}", status=400)
        with open(row.path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    raise Problem.at(f"{at}/type", f"{source.get('type')!r}: a source is 'file_id' or 'file_content'", status=400)


def _file(session: Session, project_id: str, source: dict[str, Any], at: str) -> Any:
    file_id = source.get("id")
    try:
        return own_file(session, project_id, str(file_id))
    except Problem:
        raise Problem.at(f"{at}/id", f"{file_id!r}: no file with this id in your project", status=400) from None


def _template(template: Any) -> Any:
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


def _sampling(params: dict[str, Any], at: str) -> dict[str, Any]:
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


def _as_sampled(ds: dict[str, Any]) -> dict[str, Any]:
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


def _completions_spec(
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
        dataset["template"] = _template(messages.get("template"))
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
    sampling = _sampling(dict(ds.get("sampling_params") or {}), "/data_source/sampling_params")
    inline = None
    if source.get("type") == "file_id":
        dataset["file"] = _file(session, project_id, source, "/data_source/source").id
    elif source.get("type") == "file_content":
        rows = _source_rows(session, project_id, source, "/data_source/source")
        dataset["file"] = inline = _items_file(settings, session, project_id, rows, "/data_source/source/content")
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


def _drop_file(session: Session, file_id: str) -> None:
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


def _jsonl_spec(session: Session, project_id: str, ds: dict[str, Any], grader: Any) -> dict[str, Any]:
    """The grade job of a `jsonl` run: each row's sample scored by the criteria."""
    source = ds.get("source")
    if not isinstance(source, dict):
        raise Problem.at(
            "/data_source/source", "the rows: {type: file_id, id} or {type: file_content, content}", status=400
        )
    rows = _source_rows(session, project_id, source, "/data_source/source")
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


@router.post(
    "/{eval_id}/runs",
    responses={400: {"description": "A field is invalid; the error names it."}, 404: {"description": NOT_FOUND}},
)
def create_run(
    eval_id: str,
    body: RunCreateParams,
    caller: CallerDep,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    x_stainless_retry_count: Annotated[str | None, Header(max_length=8, include_in_schema=False)] = None,
) -> dict[str, Any]:
    """A run: a job of the project that samples the run's model on the items (or takes the given
    samples) and scores each by the eval's testing criteria."""
    row = own_eval(session, caller.project_id, eval_id)
    if body.data_source is None:
        raise Problem.at(
            "/data_source",
            "this field is required: {type: completions, ...}, {type: responses, ...} or {type: jsonl, ...}",
            status=400,
        )
    request = body.model_dump(mode="json", exclude_none=True)
    digest = request_hash({"eval": eval_id, **request})
    if (
        existing := earlier(session, Job, caller.project_id, idempotency_key, digest, x_stainless_retry_count)
    ) is not None:
        replayed(response)
        return run_object(session, existing)
    key = (idempotency_key, digest, response)
    grader, rules = criteria(row.testing_criteria, settings.fine_tuning.model_aliases)
    ds = dict(body.data_source)
    inline = None
    if ds.get("type") == "completions":
        spec_dict, model, inline = _completions_spec(session, settings, caller.project_id, ds, grader)
    elif ds.get("type") == "jsonl":
        spec_dict, model = _jsonl_spec(session, caller.project_id, ds, grader), ""
    elif ds.get("type") == "responses":
        spec_dict, model, inline = _completions_spec(session, settings, caller.project_id, _as_sampled(ds), grader)
    else:
        raise Problem.at("/data_source/type", f"{ds.get('type')!r}: 'completions', 'responses' or 'jsonl'", status=400)
    try:
        return _submit_run(session, settings, caller.project_id, eval_id, body, spec_dict, model, rules, request, key)
    except BaseException:
        if inline is not None:
            _drop_file(session, inline)
        raise


def _submit_run(
    session: Session,
    settings: Settings,
    project_id: str,
    eval_id: str,
    body: RunCreateParams,
    spec_dict: dict[str, Any],
    model: str,
    rules: list[dict[str, Any]],
    request: dict[str, Any],
    key: tuple[str | None, str, Response],
) -> dict[str, Any]:
    idempotency_key, digest, response = key
    spec_dict["tags"] = [TAG, _eval_tag(eval_id)]
    if body.name:
        spec_dict["name"] = body.name[:200]
    try:
        spec = parse_spec(spec_dict)
    except ValidationError as e:
        err = validation_errors(e.errors())[0]
        where = err["pointer"]  # in the job's spec: where the run's request has it
        pointer = {"/dataset/template": "/data_source/input_messages/template", "/model": "/data_source/model"}
        at = next(
            (v + where.removeprefix(k) for k, v in pointer.items() if where.startswith(k)), f"/data_source{where}"
        )
        raise Problem.at(at, err["detail"], status=400) from None
    check_job_refs(session, project_id, model_refs(spec))
    config = admit({"": spec}, settings)[""]
    config.openai = {"eval_id": eval_id, "request": request, "criteria": rules, "model": model}
    job = job_row(project_id, spec, config, settings, idempotency_key=idempotency_key, request_hash=digest)
    message = f"queued on '{job.queue}' by POST /v1/evals/{eval_id}/runs"
    return run_object(session, submit_keyed(session, settings, project_id, job, message, response))


@router.get("/{eval_id}/runs", responses={404: {"description": NOT_FOUND}, 400: {"description": "Bad cursor."}})
def list_runs(
    eval_id: str,
    caller: CallerDep,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], Query()] = "asc",
    status: Annotated[Literal["queued", "in_progress", "completed", "canceled", "failed"] | None, Query()] = None,
) -> dict[str, Any]:
    own_eval(session, caller.project_id, eval_id)
    q = _runs(session, caller.project_id, eval_id)
    if status is not None:
        q = q.where(Job.status.in_([k for k, v in STATUS.items() if v == status]))
    if after is not None:
        before = _job_id(after)
        if before is None:
            raise Problem(400, "Bad cursor", "query:/after: a run id from a previous page")
        q = q.where(Job.id > before if order == "asc" else Job.id < before)
    rows = list(session.scalars(q.order_by(Job.id.asc() if order == "asc" else Job.id.desc()).limit(limit + 1)))
    page = rows[:limit]
    counts = tallies(session, page)  # one query per job kind for the page, not a read of every sample
    return listed([run_object(session, j, counts[j.id]) for j in page], len(rows) > limit)


@router.get("/{eval_id}/runs/{run_id}", responses={404: {"description": RUN_NOT_FOUND}})
def retrieve_run(eval_id: str, run_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    return run_object(session, own_run(session, caller.project_id, eval_id, run_id))


@router.post("/{eval_id}/runs/{run_id}/cancel", responses={404: {"description": RUN_NOT_FOUND}})
@router.post("/{eval_id}/runs/{run_id}", responses={404: {"description": RUN_NOT_FOUND}})  # OpenAI's reference's
def cancel_run(eval_id: str, run_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    """Cancel the run (OpenAI's cancel): its job is cancelled, at once if it has not started."""
    job = own_run(session, caller.project_id, eval_id, run_id)
    if job.status not in TERMINAL:
        request_cancel(session, job)
        session.commit()
        session.refresh(job)
    return run_object(session, job)


@router.delete(
    "/{eval_id}/runs/{run_id}",
    responses={404: {"description": RUN_NOT_FOUND}, 409: {"description": "The run is under way."}},
)
def delete_run(eval_id: str, run_id: str, caller: CallerDep, session: SessionDep) -> dict[str, Any]:
    """The run leaves the eval (a 409 while it runs); its job stays among the project's jobs, as
    every job does, tagged `openai:eval-deleted=<eval id>`."""
    job = own_run(session, caller.project_id, eval_id, run_id)
    if job.status not in TERMINAL:
        raise Problem(409, "Conflict", "the run has not ended: cancel it first")
    job.tags = [t if t != _eval_tag(eval_id) else f"openai:eval-deleted={eval_id}" for t in job.tags or []]
    session.commit()
    return {"object": "eval.run.deleted", "deleted": True, "run_id": run_id}


# ---- output items ---------------------------------------------------------------------------


def item_id_of(sample: Sample) -> str:
    return "outputitem_" + sample.id.replace("-", "")


def output_item(job: Job, sample: Sample, eval_id: str) -> dict[str, Any]:
    info = _openai(job)
    data = sample.data or {}
    results, error, reason = _results(job, sample)
    sampling = (job.resolved_config or {}).get("sampling") or {}
    if job.kind == "grade":  # the item is the grade job's, as the run gave it
        given = (job.spec or {}).get("items") or []
        item = dict((given[sample.index].get("fields") or {}) if sample.index < len(given) else {})
        inputs: list[dict[str, Any]] = []
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "cached_tokens": 0}
        index = sample.index
    else:
        item = dict(data.get("item") or {})
        inputs = [{"role": m["role"], "content": m["content"]} for m in data.get("messages") or []]
        prompt, completion = int(data.get("prompt_tokens") or 0), int(data.get("tokens") or 0)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "cached_tokens": 0,
        }
        index = int(data.get("problem", sample.index))
    return {
        "object": "eval.run.output_item",
        "id": item_id_of(sample),
        "run_id": run_id_of(job.id),
        "eval_id": eval_id,
        "created_at": int(job.created_at.timestamp()),
        "status": "error" if error else ("pass" if all(r["passed"] for r in results) else "fail"),
        "datasource_item_id": index,
        "datasource_item": item,
        "results": results,
        "sample": {
            "input": inputs,
            "output": [{"role": "assistant", "content": sample.completion}],
            "finish_reason": "length" if data.get("truncated") else "stop",
            "model": info.get("model") or "",
            "usage": usage,
            "error": {"code": error, "message": reason} if error else None,
            "temperature": sampling.get("temperature", 0.0),
            "top_p": sampling.get("top_p", 1.0),
            "max_completion_tokens": sampling.get("max_new_tokens") or 0,
            "seed": sampling.get("seed", 0),
        },
    }


@router.get("/{eval_id}/runs/{run_id}/output_items", responses={404: {"description": RUN_NOT_FOUND}})
def list_output_items(
    eval_id: str,
    run_id: str,
    caller: CallerDep,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], Query()] = "asc",
    status: Annotated[Literal["pass", "fail"] | None, Query()] = None,
) -> dict[str, Any]:
    """The run's output items, one per item (its sample and each criterion's result), once it has
    ended; `status` keeps the passed or the failed ones."""
    job = own_run(session, caller.project_id, eval_id, run_id)
    start = None
    if after is not None:
        sample_id = uuid_after("outputitem_", after)
        start = session.get(Sample, sample_id) if sample_id else None
        if start is None or start.job_id != job.id:
            raise Problem(400, "Bad cursor", "query:/after: an output item id from a previous page")
    items: list[dict[str, Any]] = []
    for sample in _samples_after(session, job, order == "desc", start):
        item = output_item(job, sample, eval_id)
        if status is None or item["status"] == status:
            items.append(item)
            if len(items) > limit:
                break
    return listed(items[:limit], len(items) > limit)


@router.get("/{eval_id}/runs/{run_id}/output_items/{output_item_id}", responses={404: {"description": "No such item."}})
def retrieve_output_item(
    eval_id: str, run_id: str, output_item_id: str, caller: CallerDep, session: SessionDep
) -> dict[str, Any]:
    job = own_run(session, caller.project_id, eval_id, run_id)
    sample_id = uuid_after("outputitem_", output_item_id)
    sample = session.get(Sample, sample_id) if sample_id else None
    if sample is None or sample.job_id != job.id:
        raise Problem(404, "Not found", "no output item with this id in this run")
    return output_item(job, sample, eval_id)
