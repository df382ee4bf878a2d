"""/livez, /readyz and /metrics (Prometheus)."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from api.deps import SettingsDep
from api.problems import problem_response
from store.db import get_engine
from worker.celery_app import get_celery

router = APIRouter(tags=["health"])


@router.get("/livez")
def livez() -> dict[str, str]:
    """The process is up (no dependencies checked)."""
    return {"status": "ok"}


def _check_db(url: str) -> None:
    with get_engine(url).connect() as conn:
        conn.execute(text("SELECT 1"))


def _check_broker(url: str, visibility_timeout: int) -> None:
    with get_celery(url, visibility_timeout).connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)


@router.get("/readyz", response_model=None)
async def readyz(settings: SettingsDep) -> Response | dict[str, object]:
    """Ready when the database and the broker both answer."""
    checks: dict[str, str] = {}
    for name, fn, args in (
        ("database", _check_db, (settings.database.url,)),
        ("broker", _check_broker, (settings.broker.url, settings.broker.visibility_timeout)),
    ):
        try:
            with anyio.fail_after(5):
                await anyio.to_thread.run_sync(fn, *args)
            checks[name] = "ok"
        except Exception as exc:
            checks[name] = f"unavailable: {type(exc).__name__}"
    if all(v == "ok" for v in checks.values()):
        return {"status": "ok", "checks": checks}
    failing = ", ".join(f"{k} {v}" for k, v in checks.items() if v != "ok")
    return problem_response(
        503, "Service unavailable", f"not ready: {failing}", "/readyz", headers={"Retry-After": "5"}
    )


@router.get("/metrics", include_in_schema=False)
def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
