"""Alembic migrations and the SQLAlchemy models agree, on PostgreSQL and SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from store.migrate import upgrade
from store.models import Base

pytestmark = pytest.mark.quick


def _diff(url: str) -> list:
    engine = create_engine(url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    engine.dispose()
    return diff


def test_postgres_schema_matches_models(pg_url: str) -> None:
    assert _diff(pg_url) == []


def test_sqlite_from_empty_matches_models(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url)
    assert _diff(url) == []
    tables = set(inspect(create_engine(url)).get_table_names())
    assert {"projects", "api_keys", "jobs", "events", "metrics", "samples", "checkpoints", "benchmark_scores"} <= tables


def test_scores_natural_key_keeps_the_newest_of_rerun_duplicates(tmp_path: Path) -> None:
    """0003 adds uq_scores_natural_key; rows that re-run attempts wrote twice collapse to the newest."""
    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url, "0002")
    engine = create_engine(url)
    with engine.begin() as c:
        c.execute(text("INSERT INTO projects (id, name, created_at) VALUES ('p', 'p', '2026-01-01')"))
        c.execute(
            text(
                "INSERT INTO jobs (id, project_id, kind, status, tags, spec, queue, attempts, max_attempts, "
                "cancel_requested, depends_on, created_at, updated_at) VALUES "
                "('j', 'p', 'eval', 'succeeded', '[]', '{}', 'cpu', 2, 3, 0, '[]', '2026-01-01', '2026-01-01')"
            )
        )
        for row_id, value in (("01a", 0.3), ("01b", 0.4)):
            c.execute(
                text(
                    "INSERT INTO benchmark_scores (id, project_id, job_id, model_ref, benchmark, "
                    "benchmark_version, metric, value, n, sampling, backend, backend_version, created_at) "
                    f"VALUES ('{row_id}', 'p', 'j', 'm', 'gsm8k', '1', 'accuracy', {value}, 10, '{{}}', "
                    "'hf', 't', '2026-01-01')"
                )
            )
    engine.dispose()
    upgrade(url)
    engine = create_engine(url)
    with engine.connect() as c:
        assert c.execute(text("SELECT id, value FROM benchmark_scores")).all() == [("01b", 0.4)]
    engine.dispose()
