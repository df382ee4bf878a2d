"""The store's own rules (and the job sink's writes that rely on them), on PostgreSQL and SQLite alike."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from store.db import UNSTORABLE, session_scope
from store.jobs import add_event
from store.keys import get_or_create_project
from store.models import Event, Job

pytestmark = pytest.mark.quick


def test_json_columns_store_undefined_numbers_as_null(store_url: str) -> None:
    """A reward-model job with no held-out pairs reported pairwise_accuracy NaN in its 'scored'
    event: PostgreSQL refused the row (SQLite took it) and the job failed after training."""
    with session_scope(store_url) as s:
        project = get_or_create_project(s, "nan-check")
        job = Job(project_id=project.id, kind="eval", spec={"limit": math.inf})
        s.add(job)
        s.flush()
        add_event(s, job.id, "scored", data={"pairwise_accuracy": math.nan, "n": 0, "curve": [1.0, -math.inf]})
        job_id = job.id
    with session_scope(store_url) as s:
        event = s.query(Event).filter_by(job_id=job_id, type="scored").one()
        assert event.data == {"pairwise_accuracy": None, "n": 0, "curve": [1.0, None]}
        assert s.get(Job, job_id).spec == {"limit": None}  # type: ignore[union-attr]


def test_a_rerun_attempt_replaces_its_scores(store_url: str) -> None:
    """Issue 16.7: a job re-run after a lost worker wrote its benchmark scores a second time."""
    from sqlalchemy import select

    from store.models import BenchmarkScore
    from worker.sink import DatabaseSink

    with session_scope(store_url) as s:
        project = get_or_create_project(s, "rerun-scores")
        job = Job(project_id=project.id, kind="eval", spec={})
        s.add(job)
        s.flush()
        job_id, project_id = job.id, project.id
    record = {
        "model_ref": "org/m",
        "checkpoint": None,
        "benchmark": "gsm8k",
        "benchmark_version": "1.0",
        "n": 10,
        "sampling": {},
        "backend": "hf",
        "backend_version": "t",
        "prompt_hash": None,
        "seed": 0,
    }
    for value in (0.3, 0.4):  # the same job, two attempts
        sink = DatabaseSink(store_url, job_id, project_id)
        sink.score({**record, "metric": "accuracy", "value": value, "ci_low": None, "ci_high": None})
        sink.score({**record, "metric": "pass@1", "value": value, "ci_low": None, "ci_high": None})
    with session_scope(store_url) as s:
        rows = s.scalars(select(BenchmarkScore).where(BenchmarkScore.job_id == job_id)).all()
        assert sorted((r.metric, r.value) for r in rows) == [("accuracy", 0.4), ("pass@1", 0.4)]


def test_tag_filter_runs_in_sql(store_url: str) -> None:
    """Issue 16.9: tags were filtered in Python over 20 pages' worth of rows, so a page with no
    match there ended the listing early. has_tag is a WHERE clause on both databases."""
    from sqlalchemy import select

    from store.jobs import has_tag

    with session_scope(store_url) as s:
        project = get_or_create_project(s, "tags")
        s.add_all(
            [
                Job(project_id=project.id, kind="eval", spec={}, tags=tags)
                for tags in (["a"], [], ["b", "a"], ["ab"], ["A"])
            ]
        )
    with session_scope(store_url) as s:
        found = s.scalars(select(Job.tags).where(Job.project_id == project.id, has_tag(s, "a"))).all()
        assert sorted(map(tuple, found)) == [("a",), ("b", "a")]


# The suite's PostgreSQL database is shared with the service fixture, whose workers reconcile
# every second: jobs here sit on a queue no worker serves, and running ones hold a live lease.
PARKED_QUEUE = "store-tests"


def _lease() -> object:
    from datetime import timedelta

    from store.models import utcnow

    return utcnow() + timedelta(hours=1)


def _job(store_url: str, **fields: object) -> str:
    with session_scope(store_url) as s:
        project = get_or_create_project(s, "state")
        job = Job(project_id=project.id, kind="eval", spec={}, tags=[], queue=PARKED_QUEUE, **fields)
        s.add(job)
        s.flush()
        return job.id


@pytest.mark.parametrize(
    ("read_as", "moved_to", "moved"),
    [
        # issue 16.5: read as waiting, queued by its pipeline meanwhile: the cancel was lost
        ("waiting", "queued", {}),
        # issue 16.5: read as running, re-queued after a lost lease meanwhile: left queued with
        # cancel_requested set, which nothing claims or sends again (and the quota counted it)
        ("running", "queued", {"lease_owner": None, "lease_expires_at": None}),
    ],
)
def test_cancel_acts_on_the_state_the_job_is_in_now(
    store_url: str, read_as: str, moved_to: str, moved: dict[str, object]
) -> None:
    from store.jobs import request_cancel

    job_id = _job(
        store_url,
        status=read_as,
        lease_owner="w1" if read_as == "running" else None,
        lease_expires_at=_lease() if read_as == "running" else None,
    )
    with session_scope(store_url) as api:
        job = api.get(Job, job_id)
        assert job is not None and job.status == read_as
        api.commit()  # the route read it; then, before its cancel, another process moves it
        with session_scope(store_url) as other:
            row = other.get(Job, job_id)
            assert row is not None
            row.status = moved_to
            for k, v in moved.items():
                setattr(row, k, v)
        request_cancel(api, job)
    with session_scope(store_url) as s:
        row = s.get(Job, job_id)
        assert row is not None and row.status == "cancelled" and row.finished_at is not None, (row.status,)
        assert [e.type for e in s.query(Event).filter_by(job_id=job_id)] == ["cancelled"]


def test_cancel_of_an_ended_job_changes_nothing(store_url: str) -> None:
    from store.jobs import request_cancel

    job_id = _job(store_url, status="succeeded")
    with session_scope(store_url) as s:
        job = s.get(Job, job_id)
        assert job is not None
        assert request_cancel(s, job).status == "succeeded" and not job.cancel_requested


def test_finish_and_cancel_in_one_pipeline_do_not_deadlock(pg_url: str) -> None:
    """Issue 16.5: finishing a pipeline job locked its row, then the pipeline's (to settle the
    jobs waiting on it); cancelling a waiting job of the same pipeline locked that job, then the
    pipeline: PostgreSQL found the cycle and aborted one. Both now lock the pipeline first."""
    import threading

    from sqlalchemy import create_engine, select

    from store.jobs import finish, request_cancel
    from store.models import Pipeline

    with session_scope(pg_url) as s:
        project = get_or_create_project(s, "locks")
        pipe = Pipeline(project_id=project.id, name="p", tags=[], spec={})
        s.add(pipe)
        s.flush()
        up = Job(
            project_id=project.id,
            kind="eval",
            spec={},
            tags=[],
            status="running",
            lease_owner="w1",
            lease_expires_at=_lease(),
            pipeline_id=pipe.id,
            pipeline_step="up",
            queue=PARKED_QUEUE,
        )
        s.add(up)
        s.flush()
        down = Job(
            project_id=project.id,
            kind="eval",
            spec={},
            tags=[],
            status="waiting",
            pipeline_id=pipe.id,
            pipeline_step="down",
            depends_on=[up.id],
            queue=PARKED_QUEUE,
        )
        s.add(down)
        s.flush()
        pipe_id, up_id, down_id = pipe.id, up.id, down.id

    holder = create_engine(pg_url).connect()  # holds the pipeline's lock until both have queued on it
    holder.execute(select(Pipeline.id).where(Pipeline.id == pipe_id).with_for_update())
    errors: list[BaseException] = []

    def run(fn: object) -> None:
        try:
            with session_scope(pg_url) as s:
                fn(s)  # type: ignore[operator]
        except BaseException as exc:
            errors.append(exc)

    def cancel_down(s: object) -> None:
        job = s.get(Job, down_id)  # type: ignore[attr-defined]
        request_cancel(s, job)  # type: ignore[arg-type]

    threads = [
        threading.Thread(target=run, args=(lambda s: finish(s, up_id, "w1", "succeeded"),)),
        threading.Thread(target=run, args=(cancel_down,)),
    ]
    for t in threads:
        t.start()
    import time

    time.sleep(1.0)  # both wait on the holder now (before: each also held its own job's row)
    holder.rollback()
    holder.close()
    for t in threads:
        t.join(30)
    assert not errors, errors
    with session_scope(pg_url) as s:
        assert s.get(Job, up_id).status == "succeeded"  # type: ignore[union-attr]
        assert s.get(Job, down_id).status == "cancelled"  # type: ignore[union-attr]


def _requeue_and_claim(store_url: str, job_id: str, owner: str) -> None:
    """What happens to a job whose worker was cut off: the lease lapses, a reconciler puts the
    job back in the queue, another worker claims it (attempt 2)."""
    from datetime import timedelta

    from store.jobs import claim, reconcile
    from store.models import utcnow

    with session_scope(store_url) as s:
        row = s.get(Job, job_id)
        assert row is not None
        row.lease_expires_at = utcnow() - timedelta(seconds=1)
    with session_scope(store_url) as s:
        reconcile(s, redeliver_after_seconds=3600)
    with session_scope(store_url) as s:
        assert claim(s, job_id, owner, 3600) is not None


def test_a_process_that_lost_its_lease_has_every_write_refused(store_url: str, tmp_path: Path) -> None:
    """Issue 16.4: a worker cut off from the database kept its job process running; once its
    lease lapsed another worker ran the job too, and both wrote into the same job (and its
    directory). Every write of a job process is fenced by (owner, attempt): the stale one's
    are refused, counted, and its checkpoint never replaces the owner's."""
    from sqlalchemy import func, select

    from store.models import Checkpoint, Metric
    from worker.sink import DatabaseSink, Fence, LeaseLost

    job_id = _job(store_url, status="running", lease_owner="w1", lease_expires_at=_lease(), attempts=1)
    with session_scope(store_url) as s:
        project_id = s.get(Job, job_id).project_id  # type: ignore[union-attr]
    rejected = tmp_path / "rejected-writes.log"
    stale = DatabaseSink(store_url, job_id, project_id, cancel_poll_seconds=0, fence=Fence("w1", 1, rejected))
    stale.event("started", "attempt 1")  # owned: written
    stale.metrics(1, {"loss": 1.0})
    stale.flush()

    _requeue_and_claim(store_url, job_id, "w2")
    owner = DatabaseSink(store_url, job_id, project_id, fence=Fence("w2", 2))
    owners_ckpt = tmp_path / "job" / "train" / "checkpoint-4"
    (tmp_path / "a2" / "checkpoint-4").mkdir(parents=True)
    (tmp_path / "a2" / "checkpoint-4" / "who").write_text("attempt 2")
    owner.checkpoint(4, str(owners_ckpt), source=str(tmp_path / "a2" / "checkpoint-4"))
    assert (owners_ckpt / "who").read_text() == "attempt 2"

    (tmp_path / "a1" / "checkpoint-4").mkdir(parents=True)
    (tmp_path / "a1" / "checkpoint-4" / "who").write_text("attempt 1")
    with pytest.raises(LeaseLost):
        stale.checkpoint(4, str(owners_ckpt), source=str(tmp_path / "a1" / "checkpoint-4"))
    with pytest.raises(LeaseLost):
        stale.event("progress", "5/10")
    stale.metrics(5, {"loss": 0.5})  # queued; its writer finds the lease lost
    with pytest.raises(LeaseLost):
        stale.flush()
    assert stale.lost and stale.should_stop()
    assert stale.rejected == 3 and len(rejected.read_text().splitlines()) == 3
    assert (owners_ckpt / "who").read_text() == "attempt 2"  # not replaced by the stale attempt
    with session_scope(store_url) as s:
        ckpt = s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id)).one()
        assert ckpt.data == {"attempt": 2}
        assert s.scalar(select(func.count()).select_from(Metric).where(Metric.job_id == job_id)) == 1
        assert sorted(e.type for e in s.query(Event).filter_by(job_id=job_id)) == [
            "checkpoint",
            "claimed",
            "requeued",
            "started",
        ]  # none of the stale attempt's after it lost


def test_a_stale_process_learns_it_lost_the_job_without_writing(store_url: str) -> None:
    """The stop request poll sees a lost lease too: a process that only reads stops as well."""
    from worker.sink import DatabaseSink, Fence

    job_id = _job(store_url, status="running", lease_owner="w1", lease_expires_at=_lease(), attempts=1)
    with session_scope(store_url) as s:
        project_id = s.get(Job, job_id).project_id  # type: ignore[union-attr]
    sink = DatabaseSink(store_url, job_id, project_id, cancel_poll_seconds=0, fence=Fence("w1", 1))
    assert not sink.should_stop()
    _requeue_and_claim(store_url, job_id, "w2")
    assert sink.should_stop() and sink.lost


def test_the_fence_holds_the_job_until_the_write_commits(pg_url: str) -> None:
    """While a fenced write is in its transaction the reconciler cannot re-queue the job (it
    skips the locked row and takes it on a later round), so a write checked as the owner's
    commits as the owner's."""
    from datetime import timedelta

    from store.jobs import holds_lease, reconcile
    from store.models import utcnow

    job_id = _job(
        pg_url, status="running", lease_owner="w1", attempts=1, lease_expires_at=utcnow() - timedelta(seconds=1)
    )  # lapsed, not yet re-queued
    with session_scope(pg_url) as writer:
        assert holds_lease(writer, job_id, "w1", 1)
        assert not holds_lease(writer, job_id, "w1", 2) and not holds_lease(writer, job_id, "w2", 1)
        with session_scope(pg_url) as s:
            reconcile(s, redeliver_after_seconds=3600)
        with session_scope(pg_url) as s:
            assert s.get(Job, job_id).status == "running"  # type: ignore[union-attr]
        add_event(writer, job_id, "metric-write")
    with session_scope(pg_url) as s:
        reconcile(s, redeliver_after_seconds=3600)
    with session_scope(pg_url) as s:
        assert s.get(Job, job_id).status == "queued"  # type: ignore[union-attr]
        assert s.query(Event).filter_by(job_id=job_id, type="metric-write").count() == 1


def test_the_store_refuses_a_status_move_mathrl_status_does_not_allow(store_url: str) -> None:
    """Issue 20.4: the TRANSITIONS table was documentation; now it is what the store enforces,
    on ORM sets (the reconciler, pipeline settling) and on bulk UPDATEs (store.jobs.move)."""
    from mathrl.status import STATUSES, TERMINAL, TRANSITIONS, IllegalTransition
    from store.jobs import move

    job_id = _job(store_url, status="succeeded")
    with session_scope(store_url) as s:
        job = s.get(Job, job_id)
        assert job is not None
        with pytest.raises(IllegalTransition, match="from succeeded to running"):
            job.status = "running"
        with pytest.raises(IllegalTransition, match="not a job status"):
            job.status = "suspended"
        with pytest.raises(IllegalTransition, match="from succeeded to paused"):
            job.status = "paused"
        job.status = "succeeded"  # staying put is not a move
    with pytest.raises(IllegalTransition, match="from failed to queued"):
        move(("running", "failed"), "queued")
    assert set(STATUSES) == set(TRANSITIONS) and TERMINAL == {"succeeded", "failed", "cancelled"}
    for before, after in TRANSITIONS.items():  # the allowed moves pass on both paths
        for status in after:
            move(before, status)


def test_the_projects_active_counters_follow_every_move_of_its_jobs(store_url: str) -> None:
    """The quota check reads Project.active_jobs/active_gpus (issue 18: O(1) per submit); the
    jobs table's triggers keep them, whichever path moves a job: inserts, claims, finishes, a
    drain's hand-back, cancels, bulk moves, deletes. Checked against a recount after each."""
    from sqlalchemy import delete, func, select

    from mathrl.status import ACTIVE
    from store.jobs import claim, finish, hand_back, move, request_cancel
    from store.models import Project

    def check(project_id: str) -> tuple[int, int]:
        with session_scope(store_url) as s:
            kept = s.execute(select(Project.active_jobs, Project.active_gpus).where(Project.id == project_id)).one()
            jobs = s.scalars(select(Job).where(Job.project_id == project_id, Job.status.in_(ACTIVE))).all()
            recount = (len(jobs), sum(j.spec.get("resources", {}).get("gpus", 0) for j in jobs))
            assert tuple(kept) == recount
            return recount

    with session_scope(store_url) as s:
        project = get_or_create_project(s, "usage-counters")
        other = get_or_create_project(s, "usage-counters-other")
        ids = []
        for gpus, status in [(2, "queued"), (1, "queued"), (0, "waiting"), (4, "queued"), (8, "succeeded")]:
            # parked: a worker of the suite's services on this database would claim a queued one
            job = Job(
                project_id=project.id, kind="sft", spec={"resources": {"gpus": gpus}}, status=status, queue=PARKED_QUEUE
            )
            s.add(job)
            s.flush()
            ids.append(job.id)
        s.add(
            Job(project_id=other.id, kind="eval", spec={"resources": {"gpus": 1}}, status="queued", queue=PARKED_QUEUE)
        )
        pid, oid = project.id, other.id
    assert check(pid) == (4, 7) and check(oid) == (1, 1)
    with session_scope(store_url) as s:
        assert claim(s, ids[0], "w1", 60) is not None  # queued -> running: still active
    assert check(pid) == (4, 7)
    with session_scope(store_url) as s:
        assert hand_back(s, ids[0], "w1", "drained") == "queued"
        assert claim(s, ids[0], "w2", 60) is not None
        assert finish(s, ids[0], "w2", "succeeded")
    assert check(pid) == (3, 5)
    with session_scope(store_url) as s:
        request_cancel(s, s.get(Job, ids[1]))  # queued -> cancelled
        assert claim(s, ids[3], "w3", 60) is not None
        request_cancel(s, s.get(Job, ids[3]))  # running: only asked to stop
    assert check(pid) == (2, 4)
    with session_scope(store_url) as s:
        s.execute(move(("waiting", "queued"), "failed").where(Job.id == ids[2]))  # a bulk move
        s.get(Job, ids[3]).status = "failed"  # an ORM attribute set
    assert check(pid) == (0, 0)
    with session_scope(store_url) as s:
        s.add(Job(project_id=pid, kind="sft", spec={"resources": {"gpus": 3}}, status="queued", queue=PARKED_QUEUE))
    assert check(pid) == (1, 3)
    with session_scope(store_url) as s:
        s.execute(delete(Job).where(Job.project_id == pid))
        assert s.scalar(select(func.count()).select_from(Job).where(Job.project_id == pid)) == 0
    assert check(pid) == (0, 0) and check(oid) == (1, 1)


def test_a_stored_time_in_another_zone_is_compared_as_the_instant_it_is() -> None:
    """PostgreSQL gives a timestamptz back in the connection's time zone: replacing its tzinfo with UTC,
    as the key and file expiry checks did, shifted it by the zone's offset (a key or file alive for
    another hour read as expired an hour ago where the zone is UTC-5). SQLite gives it back naive."""
    from datetime import UTC, timedelta, timezone
    from types import SimpleNamespace

    from store.files import expired
    from store.models import as_utc, utcnow

    in_an_hour = (utcnow() + timedelta(hours=1)).astimezone(timezone(timedelta(hours=-5)))
    assert as_utc(in_an_hour) == in_an_hour and not expired(SimpleNamespace(expires_at=in_an_hour))  # type: ignore[arg-type]
    an_hour_ago = (utcnow() - timedelta(hours=1)).replace(tzinfo=None)  # SQLite's: naive, in UTC
    assert as_utc(an_hour_ago).tzinfo is UTC and expired(SimpleNamespace(expires_at=an_hour_ago))  # type: ignore[arg-type]


def test_a_key_minted_while_its_parent_is_revoked_is_revoked_with_it(store_url: str) -> None:
    """Issue 66.1: children minted by key P while `DELETE /v1/keys/<P>` ran outlived the revocation
    (25 of 187 in 25 rounds, on PostgreSQL): the mint read P live, the revocation read P's subtree
    before the child was committed, and each committed. Now the mint holds P's row (hold_live) from
    before its insert to its commit, and the revocation's first update waits for it: the child is
    committed first and revoked with P. Before (the mint's is_live() read in place of the hold),
    the revocation did not wait and the child stayed live."""
    import threading
    import time

    from store.db import get_sessionmaker
    from store.keys import create_key, hold_live, live_key_count, revoke
    from store.models import ApiKey

    with session_scope(store_url) as s:
        project = get_or_create_project(s, f"race-{time.monotonic_ns()}")
        parent, _ = create_key(s, project, "P")
        project_id, parent_id = project.id, parent.id
    mint = get_sessionmaker(store_url)()
    try:
        live_key_count(mint, project_id)  # the route's order: the project's count, then the parent
        assert hold_live(mint, parent_id)
        child, _ = create_key(mint, mint.get(type(project), project_id), "C", parent_id=parent_id)  # type: ignore[arg-type]
        revoked: list[list[str] | None] = []

        def revoke_parent() -> None:
            with session_scope(store_url) as s:
                revoked.append(revoke(s, project_id, parent_id))

        racer = threading.Thread(target=revoke_parent)
        racer.start()
        time.sleep(1.0)
        assert racer.is_alive(), "the revocation did not wait for the mint below its key"
        mint.commit()
    finally:
        mint.close()
    racer.join(30)
    assert not racer.is_alive() and revoked and revoked[0] is not None
    with session_scope(store_url) as s:
        assert s.get(ApiKey, child.id).revoked_at is not None  # type: ignore[union-attr]
        fresh = get_sessionmaker(store_url)()
        try:  # and a mint after the revocation reads its parent revoked
            assert not hold_live(fresh, parent_id)
        finally:
            fresh.rollback()
            fresh.close()


def test_the_stores_nul_check_holds_for_what_a_job_writes_and_its_error_has_no_sql(store_url: str) -> None:
    """Issue 66.3: a sample whose prompt held a NUL (from an uploaded file) reached PostgreSQL from the
    job's sink, which writes with statements of its own (no ORM flush, where the check was): the job
    failed after all its work, its error the raw INSERT with its parameters. Now the store's check is
    on every statement's parameters, and the error says where in words."""
    from store.db import error_text
    from store.models import Sample
    from worker.sink import DatabaseSink

    job_id = _job(store_url)
    with session_scope(store_url) as s:
        project_id = s.get(Job, job_id).project_id  # type: ignore[union-attr]
    sink = DatabaseSink(store_url, job_id, project_id, cancel_poll_seconds=0)
    sink.samples(0, [{"prompt": "1+1?", "completion": "2"}, {"prompt": "2+2?\x00", "completion": "4"}])
    with pytest.raises(RuntimeError) as e:
        sink.flush()
    said = f"{type(e.value).__name__}: {error_text(e.value)}"
    assert said == "RuntimeError: writing to the database failed: /prompt: " + UNSTORABLE, said
    with session_scope(store_url) as s:
        assert s.query(Sample).filter(Sample.job_id == job_id).count() == 0  # the write is one transaction


def test_a_database_errors_text_leaves_out_the_statement_and_its_parameters(store_url: str) -> None:
    from sqlalchemy import text

    from store.db import error_text

    with pytest.raises(Exception) as e, session_scope(store_url) as s:
        s.execute(text("INSERT INTO no_such_table (secret) VALUES (:v)"), {"v": "another-rows-value"})
    assert "[SQL:" in str(e.value) and "another-rows-value" in str(e.value)  # what SQLAlchemy says
    said = error_text(e.value)
    assert "no_such_table" in said and "INSERT" not in said and "another-rows-value" not in said, said
    assert "sqlalche.me" not in said, said
