"""The initial store: sessions, session_events, transcript_turns, sink_offsets.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from turnlog.sinks.tables import UtcDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("fleet", sa.String(200)),
        sa.Column("agent_id", sa.String(200)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_at", UtcDateTime),
        sa.Column("ended_at", UtcDateTime),
        sa.Column("end_reason", sa.String(200)),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("end_seq", sa.BigInteger),
        sa.Column("turn_count", sa.Integer),
        sa.Column("interrupted_turn_count", sa.Integer),
        sa.Column("duration_seconds", sa.Float),
        sa.Column("input_tokens", sa.BigInteger),
        sa.Column("output_tokens", sa.BigInteger),
        sa.Column("finalized_at", UtcDateTime),
        sa.Column("metadata", sa.JSON(none_as_null=True)),
    )
    op.create_index("ix_sessions_status", "sessions", ["status"])
    op.create_table(
        "session_events",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("event_id", sa.String(36), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("emitted_at", UtcDateTime, nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
    )
    op.create_table(
        "transcript_turns",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("turn_index", sa.Integer, primary_key=True),
        sa.Column("speaker", sa.String(200), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_at", UtcDateTime, nullable=False),
        sa.Column("ended_at", UtcDateTime),
        sa.Column("input_tokens", sa.BigInteger, nullable=False),
        sa.Column("output_tokens", sa.BigInteger, nullable=False),
        sa.Column("tool_calls", sa.JSON(none_as_null=True)),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "sink_offsets",
        sa.Column("consumer_group", sa.String(200), primary_key=True),
        sa.Column("topic", sa.String(249), primary_key=True),
        sa.Column("partition", sa.Integer, primary_key=True),
        sa.Column("next_offset", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    for table in ("sink_offsets", "transcript_turns", "session_events", "sessions"):
        op.drop_table(table)
