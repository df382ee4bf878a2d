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
