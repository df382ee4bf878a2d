"""files and pipelines carry the Idempotency-Key that created them (api/idempotency.py), as jobs
do since 0001: a retried upload or pipeline create returns the first one's object.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 00:20:00
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


revision: str = '0012'
down_revision: Union[str, None] = '0011'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

TABLES = ("files", "pipelines")


# plain ALTER TABLE and a unique index (not a constraint): SQLite's batch mode would rebuild the tables
def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("idempotency_key", sa.String(length=200), nullable=True))
        op.add_column(table, sa.Column("request_hash", sa.String(length=64), nullable=True))
        op.create_index(f"uq_{table}_project_idempotency", table, ["project_id", "idempotency_key"], unique=True)


def downgrade() -> None:
    for table in TABLES:
        op.drop_index(f"uq_{table}_project_idempotency", table_name=table)
        op.execute(f"ALTER TABLE {table} DROP COLUMN request_hash")
        op.execute(f"ALTER TABLE {table} DROP COLUMN idempotency_key")
