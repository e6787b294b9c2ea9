"""transcript_turns.attributes: a turn's optional attributes, one JSON object.

An optional field of the turn events that the event model lists in ``stored_attributes``
is kept here, so adding one needs no new column.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("transcript_turns") as batch:
        # Rows written before this revision have no attributes: NULL.
        batch.add_column(sa.Column("attributes", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("transcript_turns") as batch:
        batch.drop_column("attributes")
