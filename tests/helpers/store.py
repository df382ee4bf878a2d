"""A migrated SQLite store with one project and its jobs, for tests of the store's and the
worker's logic that need rows but no service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from store.db import session_scope
from store.migrate import upgrade
from store.models import Job, Project


def store_with_jobs(tmp_path: Path, *jobs: dict[str, Any], project: str = "p") -> tuple[str, str, list[str]]:
    """The store's URL, the project's id and its jobs' ids. Each job: Job's columns over a
    bare queued SFT job."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    with session_scope(url) as s:
        row = Project(name=project)
        s.add(row)
        s.flush()
        bare = {"project_id": row.id, "kind": "sft", "spec": {}, "tags": [], "status": "queued"}
        made = [Job(**{**bare, **j}) for j in jobs]
        s.add_all(made)
        s.flush()
        return url, row.id, [j.id for j in made]
