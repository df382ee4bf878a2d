"""projects: active_jobs and active_gpus counters; jobs: gpus. The quota check at submit reads
the project's row (O(1)) instead of scanning its active jobs. The counters are kept by triggers
on jobs, in the same transaction as every insert, delete and status change, whichever code
(or hand-written SQL) makes it.

A trigger only touches the project row when a job enters or leaves an active status (waiting,
queued, running) or changes its gpus: queued -> running and a drain's running -> queued take no
lock on the project.

SQLite: a later migration that rebuilds the jobs table (batch mode "move and copy") drops these
triggers and must create them again (tests/unit/store/test_store.py checks the counters at head).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 23:00:00
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0007'
down_revision: Union[str, None] = '0006'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

ACTIVE = "('waiting', 'queued', 'running')"

POSTGRES = [
    f"""
    CREATE FUNCTION mathrl_project_usage() RETURNS trigger AS $$
    BEGIN
      IF TG_OP = 'UPDATE' AND (OLD.status IN {ACTIVE}) = (NEW.status IN {ACTIVE})
         AND OLD.gpus = NEW.gpus AND OLD.project_id = NEW.project_id THEN
        RETURN NULL;  -- active before and after, same GPUs: nothing to count, no lock taken
      END IF;
      IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.status IN {ACTIVE} THEN
        UPDATE projects SET active_jobs = active_jobs - 1, active_gpus = active_gpus - OLD.gpus
         WHERE id = OLD.project_id;
      END IF;
      IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.status IN {ACTIVE} THEN
        UPDATE projects SET active_jobs = active_jobs + 1, active_gpus = active_gpus + NEW.gpus
         WHERE id = NEW.project_id;
      END IF;
      RETURN NULL;
    END $$ LANGUAGE plpgsql
    """,
    """
    CREATE TRIGGER jobs_project_usage AFTER INSERT OR DELETE OR UPDATE OF status, gpus, project_id
    ON jobs FOR EACH ROW EXECUTE FUNCTION mathrl_project_usage()
    """,
]

SQLITE = [
    f"""
    CREATE TRIGGER jobs_usage_insert AFTER INSERT ON jobs WHEN NEW.status IN {ACTIVE}
    BEGIN
      UPDATE projects SET active_jobs = active_jobs + 1, active_gpus = active_gpus + NEW.gpus
       WHERE id = NEW.project_id;
    END
    """,
    f"""
    CREATE TRIGGER jobs_usage_delete AFTER DELETE ON jobs WHEN OLD.status IN {ACTIVE}
    BEGIN
      UPDATE projects SET active_jobs = active_jobs - 1, active_gpus = active_gpus - OLD.gpus
       WHERE id = OLD.project_id;
    END
    """,
    f"""
    CREATE TRIGGER jobs_usage_update AFTER UPDATE OF status, gpus, project_id ON jobs
    WHEN (OLD.status IN {ACTIVE}) != (NEW.status IN {ACTIVE})
      OR (OLD.status IN {ACTIVE} AND (OLD.gpus != NEW.gpus OR OLD.project_id != NEW.project_id))
    BEGIN
      UPDATE projects SET active_jobs = active_jobs - 1, active_gpus = active_gpus - OLD.gpus
       WHERE id = OLD.project_id AND OLD.status IN {ACTIVE};
      UPDATE projects SET active_jobs = active_jobs + 1, active_gpus = active_gpus + NEW.gpus
       WHERE id = NEW.project_id AND NEW.status IN {ACTIVE};
    END
    """,
]


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    with op.batch_alter_table('projects', schema=None) as batch_op:
        batch_op.add_column(sa.Column('active_jobs', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('active_gpus', sa.Integer(), server_default='0', nullable=False))
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('gpus', sa.Integer(), server_default='0', nullable=False))
    gpus = (
        "COALESCE((spec -> 'resources' ->> 'gpus')::int, 0)"
        if postgres
        else "COALESCE(CAST(json_extract(spec, '$.resources.gpus') AS INTEGER), 0)"
    )
    op.execute(f"UPDATE jobs SET gpus = {gpus}")
    op.execute(
        f"""
        UPDATE projects SET
          active_jobs = (SELECT count(*) FROM jobs WHERE jobs.project_id = projects.id AND jobs.status IN {ACTIVE}),
          active_gpus = (SELECT COALESCE(sum(gpus), 0) FROM jobs
                          WHERE jobs.project_id = projects.id AND jobs.status IN {ACTIVE})
        """
    )
    for statement in POSTGRES if postgres else SQLITE:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER jobs_project_usage ON jobs")
        op.execute("DROP FUNCTION mathrl_project_usage()")
    else:
        for name in ("jobs_usage_insert", "jobs_usage_delete", "jobs_usage_update"):
            op.execute(f"DROP TRIGGER {name}")
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('gpus')
    with op.batch_alter_table('projects', schema=None) as batch_op:
        batch_op.drop_column('active_gpus')
        batch_op.drop_column('active_jobs')
