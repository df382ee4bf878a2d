"""Open Server-Sent-Event streams per API key, within `limits.max_streams_per_key` (per API
process, as the rate limit is). A status page following a job holds one stream like any other
client, so it counts too. The count is taken when a stream opens and given back when it ends,
however it ends (the job finished, the client went away, the server stopped)."""

from __future__ import annotations

import threading
from collections import defaultdict

from api.problems import Problem

TOO_MANY_STREAMS = (
    "This API key already holds {limit} open event streams (the limit per key): close one (a status "
    "page tab following a job holds one) and retry."
)

_open: dict[str, int] = defaultdict(int)
_lock = threading.Lock()


def open_stream(key_id: str, limit: int) -> None:
    """Count one more open stream for the key, or refuse it with a 429."""
    with _lock:
        if _open[key_id] >= limit:
            detail = TOO_MANY_STREAMS.format(limit=limit)
            raise Problem(429, "Too many open streams", detail, headers={"Retry-After": "5"})
        _open[key_id] += 1


def close_stream(key_id: str) -> None:
    with _lock:
        _open[key_id] = max(0, _open[key_id] - 1)
        if not _open[key_id]:
            del _open[key_id]


def open_count(key_id: str) -> int:
    with _lock:
        return _open.get(key_id, 0)
