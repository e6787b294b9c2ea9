"""The store's tables (SQLAlchemy Core), as created by the Alembic migrations.

``sessions``, ``session_events``, ``transcript_turns`` and ``sink_offsets``, as
docs/design.md ("Store") describes them. The migrations in ``sinks/migrations`` are
the history; a test checks that a migrated database matches this metadata.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    false,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal
from sqlalchemy.types import Float as FloatType

from turnlog.schemas.session_keys import MAX_SESSION_KEY

__all__ = [
    "metadata",
    "sessions",
    "session_events",
    "transcript_turns",
    "sink_offsets",
    "analytics_sessions",
    "analytics_turns",
    "fleet_activity",
    "fleet_turns_per_minute",
    "fleet_talk_time",
    "UtcDateTime",
    "SecondsBetween",
]


class UtcDateTime(TypeDecorator[dt.datetime]):
    """A timezone-aware UTC timestamp on every backend.

    Postgres stores ``timestamptz``; SQLite has no time zones, so values are
    stored as naive UTC and given ``tzinfo=UTC`` again when read.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(dt.UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


class SecondsBetween(ColumnElement[float]):
    """``end - start`` in seconds, rounded half away from zero to whole milliseconds,
    computed by the database from the exact (microsecond) timestamps.

    ``turnlog.ops.audit`` rounds the same way, so both give the same float.
    """

    type = FloatType()
    inherit_cache = True
    # Without these the element has no cache key, and every statement holding it
    # (the finalize UPDATE) is compiled again on each execution.
    _traverse_internals = [("start", InternalTraversal.dp_clauseelement), ("end", InternalTraversal.dp_clauseelement)]

    def __init__(self, start: ColumnElement[Any], end: ColumnElement[Any]) -> None:
        self.start = start
        self.end = end


@compiles(SecondsBetween, "postgresql")
def _seconds_between_pg(element: SecondsBetween, compiler: Any, **kw: Any) -> str:
    end, start = compiler.process(element.end, **kw), compiler.process(element.start, **kw)
    # EXTRACT gives an exact numeric; ROUND(numeric) rounds half away from zero.
    return f"CAST(ROUND(EXTRACT(EPOCH FROM ({end} - {start})), 3) AS DOUBLE PRECISION)"


@compiles(SecondsBetween, "sqlite")
def _seconds_between_sqlite(element: SecondsBetween, compiler: Any, **kw: Any) -> str:
    end, start = compiler.process(element.end, **kw), compiler.process(element.start, **kw)
    # Stored as 'YYYY-MM-DD HH:MM:SS.ffffff' (UTC): whole seconds from strftime,
    # microseconds from the text, then integer rounding to milliseconds.
    micros = (
        f"((CAST(strftime('%s', {end}) AS INTEGER) - CAST(strftime('%s', {start}) AS INTEGER)) * 1000000"
        f" + CAST(substr({end}, 21, 6) AS INTEGER) - CAST(substr({start}, 21, 6) AS INTEGER))"
    )
    millis = f"(CASE WHEN {micros} >= 0 THEN ({micros} + 500) / 1000 ELSE -((500 - {micros}) / 1000) END)"
    return f"({millis} / 1000.0)"


metadata = MetaData()

sessions = Table(
    "sessions",
    metadata,
    Column("id", String(MAX_SESSION_KEY), primary_key=True),
    Column("fleet", String(200)),
    Column("agent_id", String(200)),
    # active -> ended -> finalized; abandoned is set by operators.
    Column("status", String(16), nullable=False),
    Column("started_at", UtcDateTime),
    Column("ended_at", UtcDateTime),
    Column("end_reason", String(200)),
    Column("epoch", Integer, nullable=False),
    # The highest epoch resume() has handed out (claimed, maybe not yet applied):
    # two processes resuming the same session never share an epoch.
    Column("claimed_epoch", Integer, nullable=False, server_default="0"),
    # Highest seq such that every seq from 0 up to it has been applied (-1: none).
    Column("last_seq", BigInteger, nullable=False),
    # Highest seq stored (NULL: unknown, from before migration 0004). While it
    # equals last_seq there is nothing past a gap, and the sink need not look.
    Column("max_seq", BigInteger),
    Column("end_seq", BigInteger),
    Column("turn_count", Integer),
    Column("interrupted_turn_count", Integer),
    Column("duration_seconds", Float),
    Column("input_tokens", BigInteger),
    Column("output_tokens", BigInteger),
    Column("finalized_at", UtcDateTime),
    Column("metadata", JSON(none_as_null=True)),
    # When the sink last applied an event of the session (its host's clock, never an agent's):
    # the age retention counts for a session that never settled.
    Column("last_applied_at", UtcDateTime),
    Index("ix_sessions_status", "status"),
    Index("ix_sessions_fleet_started_at", "fleet", "started_at"),
)

session_events = Table(
    "session_events",
    metadata,
    Column("session_id", String(MAX_SESSION_KEY), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("epoch", Integer, nullable=False),
    Column("event_id", String(36), nullable=False),
    Column("type", String(32), nullable=False),
    Column("emitted_at", UtcDateTime, nullable=False),
    # The event exactly as it crossed Kafka (UTF-8 JSON), for audit and replay.
    Column("payload", Text, nullable=False),
)

transcript_turns = Table(
    "transcript_turns",
    metadata,
    Column("session_id", String(MAX_SESSION_KEY), primary_key=True),
    Column("turn_index", Integer, primary_key=True),
    Column("speaker", String(200), nullable=False),
    Column("text", Text, nullable=False),
    # partial | complete | interrupted (never completed: its writer died or the session ended)
    Column("status", String(16), nullable=False),
    # A complete turn the other speaker cut short (barge-in): text is what was said.
    Column("barged_in", Boolean, nullable=False, server_default=false()),
    Column("started_at", UtcDateTime, nullable=False),
    Column("ended_at", UtcDateTime),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("tool_calls", JSON(none_as_null=True)),
    # The turn's optional attributes (the event model's ``stored_attributes``), one JSON
    # object; NULL when the turn has none.
    Column("attributes", JSON(none_as_null=True)),
    # The (epoch, seq) of the event last applied to this row: the upsert guard.
    Column("epoch", Integer, nullable=False),
    Column("seq", BigInteger, nullable=False),
)

sink_offsets = Table(
    "sink_offsets",
    metadata,
    Column("consumer_group", String(200), primary_key=True),
    Column("topic", String(249), primary_key=True),
    Column("partition", Integer, primary_key=True),
    # The next offset to consume; only ever moves forward.
    Column("next_offset", BigInteger, nullable=False),
    # The fencing token: each sink assigned the partition raises it (sinks/offsets.py, claim_partitions),
    # and a batch commits only under the generation its sink claimed, so a zombie sink writes nothing.
    Column("owner_generation", BigInteger, nullable=False, server_default="0"),
)

# -- the analytics projection (sinks/analytics.py; its own consumer group) -----
# Keyed rows make it idempotent: a figure is incremented only when the row that
# counts it is inserted for the first time.

analytics_sessions = Table(
    "analytics_sessions",
    metadata,
    Column("session_id", String(MAX_SESSION_KEY), primary_key=True),
    Column("fleet", String(200), nullable=False),
    Column("started_at", UtcDateTime),
    Column("ended_at", UtcDateTime),
    # Set when the session was forgotten: its figures were taken out, and nothing of it counts again.
    Column("erased_at", UtcDateTime),
)

analytics_turns = Table(
    "analytics_turns",
    metadata,
    Column("session_id", String(MAX_SESSION_KEY), primary_key=True),
    Column("turn_index", Integer, primary_key=True),
    # What the turn added to the figures, so an erasure can take it out (NULL on rows counted before 0007).
    Column("fleet", String(200)),
    Column("speaker", String(200)),
    Column("minute", UtcDateTime),
    Column("talk_seconds", Float),
)

fleet_activity = Table(
    "fleet_activity",
    metadata,
    Column("fleet", String(200), primary_key=True),
    Column("active_sessions", Integer, nullable=False),
    Column("started_sessions", Integer, nullable=False),
    Column("ended_sessions", Integer, nullable=False),
)

fleet_turns_per_minute = Table(
    "fleet_turns_per_minute",
    metadata,
    Column("fleet", String(200), primary_key=True),
    # The UTC minute in which the turns ended (seconds and below zeroed).
    Column("minute", UtcDateTime, primary_key=True),
    Column("turns", Integer, nullable=False),
)

fleet_talk_time = Table(
    "fleet_talk_time",
    metadata,
    Column("fleet", String(200), primary_key=True),
    Column("speaker", String(200), primary_key=True),
    Column("turns", Integer, nullable=False),
    # Sum of ended_at - started_at over the speaker's completed turns (seconds).
    Column("talk_seconds", Float, nullable=False),
)


# -- erasure (sinks/erasure.py; docs/design.md, "Encryption and erasure") -------
# One row per forgotten session: who asked, when, why, and how far the erasure
# got. Never content. It outlives the session's rows: it is what the sink checks
# before storing anything of the session again.

erasures = Table(
    "erasures",
    metadata,
    # An erasure is bound to its fleet: fleet A's erasure of X leaves fleet B's X alone.
    Column("session_id", String(MAX_SESSION_KEY), primary_key=True),
    Column("fleet", String(200), primary_key=True),
    Column("requested_by", String(200), nullable=False),
    Column("requested_at", UtcDateTime, nullable=False),
    Column("reason", String(16), nullable=False),
    # When the broker acknowledged its ledger record (None: still to publish, the sink retries).
    Column("published_at", UtcDateTime),
    # When the session's rows were deleted (None: pending).
    Column("completed_at", UtcDateTime),
    Index("ix_erasures_pending_publication", "published_at"),
)
