"""sessions.last_applied_at: when the sink last applied an event of the session (the sink
host's clock), so retention can forget a session that never settled (its agent crashed and
was never resumed, or its end never became complete).

A session stored before this revision counts as applied at the upgrade: one that never
settles is forgotten a retention period after it.

Revision ID: 0008
Revises: 0007
"""

import datetime as dt

import sqlalchemy as sa
from alembic import op

from turnlog.sinks.tables import UtcDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("last_applied_at", UtcDateTime))
    sessions = sa.table("sessions", sa.column("last_applied_at", UtcDateTime))
    op.execute(sessions.update().values(last_applied_at=dt.datetime.now(dt.UTC)))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("last_applied_at")
