"""An OpenAI resource that is a view over jobs (a batch, a fine-tuning job, a response): its id is the
job's id behind a prefix ('batch_', 'ftjob-', 'resp_'), its jobs carry a tag, and a project sees only its
own (another project's and a missing one are the same 404). Its lists are OpenAI's envelope, newest
first, paged by the last id seen (`after`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from api.problems import Problem
from mathrl.modelref import uuid_after
from store.jobs import has_tag
from store.models import Job


@dataclass(frozen=True)
class JobResource:
    prefix: str  # what the job's id (without dashes) stands behind: 'batch_'
    tag: str  # what its jobs carry: 'openai:batches'
    not_found: str  # the 404's detail: 'No batch with this id in your project.'
    noun: str  # what a bad cursor names: 'batch'
    statuses: Mapping[str, str]  # every job status (mathrl.status) -> OpenAI's word for it
    stopping: str | None = None  # a running job whose cancel was asked (None: its running word)
    pausing: str | None = None  # a running job whose pause was asked

    def status(self, job: Job) -> str:
        """The job's status as this resource's object says it."""
        if job.status == "running" and job.cancel_requested and self.stopping is not None:
            return self.stopping
        if job.status == "running" and job.pause_requested and self.pausing is not None:
            return self.pausing
        return self.statuses[job.status]

    def id_of(self, job: Job | str) -> str:
        """The resource's id of a job (or a job's id)."""
        return self.prefix + str(job.id if isinstance(job, Job) else job).replace("-", "")

    def job_id(self, value: str) -> str | None:
        """The job's id behind a resource id, None for anything else."""
        return uuid_after(self.prefix, value)

    def own(self, session: Session, project_id: str, value: str) -> Job:
        """The project's resource's job, else a 404."""
        job_id = self.job_id(value)
        job = session.get(Job, job_id) if job_id else None
        if job is None or job.project_id != project_id or self.tag not in (job.tags or []):
            raise Problem(404, "Not found", self.not_found)
        return job

    def newest_first(self, session: Session, project_id: str, after: str | None = None) -> Select[Job]:
        """The project's jobs of this resource, newest first, past the page that ended at `after` (a
        400 naming `after` where it is not an id of this resource)."""
        query = select(Job).where(Job.project_id == project_id, has_tag(session, self.tag))
        if after is not None:
            job_id = self.job_id(after)
            if job_id is None:
                detail = f"a {self.noun} id from a previous page ('{self.prefix}...')"
                raise Problem.at("query:/after", detail, title="Bad cursor", status=400)
            query = query.where(Job.id < job_id)
        return query.order_by(Job.id.desc())

    def page(self, session: Session, project_id: str, after: str | None, limit: int) -> tuple[list[Job], bool]:
        """Up to `limit` jobs past `after`, and whether more follow."""
        jobs = list(session.scalars(self.newest_first(session, project_id, after).limit(limit + 1)))
        return jobs[:limit], len(jobs) > limit


def listed(data: list[dict[str, Any]], has_more: bool, cursors: bool = True) -> dict[str, Any]:
    """OpenAI's list envelope (with `cursors`, the first and last ids of the page, as most lists have)."""
    if not cursors:
        return {"object": "list", "data": data, "has_more": has_more}
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more}
