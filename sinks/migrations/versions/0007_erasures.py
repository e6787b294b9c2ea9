"""erasures: one row per forgotten session (who, when, why, how far), never content; the
analytics rows keep what each turn added to the figures (so an erasure can take it out) and
when a session was forgotten.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

from turnlog.sinks.tables import UtcDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "erasures",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("fleet", sa.String(200), nullable=False),
        sa.Column("requested_by", sa.String(200), nullable=False),
        sa.Column("requested_at", UtcDateTime, nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("published_at", UtcDateTime),
        sa.Column("completed_at", UtcDateTime),
    )
    op.create_index("ix_erasures_pending_publication", "erasures", ["published_at"])
    with op.batch_alter_table("analytics_sessions") as batch:
        batch.add_column(sa.Column("erased_at", UtcDateTime))
    with op.batch_alter_table("analytics_turns") as batch:
        batch.add_column(sa.Column("fleet", sa.String(200)))
        batch.add_column(sa.Column("speaker", sa.String(200)))
        batch.add_column(sa.Column("minute", UtcDateTime))
        batch.add_column(sa.Column("talk_seconds", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("analytics_turns") as batch:
        for column in ("talk_seconds", "minute", "speaker", "fleet"):
            batch.drop_column(column)
    with op.batch_alter_table("analytics_sessions") as batch:
        batch.drop_column("erased_at")
    op.drop_index("ix_erasures_pending_publication", table_name="erasures")
    op.drop_table("erasures")
