"""Uploaded files (POST /v1/files): one row per file, its bytes under the artifact directory.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 02:15:00
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


revision: str = '0009'
down_revision: Union[str, None] = '0008'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(48), primary_key=True),
        sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id", ondelete="CASCADE"), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("path", sa.String(2048), nullable=False),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_files_project_id_id", "files", ["project_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_files_project_id_id", table_name="files")
    op.drop_table("files")
