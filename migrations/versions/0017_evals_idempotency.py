"""evals_idempotency: an eval's create is replayed by its Idempotency-Key (or the openai SDK's own
retry), as jobs', files' and pipelines' are (api/idempotency.py).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29 16:50:00
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


revision: str = '0017'
down_revision: Union[str, None] = '0016'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("evals") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(200), nullable=True))
        batch.add_column(sa.Column("request_hash", sa.String(64), nullable=True))
    op.create_index("uq_evals_project_idempotency", "evals", ["project_id", "idempotency_key"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_evals_project_idempotency", table_name="evals")
    with op.batch_alter_table("evals") as batch:
        batch.drop_column("request_hash")
        batch.drop_column("idempotency_key")
