"""Two creates with one Idempotency-Key that race past the key check (api/idempotency.py
commit_or_replay): the second's insert meets the unique key, and it answers with the first's row as a
replay, or a 409 where its request differs. On PostgreSQL and SQLite (`store_url`)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.quick


def _eval(project_id: str, key: str, digest: str) -> object:
    from store.models import Eval

    return Eval(
        id=f"eval_{digest[:8]}{key}",
        project_id=project_id,
        name="e",
        data_source_config={},
        testing_criteria=[],
        idempotency_key=key,
        request_hash=digest,
    )


def test_the_create_that_loses_the_race_answers_with_the_winners_row(store_url: str) -> None:
    from fastapi import Response

    from api.idempotency import commit_or_replay
    from api.problems import Problem
    from store.db import session_scope
    from store.keys import get_or_create_project
    from store.models import Eval

    with session_scope(store_url) as first, session_scope(store_url) as second:
        project = get_or_create_project(first, "race")
        first.commit()
        # both checked the key (none yet); the first stores its row, then the second tries its own
        winner = _eval(project.id, "k1", "a" * 64)
        first.add(winner)
        assert commit_or_replay(first, winner, Response()) == (winner, False)
        loser, response = _eval(project.id, "k1", "b" * 8 + "a" * 56), Response()
        loser.request_hash = "a" * 64  # the same request: a retry
        second.add(loser)
        stored, replay = commit_or_replay(second, loser, response)
        assert replay and isinstance(stored, Eval) and stored.id == winner.id
        assert (response.status_code, response.headers["Idempotent-Replayed"]) == (200, "true")
        other = _eval(project.id, "k1", "c" * 64)  # the same key with another request
        second.add(other)
        with pytest.raises(Problem) as conflict:
            commit_or_replay(second, other, Response())
        assert conflict.value.status == 409
        assert [e.id for e in second.query(Eval).filter(Eval.project_id == project.id)] == [winner.id]
