"""/v1/scores: benchmark scores with their provenance."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from api.deps import CallerDep, SessionDep
from mathrl.schemas import Page, ScoreResponse
from store.models import BenchmarkScore

router = APIRouter(prefix="/v1/scores", tags=["scores"])


@router.get("", response_model=Page[ScoreResponse])
def list_scores(
    session: SessionDep,
    caller: CallerDep,
    model: str | None = Query(None, max_length=512, description="Exact model reference."),
    benchmark: str | None = Query(None, max_length=128),
    job_id: str | None = Query(None, max_length=36),
    metric: str | None = Query(None, max_length=64),
    limit: int = Query(200, ge=1, le=2000),
) -> dict[str, Any]:
    q = select(BenchmarkScore).where(BenchmarkScore.project_id == caller.project_id)
    if model:
        q = q.where(BenchmarkScore.model_ref == model)
    if benchmark:
        q = q.where(BenchmarkScore.benchmark == benchmark)
    if job_id:
        q = q.where(BenchmarkScore.job_id == job_id)
    if metric:
        q = q.where(BenchmarkScore.metric == metric)
    rows = list(session.scalars(q.order_by(BenchmarkScore.id.desc()).limit(limit)))
    return {"data": rows, "next_cursor": None}
