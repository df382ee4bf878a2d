"""Wake-ups for event streams: one LISTEN connection per API process on PostgreSQL.

The database NOTIFYs channel `mathrl_job` with a job's id whenever the job gets an event or a
metric point or changes status (migration 0008). One thread per API process LISTENs and sets
the asyncio.Event of every open stream that follows that job, so a stream reads the database
when there is something to read instead of every half second: 200 idle streams cost no
queries. `Waiter.wait(timeout)` returns when woken or after `timeout`; a stream also re-reads
at `FALLBACK_SECONDS` so a notification lost while the listener reconnected costs at most that
delay. SQLite has no LISTEN: `waker(url)` is None there and streams poll every
`POLL_SECONDS`, as they always did.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar, cast

import anyio
from prometheus_client import Counter
from sqlalchemy.engine import make_url

from api.project_gates import ProjectGates

CHANNEL = "mathrl_job"
POLL_SECONDS = 0.5  # streams without a listener (SQLite, or while it reconnects)
FALLBACK_SECONDS = 15.0  # streams with one: a re-read in case a notification was missed
KEEPALIVE_SECONDS = 15.0  # an SSE comment on a quiet stream, so proxies keep it open

STREAM_READS = Counter("mathrl_stream_reads_total", "Database reads made by open event streams")

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(eq=False)
class Waiter:
    job_id: str
    loop: asyncio.AbstractEventLoop
    event: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self) -> None:
        self.loop.call_soon_threadsafe(self.event.set)

    def clear(self) -> None:
        """Before a read: a notification that comes during it wakes the next wait."""
        self.event.clear()

    async def wait(self, timeout: float) -> bool:
        """True when woken, False after `timeout` seconds."""
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
            return True
        except TimeoutError:
            return False


class JobWaker:
    """The LISTEN thread of one API process and the streams it wakes, by job id."""

    def __init__(self, url: str) -> None:
        self.conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._waiters: dict[str, set[Waiter]] = defaultdict(set)
        self._generation: dict[str, int] = defaultdict(int)  # notifications seen, per job
        self._reconnects = 0
        self._lock = threading.Lock()
        self.listening = threading.Event()  # set while the LISTEN connection is up
        self.notifications = 0
        threading.Thread(target=self._run, name="mathrl-job-wakeups", daemon=True).start()

    def subscribe(self, job_id: str) -> Waiter:
        waiter = Waiter(job_id, asyncio.get_running_loop())
        with self._lock:
            self._waiters[job_id].add(waiter)
        return waiter

    def unsubscribe(self, waiter: Waiter) -> None:
        with self._lock:
            waiters = self._waiters.get(waiter.job_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[waiter.job_id]

    def generation(self, job_id: str) -> tuple[int, int]:
        """Which wake-up of the job a stream is reading for: streams woken by the same
        notification may share one read (`shared_read`); a later notification starts a new one."""
        return self._reconnects, self._generation.get(job_id, 0)

    def interval(self) -> float:
        """How long a stream waits for a wake-up before it reads anyway."""
        return FALLBACK_SECONDS if self.listening.is_set() else POLL_SECONDS

    def _wake(self, job_id: str | None) -> None:
        with self._lock:
            if job_id:
                self._generation[job_id] += 1
            else:
                self._reconnects += 1
            waiters = list(self._waiters.get(job_id, ())) if job_id else [w for s in self._waiters.values() for w in s]
        for waiter in waiters:
            waiter.wake()

    def _run(self) -> None:
        import psycopg

        backoff = 0.5
        while True:
            try:
                with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    backoff = 0.5
                    self._wake(None)  # anything written while not listening: every stream reads once
                    for note in conn.notifies():
                        self.notifications += 1
                        self._wake(note.payload)
            except Exception as exc:  # the database went away: streams poll until it is back
                log.warning("job wake-up listener lost its connection (%s); streams poll meanwhile", exc)
            self.listening.clear()
            self._wake(None)
            time.sleep(backoff)
            backoff = min(backoff * 2, 10.0)


_inflight: dict[Hashable, asyncio.Future[Any]] = {}  # shared_read's reads, on the API's event loop
# A project's streams' reads at once in this process. Streams at different cursors cannot share a
# read: a project's 300 streams (its limit), each given a cursor past every event, made 300 reads of
# each wake-up of its busy job, which took the API's threads (40) and database connections (30) from
# every other project. Past this they wait their turn; other projects' reads go on.
READS_PER_PROJECT = 4
_project_reads = ProjectGates(READS_PER_PROJECT)


async def project_read(project_id: str, read: Callable[[], T]) -> T:
    """`read()` in a worker thread, one of at most READS_PER_PROJECT of the project's at once."""
    async with _project_reads.of(project_id):
        return await anyio.to_thread.run_sync(read)


async def shared_read(key: Hashable, read: Callable[[], T], project_id: str) -> T:
    """`read()` in a worker thread (`project_read`), once for all the streams that ask with the same
    key while it runs: 200 streams of one job, woken by one notification, make one database read,
    not 200. The key must say everything the read depends on (job, cursors, the wake-up's generation).
    The read is a task of its own, which no stream's end cancels: a stream whose client went away
    while the read waited its project's turn would otherwise hand its cancellation to every stream
    that shared the read."""
    task = _inflight.get(key)
    if task is None:
        task = asyncio.ensure_future(project_read(project_id, read))
        _inflight[key] = task
        task.add_done_callback(partial(_read_done, key))
    return cast(T, await asyncio.shield(task))


def _read_done(key: Hashable, task: asyncio.Future[Any]) -> None:
    if _inflight.get(key) is task:
        _inflight.pop(key, None)  # a later wake-up reads again
    if not task.cancelled():
        task.exception()  # retrieved: no "never retrieved" warning when every stream had gone


_wakers: dict[str, JobWaker] = {}
_wakers_lock = threading.Lock()


def waker(url: str) -> JobWaker | None:
    """This process's listener for the database at `url` (started on first use), or None where
    the database cannot LISTEN (SQLite)."""
    if make_url(url).get_backend_name() != "postgresql":
        return None
    with _wakers_lock:
        if url not in _wakers:
            _wakers[url] = JobWaker(url)
        return _wakers[url]
