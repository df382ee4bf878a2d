"""Runs mirrored to MLflow. When the operator names a tracking server (MATHRL_TRACKING__MLFLOW_URI),
the supervisor of each job copies it into a run of the experiment '<experiment_prefix>/<project name>':
the resolved configuration as params, the metrics by step, the scores at the end, and the run's
status from the job's (succeeded FINISHED, failed FAILED, cancelled KILLED).

`Mirror` (started by `start_mirror`) copies from the database, not from the job process, and a
tracker that is down never fails or delays a job; `backfill` (`python -m worker.tracking
backfill`) copies ended jobs afterwards. How the copy works, links and failures:
docs/operations.md, "`worker/tracking.py`: how the mirror copies".
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select

from config.settings import Settings, TrackingSettings
from store.db import session_scope
from store.jobs import add_event
from store.models import BenchmarkScore, Event, Job, Metric, Project

log = logging.getLogger("mathrl.tracking")

JOB_ID_TAG = "mathrl.job_id"
CURSOR_TAG = "mathrl.mirror.metric_id"  # the last metric row (store id) copied into the run
EVENT = "tracking"  # the job's event that carries the run's id and URL
RUN_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
# MLflow's limits (mlflow.utils.validation): a key's length, a param's value, a batch
MAX_KEY = 250
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 999  # and the cursor tag: 1000 entities in all
MAX_BACKOFF_SECONDS = 60.0
TRUNCATED = "...(truncated)"


def mlflow_key(name: str) -> str:
    """A metric or param name as MLflow accepts it: letters, digits, '_', '-', '.', ' ', '/' (others
    become '_'), no empty, '.' or '..' path part, at most 250 characters (a longer one is cut and
    ends with a hash of the whole, so two long names stay apart)."""
    parts = [re.sub(r"[^\w.\- ]", "_", p) for p in name.split("/")]
    key = "/".join("__" if p == ".." else p for p in parts if p not in ("", ".")) or "_"
    if len(key) > MAX_KEY:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        key = f"{key[: MAX_KEY - 9].rstrip('/')}~{digest}"
    return key


def _param_value(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif value is None or isinstance(value, bool | int | float):
        text = str(value)
    else:
        text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= MAX_PARAM_VALUE else text[: MAX_PARAM_VALUE - len(TRUNCATED)] + TRUNCATED


def flatten_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A job's resolved configuration as MLflow params: nested blocks joined with '.'
    ('resources.gpus', 'sampling.temperature'), lists as JSON, values cut to MLflow's 6000
    characters (ending '...(truncated)')."""
    out: dict[str, str] = {}
    for k, v in config.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten_params(v, f"{name}."))
        else:
            out[mlflow_key(name)] = _param_value(v)
    return out


def run_url(settings: TrackingSettings, experiment_id: str, run_id: str) -> str | None:
    """The run's page in the MLflow UI (ui_url, else the tracking URI when it is http(s))."""
    base = settings.ui_url or settings.mlflow_uri or ""
    if not base.startswith(("http://", "https://")):
        return None
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def _millis(when: datetime | None) -> int:
    if when is None:
        return int(time.time() * 1000)
    if when.tzinfo is None:  # SQLite hands back naive datetimes (stored as UTC)
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _configure_client(settings: TrackingSettings) -> None:
    """Short calls, no retries inside the client: a flush that fails is tried again at the next."""
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, math.ceil(settings.request_timeout_seconds)))
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"


class Mirror:
    """Copies one job attempt into its MLflow run: `start()` when the attempt starts, `close(status)`
    when the supervisor has recorded how it ended."""

    def __init__(self, settings: Settings, job_id: str) -> None:
        self.settings, self.tracking = settings, settings.tracking
        self.url, self.job_id = settings.database.url, job_id
        self.client: Any = None
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.cursor = 0  # metric row id copied up to
        self.copied = 0  # metric points sent in this attempt
        self.errors = 0  # calls to MLflow that failed in this attempt
        self.first_error: str | None = None
        self.failing = 0  # flushes failed in a row (the wait between them grows)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one flush at a time (the thread's, or the last one in close)
        self._thread: threading.Thread | None = None

    # ---- the attempt ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"mathrl-mlflow-{self.job_id}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        wait = 0.0
        while not self._stop.wait(wait):
            self.flush()
            wait = min(self.tracking.flush_seconds * 2**self.failing, MAX_BACKOFF_SECONDS)

    def close(self, status: str | None) -> None:
        """The last copy, the scores, and the run ended as the job did (a job handed back to the
        queue, or lost to another attempt, leaves its run running: the next attempt goes on)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.tracking.request_timeout_seconds * 2 + 1)
        ended = RUN_STATUS.get(status or "")
        terminated = False
        if self.flush() and ended is not None and self._call("scores", self._log_scores):
            terminated = bool(self._call("ending the run", lambda: self.client.set_terminated(self.run_id, ended)))
        if self.errors:
            pending = self._pending()
            msg = (
                f"{self.errors} call(s) to MLflow at {self.tracking.mlflow_uri} failed in this attempt "
                f"(first: {self.first_error}); {self.copied} metric points copied, {pending} not"
                + (f"; the run was not ended {ended}" if ended and not terminated else "")
                + ". The job is unaffected."
            )
            log.warning("job %s: %s", self.job_id, msg)
            data = {"errors": self.errors, "copied": self.copied, "pending": pending, "run_id": self.run_id}
            self._event(msg, "warning", data)

    # ---- one copy --------------------------------------------------------------------------

    def flush(self) -> bool:
        """Open the run if it is not yet, then copy the metric rows added since the last copy.
        False when MLflow (or the database) failed: tried again at the next flush."""
        with self._lock:
            try:
                ok = (self.run_id is not None or self._open()) and self._copy_metrics()
            except Exception as exc:  # the database: the job's own writes see it too
                log.warning("job %s: reading what to copy to MLflow failed (%s)", self.job_id, exc)
                ok = False
            self.failing = 0 if ok else self.failing + 1
            return ok

    def _call(self, what: str, fn: Any) -> Any:
        """One call to MLflow; a failure is counted (and shown at the first), never raised."""
        try:
            result = fn()
            return True if result is None else result
        except Exception as exc:
            self.errors += 1
            error = f"{what}: {type(exc).__name__}: {str(exc)[:300]}"
            if self.first_error is None:
                self.first_error = error
                log.warning("job %s: MLflow failed (%s)", self.job_id, error)
                self._event(
                    f"MLflow at {self.tracking.mlflow_uri} failed ({error}); the job goes on, and the copy "
                    "is tried again later",
                    "warning",
                    {"error": error},
                )
            return None

    def _connect(self) -> bool:
        if self.client is None:
            try:
                from mlflow import MlflowClient
            except ImportError:
                self._call("client", _no_client)
                self._stop.set()  # it will not appear while this worker runs: no more tries
                return False
            _configure_client(self.tracking)
            self.client = MlflowClient(tracking_uri=self.tracking.mlflow_uri)
        return True

    def complete(self, status: str, last_metric: int | None) -> bool:
        """Whether this ended job's run already holds it all: the run its events name (or tagged
        with its id) is ended as the job did, and its cursor is at the job's last metric row.
        A backfill leaves such a run alone (no second 'tracking' event, no re-opened run)."""
        if not self._connect():
            return False
        with session_scope(self.url) as s:
            recorded = s.scalars(select(Event.data).where(Event.job_id == self.job_id, Event.type == EVENT)).all()
        known = next((d["run_id"] for d in recorded if d and d.get("run_id")), None)
        if known is None:
            return False
        run = self._call("run", lambda: self.client.get_run(known))
        if run is None or run.info.status != RUN_STATUS.get(status):
            return False
        return int(run.data.tags.get(CURSOR_TAG, "0") or 0) >= (last_metric or 0)

    def _open(self) -> bool:
        if not self._connect():
            return False
        with session_scope(self.url) as s:
            job = s.get(Job, self.job_id)
            if job is None:
                return False
            project = s.get(Project, job.project_id)
            recorded = s.scalars(
                select(Event.data).where(Event.job_id == self.job_id, Event.type == EVENT).order_by(Event.seq)
            ).all()
            info: dict[str, Any] = {
                "project_id": job.project_id,
                "project": project.name if project is not None else job.project_id,
                "kind": job.kind,
                "name": job.name,
                "tags": list(job.tags or []),
                "config": dict(job.resolved_config or job.spec or {}),
            }
        known = next((d["run_id"] for d in recorded if d and d.get("run_id")), None)
        experiment = f"{self.tracking.experiment_prefix}/{info['project']}"
        experiment_id = self._call("experiment", lambda: self._experiment(experiment, info["project_id"]))
        if experiment_id is None:
            return False
        run = self._call("run", lambda: self._run(experiment_id, known, info))
        if run is None:
            return False
        if self._call("params", lambda: self._log_params(run.info.run_id, flatten_params(info["config"]))) is None:
            return False
        self.run_id, self.experiment_id = run.info.run_id, experiment_id
        self.cursor = int(run.data.tags.get(CURSOR_TAG, "0") or 0)
        if known != self.run_id:
            url = run_url(self.tracking, experiment_id, self.run_id)
            self._event(
                f"mirrored to MLflow: run {self.run_id} of experiment '{experiment}'" + (f", {url}" if url else ""),
                data={"run_id": self.run_id, "experiment_id": experiment_id, "experiment": experiment, "url": url},
            )
        return True

    def _experiment(self, name: str, project_id: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self.client.create_experiment(name, tags={"mathrl.project_id": project_id}))
        except Exception:  # another worker created it meanwhile
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return str(found.experiment_id)

    def _run(self, experiment_id: str, known: str | None, info: dict[str, Any]) -> Any:
        """This job's run: the one its events name, else the one tagged with its id, else a new one.
        A run the job's earlier attempt ended (a crashed worker's job, re-run) runs again."""
        run = None
        if known is not None:
            try:
                run = self.client.get_run(known)
            except Exception:  # deleted on the MLflow side (or MLflow is down: then the search fails too)
                run = None
        if run is None:
            runs = self.client.search_runs(
                [experiment_id], filter_string=f"tags.`{JOB_ID_TAG}` = '{self.job_id}'", max_results=1
            )
            run = runs[0] if runs else None
        if run is None:
            return self.client.create_run(
                experiment_id, start_time=_millis(None), tags=self._tags(info), run_name=info["name"] or self.job_id
            )
        if run.info.status != "RUNNING":
            self.client.update_run(run.info.run_id, status="RUNNING")
        return run

    def _tags(self, info: dict[str, Any]) -> dict[str, str]:
        page = f"{self.tracking.mathrl_url.rstrip('/')}/ui/jobs/{self.job_id}" if self.tracking.mathrl_url else None
        tags = {
            JOB_ID_TAG: self.job_id,
            "mathrl.project": info["project"],
            "mathrl.project_id": info["project_id"],
            "mathrl.kind": info["kind"],
            "mathrl.tags": ",".join(info["tags"]),
            "mlflow.source.type": "JOB",
            "mlflow.source.name": f"mathrl {info['kind']} job",
            "mlflow.note.content": f"mathrl job [{self.job_id}]({page})" if page else f"mathrl job {self.job_id}",
        }
        if page:
            tags["mathrl.job_url"] = page
        return {k: v[:MAX_TAG_VALUE] for k, v in tags.items() if v}

    def _log_params(self, run_id: str, params: dict[str, str]) -> None:
        """Every attempt logs them (the same values again are accepted): an attempt that made the
        run may have stopped before they were all in."""
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=items[i : i + PARAMS_PER_BATCH])

    def _copy_metrics(self) -> bool:
        from mlflow.entities import Metric as MlflowMetric
        from mlflow.entities import RunTag

        while True:
            with session_scope(self.url) as s:
                rows = s.execute(
                    select(Metric.id, Metric.name, Metric.step, Metric.value, Metric.time)
                    .where(Metric.job_id == self.job_id, Metric.id > self.cursor)
                    .order_by(Metric.id)
                    .limit(METRICS_PER_BATCH)
                ).all()
            if not rows:
                return True
            points = [MlflowMetric(mlflow_key(r.name), float(r.value), _millis(r.time), int(r.step)) for r in rows]
            last = int(rows[-1].id)
            sent = self._call(
                "metrics",
                lambda points=points, last=last: self.client.log_batch(
                    self.run_id, metrics=points, tags=[RunTag(CURSOR_TAG, str(last))]
                ),
            )
            if sent is None:
                return False
            self.cursor, self.copied = last, self.copied + len(points)
            if len(rows) < METRICS_PER_BATCH:
                return True

    def _log_scores(self) -> None:
        """The job's benchmark scores as metrics 'score/<benchmark>/<metric>' (step 0)."""
        from mlflow.entities import Metric as MlflowMetric

        with session_scope(self.url) as s:
            rows = s.execute(
                select(BenchmarkScore.benchmark, BenchmarkScore.metric, BenchmarkScore.value, BenchmarkScore.created_at)
                .where(BenchmarkScore.job_id == self.job_id)
                .order_by(BenchmarkScore.created_at)
            ).all()
        points = [
            MlflowMetric(mlflow_key(f"score/{r.benchmark}/{r.metric}"), float(r.value), _millis(r.created_at), 0)
            for r in rows
        ]
        for i in range(0, len(points), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=points[i : i + METRICS_PER_BATCH])

    def _pending(self) -> int:
        """Metric points of the job not copied (yet)."""
        try:
            with session_scope(self.url) as s:
                query = select(func.count()).where(Metric.job_id == self.job_id, Metric.id > self.cursor)
                return int(s.scalar(query) or 0)
        except Exception:
            return 0

    def _event(self, message: str, level: str = "info", data: dict[str, Any] | None = None) -> None:
        try:
            with session_scope(self.url) as s:
                add_event(s, self.job_id, EVENT, message, level, data=data)
        except Exception as exc:  # database briefly down: the job runs anyway
            log.warning("job %s: recording a tracking event failed (%s)", self.job_id, exc)


def _no_client() -> None:
    raise ImportError(
        "MATHRL_TRACKING__MLFLOW_URI is set and this worker has no MLflow client: "
        "install mathrl[mlflow] (mlflow-skinny)"
    )


def start_mirror(settings: Settings, job_id: str) -> Mirror | None:
    """A running mirror for this job attempt, or None when no tracking server is configured."""
    if not settings.tracking.mlflow_uri:
        return None
    mirror = Mirror(settings, job_id)
    mirror.start()
    return mirror


def backfill(
    settings: Settings,
    *,
    project: str | None = None,
    job_ids: list[str] | None = None,
    since: datetime | None = None,
) -> dict[str, list[str]]:
    """Mirror the ended jobs MLflow is missing (they ran while it was down, or before tracking was
    configured), as each job's supervisor would have at its end: the run made or found, its
    params, every metric from its cursor on, the scores, and the run ended as the job did.
    Idempotent: a job whose run is complete (`Mirror.complete`) is left alone, and a run already
    made is continued, never doubled. Returns the job ids by outcome: 'mirrored', 'complete' (left
    alone), 'failed' (MLflow refused a call: run it again)."""
    if not settings.tracking.mlflow_uri:
        raise ValueError("tracking.mlflow_uri is not set: set MATHRL_TRACKING__MLFLOW_URI to the MLflow server")
    with session_scope(settings.database.url) as s:
        last = select(Metric.job_id, func.max(Metric.id).label("last")).group_by(Metric.job_id).subquery()
        q = (
            select(Job.id, Job.status, last.c.last)
            .outerjoin(last, last.c.job_id == Job.id)
            .where(Job.status.in_(list(RUN_STATUS)))
            .order_by(Job.created_at)
        )
        if project is not None:
            q = q.join(Project, Project.id == Job.project_id).where(Project.name == project)
        if job_ids:
            q = q.where(Job.id.in_(job_ids))
        if since is not None:
            q = q.where(Job.finished_at >= since)
        rows = s.execute(q).all()
    out: dict[str, list[str]] = {"mirrored": [], "complete": [], "failed": []}
    for job_id, status, last_metric in rows:
        mirror = Mirror(settings, job_id)
        if mirror.complete(status, last_metric):
            out["complete"].append(job_id)
            continue
        mirror.close(status)
        out["mirrored" if mirror.errors == 0 and mirror.run_id else "failed"].append(job_id)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m worker.tracking backfill [--project P] [--job ID ...] [--since ISO]` (a worker
    image has it): mirror the ended jobs MLflow is missing. Exit status 1 when MLflow refused a
    call for some job (run it again: it goes on where it stopped), 2 when no tracking server is set."""
    import argparse

    from config.settings import get_settings

    p = argparse.ArgumentParser(prog="python -m worker.tracking", description="Runs mirrored to MLflow.")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("backfill", help="mirror the ended jobs MLflow is missing, idempotently")
    b.add_argument("--project", help="only this project's jobs (its name)")
    b.add_argument("--job", action="append", help="only these job ids (repeat the option)")
    b.add_argument("--since", help="only jobs that ended since (ISO date or time, UTC)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    since = datetime.fromisoformat(args.since).replace(tzinfo=UTC) if args.since else None
    try:
        out = backfill(get_settings(), project=args.project, job_ids=args.job, since=since)
    except ValueError as exc:
        print(f"backfill: {exc}", file=sys.stderr)
        return 2
    for outcome, ids in out.items():
        print(f"{outcome}: {len(ids)}" + (f" ({', '.join(ids)})" if ids else ""))
    return 1 if out["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
