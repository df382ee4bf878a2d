"""An eval run's counts, grouped by the database (api/openai/eval_run_counts.py), on PostgreSQL and SQLite
alike: the two give a JSON score back differently (PostgreSQL's `#>>` as text, 'true' for a
boolean; SQLite's json_extract as a number), and both must count as the Python reading of a sample
did."""

from __future__ import annotations

import pytest

from api.openai.eval_run_counts import score_of, tallies
from store.db import session_scope
from store.keys import get_or_create_project
from store.models import Job, Sample

pytestmark = pytest.mark.quick

RULES = [
    {"name": "exact", "type": "string_check"},
    {"name": "close", "type": "text_similarity", "pass_threshold": 0.6},
    {"name": "judged", "type": "python", "pass_threshold": None},  # OpenAI's none: 0.5 here
]
# (exact, close, judged, error): 7 pass all, 5 fail close, 3 fail exact, 1 fails judged, 2 errored
ROWS = [
    *[(True, 0.9, 0.5, None)] * 4,
    *[(1.0, 0.6, 1, None)] * 3,
    *[(1, 0.59, 0.7, None)] * 5,
    *[(False, 1.0, 0.9, None)] * 3,
    (True, 1.0, 0.49, None),
    *[(True, 1.0, 1.0, "the grader timed out")] * 2,
]


def test_a_runs_counts_are_grouped_in_the_database_as_each_sample_reads(store_url: str) -> None:
    with session_scope(store_url) as s:
        project = get_or_create_project(s, "eval-counts")
        openai = {"openai": {"criteria": RULES}}
        run = Job(project_id=project.id, kind="eval", spec={}, resolved_config=openai, status="succeeded")
        graded = Job(project_id=project.id, kind="grade", spec={}, resolved_config=openai, status="succeeded")
        running = Job(project_id=project.id, kind="eval", spec={}, resolved_config=openai, status="running")
        s.add_all([run, graded, running])
        s.flush()
        for i, (a, b, c, error) in enumerate(ROWS):
            scores = {"c0": a, "c1": b, "c2": c}
            tokens = {"prompt_tokens": 10, "tokens": 3}
            s.add(
                Sample(
                    job_id=run.id,
                    step=0,
                    index=i,
                    prompt="p",
                    completion="c",
                    data={"grader_sub": scores, "grader_error": error, **tokens},
                )
            )
            s.add(
                Sample(
                    job_id=graded.id, step=0, index=i, prompt="p", completion="c", data={"sub": scores, "error": error}
                )
            )
            s.add(Sample(job_id=running.id, step=0, index=i, prompt="p", completion="c", data={"grader_sub": scores}))
        # a sample with no data (its scores absent: 0, so it fails), and one whose error is empty text
        s.add(Sample(job_id=graded.id, step=0, index=98, prompt="p", completion="c", data=None))
        s.add(
            Sample(
                job_id=graded.id,
                step=0,
                index=99,
                prompt="p",
                completion="c",
                data={"sub": {"c0": 1, "c1": 1, "c2": 1}, "error": ""},
            )
        )
        s.flush()
        got = tallies(s, [run, graded, running])
    assert got[run.id].counts() == {"total": 18, "passed": 7, "failed": 9, "errored": 2}
    assert [(p["passed"], p["failed"]) for p in got[run.id].per] == [(15, 3), (13, 5), (17, 1)]
    assert (got[run.id].invocations, got[run.id].prompt_tokens, got[run.id].completion_tokens) == (18, 180, 54)
    assert got[graded.id].counts() == {"total": 20, "passed": 8, "failed": 10, "errored": 2}
    assert got[graded.id].invocations == 0  # a grade job samples nothing
    assert got[running.id].counts() == {"total": 0, "passed": 0, "failed": 0, "errored": 0}  # as OpenAI's


def test_a_stored_score_reads_as_a_number_from_either_database() -> None:
    assert [score_of(v) for v in (True, "true", "false", 1, "0.25", None, "null", "x", [1])] == [
        1.0, 1.0, 0.0, 1.0, 0.25, 0.0, 0.0, 0.0, 0.0,
    ]  # fmt: skip
