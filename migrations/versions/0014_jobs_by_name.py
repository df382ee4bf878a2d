"""jobs by name within a project: the Tinker API finds a session job by its model id (the job's
name) on every forwarded call, which scanned the project's jobs without this index.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 18:10:00
"""
from typing import Sequence, Union

from alembic import op


revision: str = '0014'
down_revision: Union[str, None] = '0013'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_index("ix_jobs_project_id_name", "jobs", ["project_id", "name"])


def downgrade() -> None:
    op.drop_index("ix_jobs_project_id_name", table_name="jobs")
