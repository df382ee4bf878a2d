"""A job's status and the moves between them: the one definition (STATUSES, TRANSITIONS, TERMINAL,
ACTIVE, WAIT_ENDS, `check_move`). The SDK types responses with it, the store enforces it on every
status change (store.jobs.move, and the Job model's status validator), and the status pages get it
from the page shell (api/web/router.py).

waiting moves to queued, failed or cancelled (pipeline jobs); queued to running, paused, failed or
cancelled; running to succeeded, failed, cancelled, back to queued (a lapsed lease, a drain) or to
paused; paused to queued or cancelled. A paused job holds no quota (it is not ACTIVE) and nothing
claims it until it is resumed. The graph with each move's cause: docs/how-jobs-run.md."""

from __future__ import annotations

from typing import Literal, get_args

from mathrl.errors import IllegalTransition as IllegalTransition  # raised here; its callers import it from here

JobStatus = Literal["waiting", "queued", "running", "paused", "succeeded", "failed", "cancelled"]
STATUSES: tuple[str, ...] = get_args(JobStatus)

TRANSITIONS: dict[str, frozenset[str]] = {
    "waiting": frozenset({"queued", "cancelled", "failed"}),
    "queued": frozenset({"running", "cancelled", "failed", "paused"}),
    "running": frozenset({"succeeded", "failed", "cancelled", "queued", "paused"}),
    "paused": frozenset({"queued", "cancelled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}
TERMINAL: frozenset[str] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
NOT_STARTED: tuple[str, ...] = ("waiting", "queued")
ACTIVE: tuple[str, ...] = ("waiting", "queued", "running")  # what counts against a project's quota
# where a caller that waits on a job's answer (a completion, a grader run, a session's start) stops
# waiting: the job ended, or it was paused, which frees its quota, so a wait on it would hold the
# API's threads and database connections outside every quota
WAIT_ENDS: frozenset[str] = TERMINAL | {"paused"}

assert set(TRANSITIONS) == set(STATUSES), "every status has its row of moves"


def check_move(before: str | None, after: str) -> None:
    """Raise IllegalTransition unless a job may go from `before` to `after` (None: a row being
    created, which may hold any status; staying in a status is not a move)."""
    if after not in TRANSITIONS:
        raise IllegalTransition(f"{after!r} is not a job status: {', '.join(STATUSES)}")
    if before is not None and after != before and after not in TRANSITIONS.get(before, frozenset()):
        raise IllegalTransition(f"a job cannot go from {before} to {after}")


def as_json() -> dict[str, object]:
    """For the status pages: the statuses in order, the terminal ones, the moves."""
    return {
        "statuses": list(STATUSES),
        "terminal": sorted(TERMINAL),
        "transitions": {s: sorted(n) for s, n in TRANSITIONS.items()},
    }
