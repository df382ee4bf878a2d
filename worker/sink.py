"""DatabaseSink: what the job process reports goes straight into the database."""

from __future__ import annotations

import signal
import time
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.dialects import postgresql, sqlite

from store.db import session_scope
from store.jobs import add_event
from store.models import BenchmarkScore, Checkpoint, Job, Metric, Sample, utcnow


class DatabaseSink:
    def __init__(self, url: str, job_id: str, project_id: str, cancel_poll_seconds: float = 2.0) -> None:
        self.url, self.job_id, self.project_id = url, job_id, project_id
        self._stop = False
        self._last_poll = 0.0
        self._poll_every = cancel_poll_seconds
        self._last_progress = 0.0

    def install_sigterm(self) -> None:
        """SIGTERM (a cancel, or a pod being stopped) asks the job to stop at its next check."""
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))

    def event(self, type: str, message: str = "", level: str = "info", data: dict[str, Any] | None = None) -> None:
        with session_scope(self.url) as s:
            add_event(s, self.job_id, type, message, level, data)

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
        with session_scope(self.url) as s:
            dialect = s.get_bind().dialect.name
            ins = postgresql.insert(Metric) if dialect == "postgresql" else sqlite.insert(Metric)
            # a resumed job may log a step again: the first value stays
            s.execute(ins.on_conflict_do_nothing(index_elements=["job_id", "name", "step"]), rows)

    def samples(self, step: int | None, items: list[dict[str, Any]]) -> None:
        if not items:
            return
        with session_scope(self.url) as s:
            s.add_all(
                Sample(
                    job_id=self.job_id, step=step, index=i, prompt=it["prompt"], completion=it["completion"],
                    data=it.get("data"),
                )
                for i, it in enumerate(items)
            )

    def checkpoint(self, step: int, uri: str, kind: str = "checkpoint", data: dict[str, Any] | None = None) -> None:
        with session_scope(self.url) as s:
            existing = s.scalar(
                select(Checkpoint).where(Checkpoint.job_id == self.job_id, Checkpoint.step == step, Checkpoint.kind == kind)
            )
            if existing is None:
                s.add(Checkpoint(job_id=self.job_id, step=step, uri=uri, kind=kind, data=data))
            else:
                existing.uri, existing.data = uri, data
            add_event(s, self.job_id, kind, f"{kind} at step {step}: {uri}", data={"step": step, "uri": uri})

    def score(self, record: dict[str, Any]) -> None:
        with session_scope(self.url) as s:
            s.execute(insert(BenchmarkScore), [{**record, "project_id": self.project_id, "job_id": self.job_id}])

    def should_stop(self) -> bool:
        if self._stop:
            return True
        now = time.monotonic()
        if now - self._last_poll >= self._poll_every:
            self._last_poll = now
            with session_scope(self.url) as s:
                self._stop = bool(s.scalar(select(Job.cancel_requested).where(Job.id == self.job_id)))
        return self._stop
