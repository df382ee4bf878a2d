"""DatabaseSink: what the job process reports goes straight into the database.

Every write is one transaction retried through a database outage (store.db.retry_transient),
so a job running while PostgreSQL restarts loses no metric, sample or event; it gives up,
failing the job with the reason, only after `give_up_after` seconds."""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite

from store.db import retry_transient, session_scope
from store.ids import uuid7
from store.jobs import add_event
from store.models import BenchmarkScore, Checkpoint, Job, Metric, Sample, utcnow

SCORE_KEY = ("job_id", "model_ref", "benchmark", "metric")  # store.models' uq_scores_natural_key


class DatabaseSink:
    """Events, checkpoints and scores are written at once. Metrics and samples, the per-step
    traffic, go through one writer thread so a training step never waits on the database;
    `flush()` (called before the job process exits) waits until they are all stored."""

    def __init__(
        self, url: str, job_id: str, project_id: str, cancel_poll_seconds: float = 2.0, give_up_after: float = 300.0
    ) -> None:
        self.url, self.job_id, self.project_id = url, job_id, project_id
        self.give_up_after = give_up_after
        self._stop = False
        self._last_poll = 0.0
        self._poll_every = cancel_poll_seconds
        self._last_progress = 0.0
        self._queue: queue.Queue[Callable[[], None]] = queue.Queue()
        self._writer: threading.Thread | None = None
        self._error: BaseException | None = None

    def _submit(self, write: Callable[[], None]) -> None:
        if self._error is not None:
            raise RuntimeError(f"writing to the database failed: {self._error}") from self._error
        if self._writer is None:
            self._writer = threading.Thread(target=self._drain, name="mathrl-sink-writer", daemon=True)
            self._writer.start()
        self._queue.put(write)

    def _write(self, write: Callable[[], None], what: str) -> None:
        retry_transient(write, f"job {self.job_id}: {what}", self.give_up_after)

    def _drain(self) -> None:
        while True:
            write = self._queue.get()
            try:
                if self._error is None:  # after a failure the job is failing: later rows wait no more
                    self._write(write, "metrics/samples")
            except Exception as exc:  # noqa: BLE001
                self._error = exc
            self._queue.task_done()

    def flush(self) -> None:
        """Block until every queued metric and sample is stored (raises if one could not be)."""
        if self._writer is not None:
            self._queue.join()
        if self._error is not None:
            raise RuntimeError(f"writing to the database failed: {self._error}") from self._error

    def install_sigterm(self) -> None:
        """SIGTERM (a cancel, or a pod being stopped) asks the job to stop at its next check."""
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))

    def event(self, type: str, message: str = "", level: str = "info", data: dict[str, Any] | None = None) -> None:
        def write() -> None:
            with session_scope(self.url) as s:
                add_event(s, self.job_id, type, message, level, data)

        self._write(write, f"event {type}")

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

        def write() -> None:
            with session_scope(self.url) as s:
                dialect = s.get_bind().dialect.name
                ins = postgresql.insert(Metric) if dialect == "postgresql" else sqlite.insert(Metric)
                # a resumed job may log a step again: the first value stays
                s.execute(ins.on_conflict_do_nothing(index_elements=["job_id", "name", "step"]), rows)

        self._submit(write)

    def samples(self, step: int | None, items: list[dict[str, Any]]) -> None:
        if not items:
            return
        rows = [
            {"id": uuid7(), "job_id": self.job_id, "step": step, "index": i, "prompt": it["prompt"],
             "completion": it["completion"], "data": it.get("data")}
            for i, it in enumerate(items)
        ]

        def write() -> None:
            with session_scope(self.url) as s:
                dialect = s.get_bind().dialect.name
                ins = postgresql.insert(Sample) if dialect == "postgresql" else sqlite.insert(Sample)
                # ids are fixed up front: a retry after a commit whose answer was lost adds nothing
                s.execute(ins.on_conflict_do_nothing(index_elements=["id"]), rows)

        self._submit(write)

    def checkpoint(self, step: int, uri: str, kind: str = "checkpoint", data: dict[str, Any] | None = None) -> None:
        def write() -> None:
            with session_scope(self.url) as s:
                existing = s.scalar(
                    select(Checkpoint)
                    .where(Checkpoint.job_id == self.job_id, Checkpoint.step == step, Checkpoint.kind == kind)
                )
                if existing is None:
                    s.add(Checkpoint(job_id=self.job_id, step=step, uri=uri, kind=kind, data=data))
                else:
                    existing.uri, existing.data = uri, data
                add_event(s, self.job_id, kind, f"{kind} at step {step}: {uri}", data={"step": step, "uri": uri})

        self._write(write, f"{kind} at step {step}")

    def score(self, record: dict[str, Any]) -> None:
        row = {**record, "project_id": self.project_id, "job_id": self.job_id}

        def write() -> None:
            with session_scope(self.url) as s:
                dialect = s.get_bind().dialect.name
                ins = postgresql.insert(BenchmarkScore) if dialect == "postgresql" else sqlite.insert(BenchmarkScore)
                # upsert on the natural key: an attempt re-run after a lost worker replaces its scores
                replace = {k: getattr(ins.excluded, k) for k in row if k not in SCORE_KEY}
                replace["created_at"] = utcnow()
                s.execute(ins.values(**row).on_conflict_do_update(index_elements=list(SCORE_KEY), set_=replace))

        self._write(write, "score")

    def should_stop(self) -> bool:
        if self._stop:
            return True
        now = time.monotonic()
        if now - self._last_poll >= self._poll_every:
            self._last_poll = now
            try:
                with session_scope(self.url) as s:
                    self._stop = bool(s.scalar(select(Job.cancel_requested).where(Job.id == self.job_id)))
            except Exception:  # noqa: BLE001 - database down: a cancel also arrives as SIGTERM
                pass
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

    def checkpoint(self, step: int, uri: str, kind: str = "checkpoint", data: dict[str, Any] | None = None) -> None:
        pass

    def score(self, record: dict[str, Any]) -> None:
        pass
