"""transcript_turns.barged_in: a completed turn cut short by the other speaker.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("transcript_turns") as batch:
        # Rows written before this revision come from v1 events: none was barged in.
        batch.add_column(sa.Column("barged_in", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("transcript_turns") as batch:
        batch.drop_column("barged_in")
