"""Where the tests run: the repository, the datasets, the services' addresses, the admin token.

The database and broker are PostgreSQL and Redis on 127.0.0.1 (scripts/test starts them; override
with MATHRL_TEST_PG, a server URL, and MATHRL_TEST_REDIS; each pytest-xdist worker has a database
of its own and Redis db 11, 10, ...), or with MATHRL_TEST_SERVICES=embedded the embedded default's
SQLite and kombu's SQLAlchemy transport (`scripts/test -m quick`)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from runtime.processes import die_with_parent_gently as die_with_parent
from runtime.processes import free_port

__all__ = [
    "ADMIN_TOKEN",
    "EMBEDDED",
    "NEEDS_SERVICES",
    "PG_SERVER",
    "REDIS",
    "ROOT",
    "data_dir",
    "die_with_parent",
    "free_port",
]

ROOT = Path(__file__).resolve().parents[2]
PG_SERVER = os.environ.get("MATHRL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
# scripts/test can run the suite on pytest-xdist workers gw0, gw1, ...: each its own Redis db (11, 10,
# ...), so one worker's broker flush or queues never reach another's (the drills use 13 and 14)
XDIST_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
REDIS = os.environ.get("MATHRL_TEST_REDIS", f"redis://127.0.0.1:6379/{11 - XDIST_WORKER}")
ADMIN_TOKEN = "test-admin-token-" + uuid.uuid4().hex
EMBEDDED = os.environ.get("MATHRL_TEST_SERVICES") == "embedded"
NEEDS_SERVICES = "needs {}: MATHRL_TEST_SERVICES=embedded runs on SQLite (scripts/test without -m quick starts it)"


def data_dir() -> str:
    d = ROOT.parent / "shared" / "datasets"
    if not d.is_dir():
        pytest.skip("../shared/datasets is not present")
    return str(d)


def shared_rows(name: str, n: int | None = None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (Path(data_dir()) / name).open()]
    return rows[:n] if n else rows
