"""pipelines: named job specs submitted together; jobs wait for the jobs they depend on

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 13:40:00
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0002'
down_revision: Union[str, None] = '0001'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('pipelines',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('project_id', sa.String(length=36), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=True),
    sa.Column('tags', sa.JSON(), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('pipelines', schema=None) as batch_op:
        batch_op.create_index('ix_pipelines_project_id_id', ['project_id', 'id'], unique=False)

    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pipeline_id', sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column('pipeline_step', sa.String(length=64), nullable=True))
        # Existing rows depend on nothing.
        batch_op.add_column(sa.Column('depends_on', sa.JSON(), nullable=False, server_default='[]'))
        batch_op.create_index(batch_op.f('ix_jobs_pipeline_id'), ['pipeline_id'], unique=False)
        batch_op.create_foreign_key('fk_jobs_pipeline_id', 'pipelines', ['pipeline_id'], ['id'], ondelete='CASCADE')


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_constraint('fk_jobs_pipeline_id', type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_jobs_pipeline_id'))
        batch_op.drop_column('depends_on')
        batch_op.drop_column('pipeline_step')
        batch_op.drop_column('pipeline_id')
    with op.batch_alter_table('pipelines', schema=None) as batch_op:
        batch_op.drop_index('ix_pipelines_project_id_id')
    op.drop_table('pipelines')
