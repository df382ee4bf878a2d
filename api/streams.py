"""Open Server-Sent-Event streams per API key, within `limits.max_streams_per_key`, and per
project (all its keys together), within `limits.max_streams_per_project`; both per API process,
as the rate limit is. A status page following a job holds one stream like any other client, so
it counts too. The count is taken when a stream opens and given back when it ends, however it
ends (the job finished, the client went away, the server stopped)."""

from __future__ import annotations

import threading
from collections import defaultdict

from api.problems import Problem

TOO_MANY_STREAMS = (
    "This API key already holds {limit} open event streams (the limit per key): close one (a status "
    "page tab following a job holds one) and retry."
)

TOO_MANY_PROJECT_STREAMS = (
    "This project's keys already hold {limit} open event streams (the limit per project): close one "
    "(a status page tab following a job holds one) and retry."
)

_open: dict[str, int] = defaultdict(int)
_open_projects: dict[str, int] = defaultdict(int)
_lock = threading.Lock()


def open_stream(key_id: str, limit: int, project_id: str | None = None, project_limit: int | None = None) -> None:
    """Count one more open stream for the key (and its project), or refuse it with a 429."""
    with _lock:
        if _open[key_id] >= limit:
            detail = TOO_MANY_STREAMS.format(limit=limit)
            raise Problem(429, "Too many open streams", detail, headers={"Retry-After": "5"})
        if project_id is not None and project_limit is not None and _open_projects[project_id] >= project_limit:
            detail = TOO_MANY_PROJECT_STREAMS.format(limit=project_limit)
            raise Problem(429, "Too many open streams", detail, headers={"Retry-After": "5"})
        _open[key_id] += 1
        if project_id is not None:
            _open_projects[project_id] += 1


def _give_back(counts: dict[str, int], name: str) -> None:
    counts[name] = max(0, counts[name] - 1)
    if not counts[name]:
        del counts[name]


def close_stream(key_id: str, project_id: str | None = None) -> None:
    with _lock:
        _give_back(_open, key_id)
        if project_id is not None:
            _give_back(_open_projects, project_id)


def project_open_count(project_id: str) -> int:
    with _lock:
        return _open_projects.get(project_id, 0)
