"""The analytics projection's tables, and an index for listing sessions by fleet.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

from turnlog.sinks.tables import UtcDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_sessions_fleet_started_at", "sessions", ["fleet", "started_at"])
    op.create_table(
        "analytics_sessions",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("fleet", sa.String(200), nullable=False),
        sa.Column("started_at", UtcDateTime),
        sa.Column("ended_at", UtcDateTime),
    )
    op.create_table(
        "analytics_turns",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("turn_index", sa.Integer, primary_key=True),
    )
    op.create_table(
        "fleet_activity",
        sa.Column("fleet", sa.String(200), primary_key=True),
        sa.Column("active_sessions", sa.Integer, nullable=False),
        sa.Column("started_sessions", sa.Integer, nullable=False),
        sa.Column("ended_sessions", sa.Integer, nullable=False),
    )
    op.create_table(
        "fleet_turns_per_minute",
        sa.Column("fleet", sa.String(200), primary_key=True),
        sa.Column("minute", UtcDateTime, primary_key=True),
        sa.Column("turns", sa.Integer, nullable=False),
    )
    op.create_table(
        "fleet_talk_time",
        sa.Column("fleet", sa.String(200), primary_key=True),
        sa.Column("speaker", sa.String(200), primary_key=True),
        sa.Column("turns", sa.Integer, nullable=False),
        sa.Column("talk_seconds", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for table in ("fleet_talk_time", "fleet_turns_per_minute", "fleet_activity", "analytics_turns",
                  "analytics_sessions"):
        op.drop_table(table)
    op.drop_index("ix_sessions_fleet_started_at", "sessions")
