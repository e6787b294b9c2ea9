"""Read queries over the store for subscribers and operators (the API, ``turnlog tail``).

All functions take a connection and never write. Fleet scoping is the caller's
(``turnlog.api.auth``): ``fleets=None`` means every fleet.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from turnlog.schemas import SessionStatus
from turnlog.sinks.tables import session_events, sessions, transcript_turns

__all__ = ["StoredEvent", "EventPage", "list_sessions", "get_session", "get_turns", "events_after", "SESSION_FIELDS",
           "TURN_FIELDS"]

#: The ``sessions`` columns a reader sees (not the resume bookkeeping ``claimed_epoch``).
SESSION_FIELDS = (
    "id",
    "fleet",
    "agent_id",
    "status",
    "started_at",
    "ended_at",
    "end_reason",
    "epoch",
    "last_seq",
    "end_seq",
    "turn_count",
    "interrupted_turn_count",
    "duration_seconds",
    "input_tokens",
    "output_tokens",
    "finalized_at",
    "metadata",
)
#: The ``transcript_turns`` columns a reader sees. ``status`` is ``partial``,
#: ``complete`` or ``interrupted`` (never completed: its writer died or the
#: session ended); ``barged_in`` marks a complete turn the other speaker cut short.
TURN_FIELDS = (
    "turn_index",
    "speaker",
    "text",
    "status",
    "barged_in",
    "started_at",
    "ended_at",
    "input_tokens",
    "output_tokens",
    "tool_calls",
    "epoch",
    "seq",
)


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One applied event of a session: its seq, type and exact JSON payload (UTF-8 text)."""

    seq: int
    type: str
    payload: str


@dataclass(frozen=True, slots=True)
class EventPage:
    """A page of stored events; ``finished``: no event will ever follow the last
    one given (or the resume point, if none): the session ended there, or an
    operator abandoned it."""

    events: list[StoredEvent]
    finished: bool


def _columns(table: Any, names: Collection[str]) -> list[Any]:
    return [table.c[name] for name in names]


def list_sessions(
    conn: Connection,
    *,
    fleets: Collection[str] | None,
    status: str | None = None,
    fleet: str | None = None,
    started_after: dt.datetime | None = None,
    started_before: dt.datetime | None = None,
    after_id: str | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """Sessions ordered by id, at most ``limit``, after ``after_id`` (keyset paging).

    ``fleets`` is the caller's scope (None: all); ``fleet`` a filter inside it.
    ``started_after`` is inclusive, ``started_before`` exclusive (UTC).
    """
    query = select(*_columns(sessions, SESSION_FIELDS)).order_by(sessions.c.id).limit(limit)
    if fleets is not None:
        query = query.where(sessions.c.fleet.in_(sorted(fleets)))
    if fleet is not None:
        query = query.where(sessions.c.fleet == fleet)
    if status is not None:
        query = query.where(sessions.c.status == status)
    if started_after is not None:
        query = query.where(sessions.c.started_at >= started_after)
    if started_before is not None:
        query = query.where(sessions.c.started_at < started_before)
    if after_id is not None:
        query = query.where(sessions.c.id > after_id)
    return [dict(row._mapping) for row in conn.execute(query)]


def get_session(conn: Connection, session_id: str, *, fleets: Collection[str] | None) -> dict[str, Any] | None:
    """The session's row, or None if it does not exist or lies outside ``fleets``."""
    row = conn.execute(select(*_columns(sessions, SESSION_FIELDS)).where(sessions.c.id == session_id)).first()
    if row is None or (fleets is not None and row.fleet not in fleets):
        return None
    return dict(row._mapping)


def get_turns(conn: Connection, session_id: str) -> list[dict[str, Any]]:
    """The session's turns in ``turn_index`` order (partial ones included)."""
    query = (
        select(*_columns(transcript_turns, TURN_FIELDS))
        .where(transcript_turns.c.session_id == session_id)
        .order_by(transcript_turns.c.turn_index)
    )
    return [dict(row._mapping) for row in conn.execute(query)]


def events_after(conn: Connection, session_id: str, after_seq: int, *, limit: int = 1000) -> EventPage:
    """Applied events with ``seq > after_seq``, in seq order, up to the session's
    contiguous ``last_seq`` (never past a gap), at most ``limit``."""
    row = conn.execute(
        select(sessions.c.last_seq, sessions.c.end_seq, sessions.c.status).where(sessions.c.id == session_id)
    ).first()
    if row is None:
        return EventPage([], False)
    events: list[StoredEvent] = []
    if row.last_seq > after_seq:
        e = session_events.c
        query = (
            select(e.seq, e.type, e.payload)
            .where(e.session_id == session_id, e.seq > after_seq, e.seq <= row.last_seq)
            .order_by(e.seq)
            .limit(limit)
        )
        events = [StoredEvent(r.seq, r.type, r.payload) for r in conn.execute(query)]
    reached = events[-1].seq if events else after_seq
    if row.status == SessionStatus.ABANDONED:
        finished = reached >= row.last_seq
    else:
        finished = row.end_seq is not None and reached >= row.end_seq
    return EventPage(events, finished)
