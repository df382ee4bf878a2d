"""DatabaseSink: what the job process reports goes straight into the database (`ReadOnlySink`: the
other ranks', which drops writes and still sees stop requests).

Every write is one transaction retried through a database outage (store.db.retry_transient), failing
the job only after `give_up_after` seconds, and fenced (store.jobs.holds_lease, `Fence`): it commits
only while this attempt still owns the job. A process whose writes are refused counts them in its
attempt's `rejected-writes.log`, raises LeaseLost and stops. Checkpoints are moved from the
attempt's directory into the job's inside the fenced transaction that records them. RELIABILITY.md,
drills 4 and 6."""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from runtime.errors import LeaseLost as LeaseLost  # raised here; the worker and tests import it from here
from runtime.sink import promote
from store.db import error_text, retry_transient, session_scope
from store.ids import uuid7
from store.jobs import add_event, holds_lease
from store.models import BenchmarkScore, Checkpoint, Endpoint, Job, Metric, Sample, utcnow

SCORE_KEY = ("job_id", "model_ref", "benchmark", "metric")  # store.models' uq_scores_natural_key


def _insert(session: Session, table: Any) -> Any:
    """The dialect's INSERT for `table` (both have ON CONFLICT: the sink's writes are upserts)."""
    return (postgresql if session.get_bind().dialect.name == "postgresql" else sqlite).insert(table)


@dataclass(frozen=True)
class Fence:
    """Who may write: the lease owner and the attempt number of the claim that started this
    process; `rejected_log`: where refused writes are counted (read by the supervisor)."""

    owner: str
    attempt: int
    rejected_log: Path | None = None


class DatabaseSink:
    """Events, checkpoints and scores are written at once. Metrics and samples, the per-step
    traffic, go through one writer thread so a training step never waits on the database;
    `flush()` (called before the job process exits) waits until they are all stored."""

    def __init__(
        self,
        url: str,
        job_id: str,
        project_id: str,
        cancel_poll_seconds: float = 2.0,
        give_up_after: float = 300.0,
        fence: Fence | None = None,
        drain_file: Path | None = None,
    ) -> None:
        self.url, self.job_id, self.project_id = url, job_id, project_id
        self.drain_file = drain_file  # the supervisor creates it when its worker is shutting down
        self.give_up_after = give_up_after
        self.fence = fence  # None: unfenced (tests and tools writing for a job they do not run)
        self.lost = False
        self.rejected = 0
        self._stop = False
        self._paused = False  # a pause read from the job row: a drain, like the supervisor's file
        self._last_poll = 0.0
        self._poll_every = cancel_poll_seconds
        self._last_progress = 0.0
        self._queue: queue.Queue[Callable[[Any], None]] = queue.Queue()
        self._writer: threading.Thread | None = None
        self._error: BaseException | None = None

    def _raise_error(self) -> None:
        assert self._error is not None
        if isinstance(self._error, LeaseLost):
            raise self._error
        raise RuntimeError(f"writing to the database failed: {error_text(self._error)}") from self._error

    def _submit(self, write: Callable[[Any], None]) -> None:
        if self._error is not None:
            self._raise_error()
        if self._writer is None:
            self._writer = threading.Thread(target=self._drain, name="mathrl-sink-writer", daemon=True)
            self._writer.start()
        self._queue.put(write)

    def _write(self, write: Callable[[Any], object], what: str) -> None:
        """One fenced transaction: `write(session)` runs, and commits, only while this attempt
        owns the job (retried through a database outage)."""

        def fenced() -> None:
            if self.lost:
                raise LeaseLost(f"attempt {self.fence.attempt if self.fence else '?'} lost job {self.job_id}")
            with session_scope(self.url) as s:
                if self.fence is not None and not holds_lease(s, self.job_id, self.fence.owner, self.fence.attempt):
                    self.lost = True
                    raise LeaseLost(
                        f"attempt {self.fence.attempt} no longer owns job {self.job_id} (its lease "
                        "lapsed and the job was re-queued): its writes are refused"
                    )
                write(s)

        try:
            retry_transient(fenced, f"job {self.job_id}: {what}", self.give_up_after)
        except LeaseLost:
            self._count_rejected(what)
            self._stop = True
            raise

    def _count_rejected(self, what: str) -> None:
        self.rejected += 1
        log = self.fence.rejected_log if self.fence else None
        if log is not None:  # appended at once: the process may be killed any moment now
            with open(log, "a") as f:
                f.write(f"{time.time():.3f} {what}\n")

    def _drain(self) -> None:
        while True:
            write = self._queue.get()
            try:
                if self._error is None:  # after a failure the job is failing: later rows wait no more
                    self._write(write, "metrics/samples")
                elif isinstance(self._error, LeaseLost):
                    self._count_rejected("metrics/samples")
            except Exception as exc:
                self._error = exc
            self._queue.task_done()

    def flush(self) -> None:
        """Block until every queued metric and sample is stored (raises if one could not be)."""
        if self._writer is not None:
            self._queue.join()
        if self._error is not None:
            self._raise_error()

    def install_sigterm(self) -> None:
        """SIGTERM (a cancel, or a pod being stopped) asks the job to stop at its next check. (Not in a
        Ray Train worker, whose training runs in a thread: there the stop comes through the database.)"""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))

    def event(self, type: str, message: str = "", level: str = "info", data: dict[str, Any] | None = None) -> None:
        self._write(lambda s: add_event(s, self.job_id, type, message, level, data), f"event {type}")

    def progress(self, done: int, total: int, message: str = "") -> None:
        now = time.monotonic()
        if done < total and now - self._last_progress < 1.0:
            return
        self._last_progress = now
        self.event("progress", f"{done}/{total} {message}".strip(), data={"done": done, "total": total})

    def metrics(self, step: int, values: dict[str, float]) -> None:
        if not values:
            return
        rows = [
            {"job_id": self.job_id, "name": k, "step": step, "value": float(v), "time": utcnow()}
            for k, v in values.items()
            if v is not None
        ]

        def write(s: Any) -> None:
            ins = _insert(s, Metric)
            # a resumed job may log a step again: the first value stays
            s.execute(ins.on_conflict_do_nothing(index_elements=["job_id", "name", "step"]), rows)

        self._submit(write)

    def stored_steps(self) -> set[int]:
        with session_scope(self.url) as s:
            q = select(Sample.step).where(Sample.job_id == self.job_id, Sample.step.is_not(None)).distinct()
            return {int(step) for step in s.scalars(q) if step is not None}

    def samples(self, step: int | None, items: list[dict[str, Any]]) -> None:
        if not items:
            return
        rows = [
            {
                "id": uuid7(),
                "job_id": self.job_id,
                "step": step,
                "index": i,
                "prompt": it["prompt"],
                "completion": it["completion"],
                "data": it.get("data"),
            }
            for i, it in enumerate(items)
        ]

        def write(s: Any) -> None:
            ins = _insert(s, Sample)
            # ids are fixed up front: a retry after a commit whose answer was lost adds nothing
            s.execute(ins.on_conflict_do_nothing(index_elements=["id"]), rows)

        self._submit(write)

    def checkpoint(
        self,
        step: int,
        uri: str,
        kind: str = "checkpoint",
        data: dict[str, Any] | None = None,
        source: str | None = None,
    ) -> None:
        if self.fence is not None:
            data = {**(data or {}), "attempt": self.fence.attempt}
        # every metric and sample logged before it is stored first: a job resumed from this
        # checkpoint replays only the steps after it, so what was still queued would be lost
        self.flush()

        def write(s: Any) -> None:
            existing = s.scalar(
                select(Checkpoint).where(
                    Checkpoint.job_id == self.job_id, Checkpoint.step == step, Checkpoint.kind == kind
                )
            )
            if existing is None:
                s.add(Checkpoint(job_id=self.job_id, step=step, uri=uri, kind=kind, data=data))
            else:
                existing.uri, existing.data = uri, data
            add_event(s, self.job_id, kind, f"{kind} at step {step}: {uri}", data={"step": step, "uri": uri})
            s.flush()  # the rows are in: only the commit is left after the move
            if source is not None and source != uri:  # owned (the fence holds until commit): make it the job's
                promote(Path(source), Path(uri))

        self._write(write, f"{kind} at step {step}")

    def score(self, record: dict[str, Any]) -> None:
        row = {**record, "project_id": self.project_id, "job_id": self.job_id}

        def write(s: Any) -> None:
            ins = _insert(s, BenchmarkScore)
            # upsert on the natural key: an attempt re-run after a lost worker replaces its scores
            replace = {k: getattr(ins.excluded, k) for k in row if k not in SCORE_KEY}
            replace["created_at"] = utcnow()
            s.execute(ins.values(**row).on_conflict_do_update(index_elements=list(SCORE_KEY), set_=replace))

        self._write(write, "score")

    def endpoint(self, url: str | None, token: str = "") -> None:
        def write(s: Any) -> None:
            row = s.get(Endpoint, self.job_id)
            if url is None:
                if row is not None:
                    s.delete(row)
            elif row is None:
                s.add(Endpoint(job_id=self.job_id, url=url, token=token))
            else:
                row.url, row.token = url, token

        self._write(write, "endpoint")

    def draining(self) -> bool:
        """The worker is shutting down: save a checkpoint now, stop, and the job is handed back
        to the queue (a file in the attempt's directory, so every rank of a multi-process job
        sees it without a signal that would stop `accelerate launch` itself)."""
        return self._paused or (self.drain_file is not None and self.drain_file.exists())

    def should_stop(self, fresh: bool = False) -> bool:
        """A cancel or a pause was requested, SIGTERM came, the worker is draining (then
        `draining()`: a pause is a drain too), or this attempt lost the job (then `lost`). The job
        row is read every `cancel_poll_seconds`, and whenever `fresh` (at each step's end): a
        cancel or pause accepted by the API then starts no further step."""
        if self._stop or self.draining():
            return True
        now = time.monotonic()
        if fresh or now - self._last_poll >= self._poll_every:
            self._last_poll = now
            try:
                with session_scope(self.url) as s:
                    row = s.execute(
                        select(
                            Job.cancel_requested, Job.pause_requested, Job.status, Job.lease_owner, Job.attempts
                        ).where(Job.id == self.job_id)
                    ).one()
            except Exception:
                return self._stop
            f = self.fence
            if f is not None and (row.status != "running" or row.lease_owner != f.owner or row.attempts != f.attempt):
                self.lost = True
            self._paused = bool(row.pause_requested) and not row.cancel_requested
            self._stop = bool(row.cancel_requested) or self.lost or self._paused
        return self._stop


class ReadOnlySink(DatabaseSink):
    """For the ranks other than the main one in a multi-process job: the main rank reports
    (metrics, samples, events, checkpoints, scores), these writes are dropped; stop requests
    (cancel_requested, read-only, and SIGTERM) are still seen."""

    def event(self, type: str, message: str = "", level: str = "info", data: dict[str, Any] | None = None) -> None:
        pass

    def metrics(self, step: int, values: dict[str, float]) -> None:
        pass

    def samples(self, step: int | None, items: list[dict[str, Any]]) -> None:
        pass

    def checkpoint(
        self,
        step: int,
        uri: str,
        kind: str = "checkpoint",
        data: dict[str, Any] | None = None,
        source: str | None = None,
    ) -> None:
        pass

    def score(self, record: dict[str, Any]) -> None:
        pass

    def endpoint(self, url: str | None, token: str = "") -> None:
        pass
