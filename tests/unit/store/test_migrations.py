"""Alembic migrations and the SQLAlchemy models agree, on PostgreSQL and SQLite."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_usage_counters_start_from_the_jobs_already_active(
    dialect: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """0007 adds the projects' active_jobs/active_gpus counters (read by the quota check): a
    database with active jobs already in it starts with them counted, then the triggers keep them
    (and 0007 goes down again cleanly)."""
    from alembic import command
    from sqlalchemy import text

    from store.migrate import alembic_config

    url = request.getfixturevalue("pg_url") if dialect == "postgresql" else f"sqlite:///{tmp_path / 'm.db'}"
    if dialect == "postgresql":
        command.downgrade(alembic_config(url), "0006")
    else:
        upgrade(url, "0006")
    engine = create_engine(url)
    jobs = [("a", "queued", 2), ("b", "running", 1), ("c", "waiting", None), ("d", "succeeded", 8), ("e", "failed", 4)]
    with engine.begin() as c:
        c.execute(text("INSERT INTO projects (id, name, created_at) VALUES ('p7', 'p7', '2026-01-01')"))
        for job_id, status, gpus in jobs:
            spec = json.dumps({"resources": {"gpus": gpus}} if gpus is not None else {})
            c.execute(
                text(
                    "INSERT INTO jobs (id, project_id, kind, status, tags, spec, queue, attempts, max_attempts, "
                    "cancel_requested, depends_on, created_at, updated_at) VALUES "
                    f"('{job_id}7', 'p7', 'sft', '{status}', '[]', '{spec}', 'cpu', 0, 3, false, '[]', "
                    "'2026-01-01', '2026-01-01')"
                )
            )
    engine.dispose()
    upgrade(url)
    engine = create_engine(url)
    counters = "SELECT active_jobs, active_gpus FROM projects WHERE id = 'p7'"
    with engine.begin() as c:
        assert tuple(c.execute(text(counters)).one()) == (3, 3)
        c.execute(text("UPDATE jobs SET status = 'succeeded' WHERE id = 'a7'"))
        assert tuple(c.execute(text(counters)).one()) == (2, 1)
    engine.dispose()
    command.downgrade(alembic_config(url), "0006")
    upgrade(url)
    assert _diff(url) == []
