"""evals: OpenAI's evals (POST /v1/evals), each a schema for its items and the testing criteria its
runs are scored by; a run is an eval job tagged with the eval's id.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29 13:20:00
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


revision: str = '0016'
down_revision: Union[str, None] = '0015'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "evals",
        sa.Column("id", sa.String(48), primary_key=True),
        sa.Column("project_id", sa.String(36), sa.ForeignKey("projects.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("data_source_config", sa.JSON(), nullable=False),
        sa.Column("testing_criteria", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_evals_project_id_id", "evals", ["project_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_evals_project_id_id", table_name="evals")
    op.drop_table("evals")
