"""api_keys.parent_id: the key that minted each key (null: the admin token), so that revoking a
key revokes the keys minted below it (store.keys.revoke). Keys minted before this revision have
no recorded parent and are revoked one by one, as before.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 00:00:00
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


revision: str = '0011'
down_revision: Union[str, None] = '0010'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


# plain ALTER TABLE on both databases (SQLite's batch mode would rebuild the table)
def upgrade() -> None:
    op.add_column("api_keys", sa.Column("parent_id", sa.String(length=36), nullable=True))
    op.create_index("ix_api_keys_parent_id", "api_keys", ["parent_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_api_keys_parent_id", table_name="api_keys")
    op.execute("ALTER TABLE api_keys DROP COLUMN parent_id")
