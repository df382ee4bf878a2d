"""benchmark scores: one row per job, model, benchmark and metric (a re-run attempt replaces it)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 10:10:00
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0003'
down_revision: Union[str, None] = '0002'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # Re-run attempts wrote their scores again: keep the newest row of each key (ids are uuid7,
    # ordered by time), then forbid the duplicates.
    op.execute(sa.text(
        "DELETE FROM benchmark_scores WHERE id NOT IN ("
        " SELECT MAX(id) FROM benchmark_scores GROUP BY job_id, model_ref, benchmark, metric)"
    ))
    with op.batch_alter_table('benchmark_scores', schema=None) as batch_op:
        batch_op.create_unique_constraint('uq_scores_natural_key', ['job_id', 'model_ref', 'benchmark', 'metric'])


def downgrade() -> None:
    with op.batch_alter_table('benchmark_scores', schema=None) as batch_op:
        batch_op.drop_constraint('uq_scores_natural_key', type_='unique')
