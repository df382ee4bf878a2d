"""endpoints: where a running session job serves its client's calls (the Tinker API's training
and sampling clients), read by the API to forward them.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 15:00:00
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


revision: str = '0013'
down_revision: Union[str, None] = '0012'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "endpoints",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("url", sa.String(length=300), nullable=False),
        sa.Column("token", sa.String(length=100), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id"),
    )


def downgrade() -> None:
    op.drop_table("endpoints")
