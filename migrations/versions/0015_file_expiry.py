"""files that expire: OpenAI's `expires_after` on an upload (POST /v1/files) sets when the file goes;
the workers' reconciler deletes it then, once no job that reads it is left.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29 09:30:00
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


revision: str = '0015'
down_revision: Union[str, None] = '0014'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_files_expires_at", "files", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_files_expires_at", table_name="files")
    with op.batch_alter_table("files") as batch:
        batch.drop_column("expires_at")
