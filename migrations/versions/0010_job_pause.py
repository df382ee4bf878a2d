"""jobs.pause_requested: a pause asked of a running job (store.jobs.request_pause). The new status
'paused' needs no schema change: statuses are strings checked by mathrl/status.py, and the usage
counters' triggers (0007) count only waiting, queued and running, so a paused job holds no quota.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 03:00:00
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


revision: str = '0010'
down_revision: Union[str, None] = '0009'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


# a plain ALTER TABLE on both databases: SQLite's batch mode would rebuild the table and drop the
# usage counters' triggers (0007)
def upgrade() -> None:
    op.add_column("jobs", sa.Column("pause_requested", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.execute("ALTER TABLE jobs DROP COLUMN pause_requested")
