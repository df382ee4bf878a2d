"""benchmark scores: the prompt recipe they were made with (its name and resolved fields)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 16:20:00
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0005'
down_revision: Union[str, None] = '0004'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('benchmark_scores', schema=None) as batch_op:
        batch_op.add_column(sa.Column('recipe', sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column('recipe_config', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('benchmark_scores', schema=None) as batch_op:
        batch_op.drop_column('recipe_config')
        batch_op.drop_column('recipe')
