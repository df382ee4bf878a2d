"""The result counts of OpenAI eval runs (api/routers/openai_evals.py `run_object`), computed in the
database: a run's samples are grouped by their criterion scores and whether grading failed, so a run
of any size reads one row per distinct outcome, and a page of runs one query per job kind. A
criterion's `passed` is its score against its `pass_threshold` (string_check and label_model: 1)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from api.openai.records import EvalRunRecord
from store.models import Job, Sample

DEFAULT_PASS = 0.5  # python and score_model criteria with no pass_threshold: OpenAI sets none
# where each kind's samples keep their criterion scores (c0, c1...) and their grading error
GRADED_KEYS = {"grade": ("sub", "error"), "eval": ("grader_sub", "grader_error")}


def passed(rule: dict[str, Any], score: float) -> bool:
    if rule["type"] in ("string_check", "label_model"):
        return score >= 1.0
    threshold = rule["pass_threshold"]
    return score >= (DEFAULT_PASS if threshold is None else threshold)


def run_criteria(job: Job) -> list[dict[str, Any]]:
    """The run's testing criteria, as the run stored them."""
    return EvalRunRecord.of(job).criteria


@dataclass
class Tally:
    """A run's counts: OpenAI's result_counts, per_testing_criteria_results and usage."""

    total: int = 0
    passed: int = 0
    failed: int = 0
    errored: int = 0
    per: list[dict[str, Any]] = field(default_factory=list)
    invocations: int = 0  # sampled completions (an eval job's; a grade job samples none)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def counts(self) -> dict[str, int]:
        return {"total": self.total, "passed": self.passed, "failed": self.failed, "errored": self.errored}


def score_of(value: Any) -> float:
    """A stored score as the database gives it back: a number, or JSON text (PostgreSQL's `#>>`
    gives 'true' for a boolean where SQLite gives 1); absent or unreadable: 0."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return 0.0
    if isinstance(value, bool | int | float):
        return float(value)
    return 0.0


def tallies(session: Session, jobs: list[Job]) -> dict[str, Tally]:
    """Each job's tally by id; a run that has not succeeded counts nothing, as OpenAI's do."""
    out = {job.id: Tally(per=[{"testing_criteria": r["name"], "passed": 0, "failed": 0} for r in run_criteria(job)])
           for job in jobs}  # fmt: skip
    for kind, (scores_key, error_key) in GRADED_KEYS.items():
        done = [job for job in jobs if job.status == "succeeded" and job.kind == kind]
        if not done:
            continue
        rules = {job.id: run_criteria(job) for job in done}
        width = max(len(r) for r in rules.values())
        error = Sample.data[error_key].as_string()
        errored = case((func.coalesce(error, "") == "", 0), else_=1)
        scores = [Sample.data[(scores_key, f"c{i}")].as_string() for i in range(width)]
        tokens = [func.sum(func.coalesce(Sample.data[k].as_float(), 0.0)) for k in ("prompt_tokens", "tokens")]
        q = (
            select(Sample.job_id, errored, func.count(), *tokens, *scores)
            .where(Sample.job_id.in_(list(rules)))
            .group_by(Sample.job_id, errored, *scores)
        )
        for job_id, bad, n, prompt_tokens, completion_tokens, *raw in session.execute(q):
            tally, job_rules = out[job_id], rules[job_id]
            results = [passed(rule, score_of(v)) for rule, v in zip(job_rules, raw, strict=False)]
            tally.total += n
            if bad:
                tally.errored += n
            elif all(results):
                tally.passed += n
            else:
                tally.failed += n
            for ok, per in zip(results, tally.per, strict=True):
                per["passed" if ok else "failed"] += n
            if kind == "eval":
                tally.invocations += n
                tally.prompt_tokens += round(prompt_tokens or 0)
                tally.completion_tokens += round(completion_tokens or 0)
    return out
