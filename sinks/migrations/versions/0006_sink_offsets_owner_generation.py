"""sink_offsets.owner_generation: the fencing token of the sink that owns a partition.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sink_offsets") as batch:
        # Rows written before this revision were claimed by no generation: the next assignment claims 1.
        batch.add_column(sa.Column("owner_generation", sa.BigInteger, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("sink_offsets") as batch:
        batch.drop_column("owner_generation")
