"""sessions.max_seq: the highest seq stored, so the sink reads the log only past a gap.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        # NULL (rows written before this revision): unknown, the sink reads the log once.
        batch.add_column(sa.Column("max_seq", sa.BigInteger))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("max_seq")
