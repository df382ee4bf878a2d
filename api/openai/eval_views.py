"""What OpenAI's eval objects look like (api/routers/openai_evals.py), read off the Eval rows and the
runs' jobs: an eval, a run (`run_object`, its counts from api/openai/eval_run_counts.py) and an output
item (`output_item`: one of the job's samples, each criterion's result against its pass rule)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from api.openai.eval_run_counts import Tally, passed, run_criteria, tallies
from api.openai.records import EvalRunRecord
from api.problems import Problem
from mathrl.modelref import uuid_after
from store.jobs import has_tag
from store.models import Eval, Job, Sample

STATUS = {
    "waiting": "queued",
    "queued": "queued",
    "paused": "queued",
    "running": "in_progress",
    "succeeded": "completed",
    "failed": "failed",
    "cancelled": "canceled",
}

NOT_FOUND = "no eval with this id in your project"
RUN_NOT_FOUND = "no run with this id in this eval"


def own_eval(session: Session, project_id: str, eval_id: str) -> Eval:
    row = session.get(Eval, eval_id) if eval_id.startswith("eval_") else None
    if row is None or row.project_id != project_id:
        raise Problem(404, "Not found", NOT_FOUND)
    return row


def runs_of(session: Session, project_id: str, eval_id: str) -> Any:
    return select(Job).where(Job.project_id == project_id, has_tag(session, eval_tag(eval_id)))


def own_run(session: Session, project_id: str, eval_id: str, run_id: str) -> Job:
    own_eval(session, project_id, eval_id)
    job_id = job_id_of(run_id)
    job = session.get(Job, job_id) if job_id else None
    if job is None or job.project_id != project_id or eval_tag(eval_id) not in (job.tags or []):
        raise Problem(404, "Not found", RUN_NOT_FOUND)
    return job


def item_schema(config: dict[str, Any]) -> dict[str, Any]:
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
        "data_source_config": item_schema(row.data_source_config),
        "testing_criteria": row.testing_criteria,
        "metadata": row.meta or {},
    }


def eval_tag(eval_id: str) -> str:
    return f"openai:eval={eval_id}"


def run_id_of(job_id: str) -> str:
    return "evalrun_" + job_id.replace("-", "")


def job_id_of(run_id: str) -> str | None:
    return uuid_after("evalrun_", run_id)


def item_id_of(sample: Sample) -> str:
    return "outputitem_" + sample.id.replace("-", "")


SCAN_BATCH = 200  # samples read at a time when paging output items


def samples_after(session: Session, job: Job, descending: bool, after: Sample | None) -> Iterator[Sample]:
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


def graded(job: Job, sample: Sample) -> tuple[dict[str, float], str | None, str]:
    """A sample's criterion scores by name (c0, c1...), its grader error, and the reason."""
    data = sample.data or {}
    if job.kind == "grade":
        return dict(data.get("sub") or {}), data.get("error"), str(data.get("reason") or "")
    return dict(data.get("grader_sub") or {}), data.get("grader_error"), str(data.get("grader_reason") or "")


def results_of(job: Job, sample: Sample) -> tuple[list[dict[str, Any]], str | None, str]:
    rules = run_criteria(job)
    scores, error, reason = graded(job, sample)
    results = []
    for i, rule in enumerate(rules):
        score = float(scores.get(f"c{i}", 0.0))
        results.append({"name": rule["name"], "type": rule["type"], "score": score, "passed": passed(rule, score)})
    return results, error, reason


def run_object(session: Session, job: Job, tally: Tally | None = None) -> dict[str, Any]:
    """The run as OpenAI's `eval.run`; `tally`: its counts, already read with a page of runs
    (api/openai/eval_run_counts.py, in the database), else read here."""
    info = EvalRunRecord.of(job)
    request = info.request
    tally = tally if tally is not None else tallies(session, [job])[job.id]
    model = info.model
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
        "eval_id": info.eval_id,
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


def output_item(job: Job, sample: Sample, eval_id: str) -> dict[str, Any]:
    info = EvalRunRecord.of(job)
    data = sample.data or {}
    results, error, reason = results_of(job, sample)
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
            "model": info.model,
            "usage": usage,
            "error": {"code": error, "message": reason} if error else None,
            "temperature": sampling.get("temperature", 0.0),
            "top_p": sampling.get("top_p", 1.0),
            "max_completion_tokens": sampling.get("max_new_tokens") or 0,
            "seed": sampling.get("seed", 0),
        },
    }
