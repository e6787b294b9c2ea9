"""erasures: one row per forgotten session of a fleet, keyed by (session_id, fleet).

An erasure is bound to the fleet it names: forgetting fleet A's session X leaves fleet B's
session X alone, and B can forget its own X later. The rows move to a table keyed by the
pair (the ids and fleets are kept as they are).

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

from turnlog.sinks.tables import UtcDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_COLUMNS = "session_id, fleet, requested_by, requested_at, reason, published_at, completed_at"


def _erasures_table(name: str, *key: str, pk_name: str) -> None:
    op.create_table(
        name,
        sa.Column("session_id", sa.String(200), nullable=False),
        sa.Column("fleet", sa.String(200), nullable=False),
        sa.Column("requested_by", sa.String(200), nullable=False),
        sa.Column("requested_at", UtcDateTime, nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("published_at", UtcDateTime),
        sa.Column("completed_at", UtcDateTime),
        sa.PrimaryKeyConstraint(*key, name=pk_name),
    )


def _replace_with(into: str) -> None:
    op.drop_index("ix_erasures_pending_publication", table_name="erasures")
    op.drop_table("erasures")
    op.rename_table(into, "erasures")
    op.create_index("ix_erasures_pending_publication", "erasures", ["published_at"])


def upgrade() -> None:
    _erasures_table("erasures_per_fleet", "session_id", "fleet", pk_name="erasures_session_fleet_pkey")
    op.execute(f"INSERT INTO erasures_per_fleet ({_COLUMNS}) SELECT {_COLUMNS} FROM erasures")
    _replace_with("erasures_per_fleet")


def downgrade() -> None:
    # Keyed by session id again: of several fleets' erasures of one id, the earliest request stays.
    _erasures_table("erasures_per_session", "session_id", pk_name="erasures_session_pkey")
    op.execute(
        f"INSERT INTO erasures_per_session ({_COLUMNS}) SELECT {_COLUMNS} FROM erasures e "
        "WHERE NOT EXISTS (SELECT 1 FROM erasures o WHERE o.session_id = e.session_id "
        "AND (o.requested_at < e.requested_at OR (o.requested_at = e.requested_at AND o.fleet < e.fleet)))"
    )
    _replace_with("erasures_per_session")
