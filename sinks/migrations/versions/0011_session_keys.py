"""Session keys: every column that holds a session id takes a key, '<fleet>:<id>' (265 characters).

A session's identity is its fleet and its id (schemas/session_keys.py): the recorder
writes a new session under ``<fleet>:<id>``, up to 64 + 1 + 200 characters. Rows of
sessions started before keep their bare ids; nothing is rewritten. On Postgres a
wider ``varchar`` is a change of the catalog only (no table rewrite); SQLite does not
enforce lengths, and ``batch_alter_table`` copies each table once.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

#: (table, column) of every session id.
SESSION_ID_COLUMNS = (
    ("sessions", "id"),
    ("session_events", "session_id"),
    ("transcript_turns", "session_id"),
    ("analytics_sessions", "session_id"),
    ("analytics_turns", "session_id"),
    ("erasures", "session_id"),
)


def _resize(length: int, existing: int) -> None:
    for table, column in SESSION_ID_COLUMNS:
        with op.batch_alter_table(table) as batch:
            batch.alter_column(column, type_=sa.String(length), existing_type=sa.String(existing),
                               existing_nullable=False)


def upgrade() -> None:
    _resize(265, 200)


def downgrade() -> None:
    # Fails on Postgres while a row holds a key longer than 200 characters: such a session
    # cannot be kept by the older release.
    _resize(200, 265)
