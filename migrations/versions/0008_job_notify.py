"""PostgreSQL: NOTIFY mathrl_job '<job id>' when a job gets an event or a metric point, or its
status changes. An API process LISTENs on one connection and wakes the event streams that
follow that job (api/job_wakeups.py), so an open stream waits instead of polling. Within one
transaction PostgreSQL delivers identical notifications once, so a batch of metric rows is one
wake-up. SQLite has no LISTEN: its streams keep polling.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 14:00:00
"""
from typing import Sequence, Union

from alembic import op


revision: str = '0008'
down_revision: Union[str, None] = '0007'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

CHANNEL = "mathrl_job"

UPGRADE = [
    f"""
    CREATE FUNCTION mathrl_notify_job_row() RETURNS trigger AS $$
    BEGIN
      PERFORM pg_notify('{CHANNEL}', NEW.job_id);
      RETURN NULL;
    END $$ LANGUAGE plpgsql
    """,
    f"""
    CREATE FUNCTION mathrl_notify_job_status() RETURNS trigger AS $$
    BEGIN
      PERFORM pg_notify('{CHANNEL}', NEW.id);
      RETURN NULL;
    END $$ LANGUAGE plpgsql
    """,
    "CREATE TRIGGER events_notify AFTER INSERT ON events FOR EACH ROW EXECUTE FUNCTION mathrl_notify_job_row()",
    "CREATE TRIGGER metrics_notify AFTER INSERT ON metrics FOR EACH ROW EXECUTE FUNCTION mathrl_notify_job_row()",
    """
    CREATE TRIGGER jobs_status_notify AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION mathrl_notify_job_status()
    """,
]

DOWNGRADE = [
    "DROP TRIGGER IF EXISTS jobs_status_notify ON jobs",
    "DROP TRIGGER IF EXISTS metrics_notify ON metrics",
    "DROP TRIGGER IF EXISTS events_notify ON events",
    "DROP FUNCTION IF EXISTS mathrl_notify_job_status()",
    "DROP FUNCTION IF EXISTS mathrl_notify_job_row()",
]


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in UPGRADE:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in DOWNGRADE:
            op.execute(statement)
