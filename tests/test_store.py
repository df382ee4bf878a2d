"""The store's own rules, on PostgreSQL and SQLite alike."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from store.db import session_scope
from store.jobs import add_event
from store.keys import get_or_create_project
from store.migrate import upgrade
from store.models import Event, Job

pytestmark = pytest.mark.quick


@pytest.fixture(params=["postgresql", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return str(request.getfixturevalue("pg_url"))
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    return url


def test_json_columns_store_undefined_numbers_as_null(store_url: str) -> None:
    """A reward-model job with no held-out pairs reported pairwise_accuracy NaN in its 'scored'
    event: PostgreSQL refused the row (SQLite took it) and the job failed after training."""
    with session_scope(store_url) as s:
        project = get_or_create_project(s, "nan-check")
        job = Job(project_id=project.id, kind="eval", spec={"limit": math.inf})
        s.add(job)
        s.flush()
        add_event(s, job.id, "scored", data={"pairwise_accuracy": math.nan, "n": 0, "curve": [1.0, -math.inf]})
        job_id = job.id
    with session_scope(store_url) as s:
        event = s.query(Event).filter_by(job_id=job_id, type="scored").one()
        assert event.data == {"pairwise_accuracy": None, "n": 0, "curve": [1.0, None]}
        assert s.get(Job, job_id).spec == {"limit": None}  # type: ignore[union-attr]

