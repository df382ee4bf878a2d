"""What the jobs router (api/routers/jobs.py) reads off the store for a project's job: the job
itself (`own_job`, a 404 for another project's), a page of the project's jobs under the list's
filters (`job_page`), its events after a seq (`events_after`), its metric series a page of whole
steps at a time (`metric_page`), its samples (`sample_page`), and its results file, served only
from under the artifact dir (`results_path`)."""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.deps import owned, page_cursor
from api.problems import JOB_NOT_FOUND, NO_RESULTS, RESULTS_UNAVAILABLE, Problem
from config.settings import Settings
from mathrl.schemas import JobStatus, MetricPoint
from store.jobs import has_tag
from store.models import Checkpoint, Event, Job, Metric, Sample

log = logging.getLogger("mathrl.api")

METRICS_PAGE_POINTS = 5000


def own_job(session: Session, project_id: str, job_id: str) -> Job:
    return owned(session, Job, project_id, job_id, JOB_NOT_FOUND)


def job_page(
    session: Session,
    project_id: str,
    kind: str | None,
    status: JobStatus | None,
    tag: str | None,
    pipeline_id: str | None,
    limit: int,
    cursor: str | None,
) -> dict[str, Any]:
    """The project's jobs newest first, under the list's filters, and the next page's cursor."""
    q = select(Job).where(Job.project_id == project_id)
    if pipeline_id:
        q = q.where(Job.pipeline_id == pipeline_id)
    if kind:
        q = q.where(Job.kind == kind)
    if status:
        q = q.where(Job.status == status)
    if tag:
        q = q.where(has_tag(session, tag))
    if (c := page_cursor(cursor)) is not None:
        q = q.where(Job.id < c)
    rows = list(session.scalars(q.order_by(Job.id.desc()).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return {"data": rows, "next_cursor": rows[-1].id if more and rows else None}


def events_after(session: Session, job_id: str, after: int | None, limit: int) -> list[Event]:
    q = select(Event).where(Event.job_id == job_id)
    if after is not None:
        q = q.where(Event.seq > after)
    return list(session.scalars(q.order_by(Event.seq).limit(limit)))


def metric_page(session: Session, job_id: str, name: str | None, after_step: int | None, limit: int) -> dict[str, Any]:
    """The job's series by name, ordered by step, at most `limit` points cut at a whole step (one
    step alone over `limit`: that step, whole), and the last step returned while more remain."""
    q = select(Metric).where(Metric.job_id == job_id)
    if name:
        q = q.where(Metric.name == name)
    if after_step is not None:
        q = q.where(Metric.step > after_step)
    rows = list(session.scalars(q.order_by(Metric.step, Metric.name).limit(limit + 1)))
    next_cursor = None
    if len(rows) > limit:
        cut = rows[limit].step  # the first step not wholly on this page
        rows = [m for m in rows[:limit] if m.step < cut]
        if not rows:  # one step alone holds more than `limit` points: that step, whole
            rows = list(session.scalars(q.where(Metric.step == cut).order_by(Metric.name)))
        next_cursor = str(rows[-1].step)
    series: dict[str, list[MetricPoint]] = defaultdict(list)
    for m in rows:
        series[m.name].append(MetricPoint(step=m.step, value=m.value, time=m.time))
    return {"data": [{"name": k, "points": series[k]} for k in sorted(series)], "next_cursor": next_cursor}


def sample_page(session: Session, job_id: str, step: int | None, limit: int, cursor: str | None) -> dict[str, Any]:
    q = select(Sample).where(Sample.job_id == job_id)
    if step is not None:
        q = q.where(Sample.step == step)
    if (c := page_cursor(cursor)) is not None:
        q = q.where(Sample.id > c)
    rows = list(session.scalars(q.order_by(Sample.id).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return {"data": rows, "next_cursor": rows[-1].id if more else None}


def results_path(session: Session, settings: Settings, job_id: str) -> Path:
    """The file of the job's newest results checkpoint, a 404 when it has none or its uri is not a
    file under the artifact dir (which the API and the workers share)."""
    row = session.scalar(
        select(Checkpoint)
        .where(Checkpoint.job_id == job_id, Checkpoint.kind == "results")
        .order_by(Checkpoint.created_at.desc(), Checkpoint.id.desc())
        .limit(1)
    )
    if row is None:
        raise Problem(404, "Not found", NO_RESULTS)
    # API and workers share the artifact dir; serve nothing a stored uri points at outside it
    root = Path(settings.artifact_dir).resolve()
    uri = unquote(urlsplit(row.uri).path) if row.uri.startswith("file://") else row.uri
    path = Path(uri).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        log.warning("job %s: results uri %r is not a file under %s", job_id, row.uri, root)
        raise Problem(404, "Not found", RESULTS_UNAVAILABLE)
    return path
