"""Read queries over the store for subscribers and operators (the API, ``turnlog tail``).

All functions take a connection and never write. Fleet scoping is the caller's
(``turnlog.api.auth``): ``fleets=None`` means every fleet.

Pages are bounded twice: by a row count and, where a caller gives ``max_bytes``,
by the bytes a client can make large (turn text and tool calls, session
metadata, event payloads), so one response never holds more than about
``max_bytes`` whatever the rows hold. A page always holds its first row, so
paging advances even past one row larger than ``max_bytes``. Bounded reads
stream their rows from the database and stop at the bound.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import msgspec
from sqlalchemy import Select, func, select
from sqlalchemy.engine import Connection

from turnlog.schemas import SessionStatus
from turnlog.sinks.erasure import being_forgotten
from turnlog.sinks.tables import session_events, sessions, transcript_turns

__all__ = ["StoredEvent", "EventPage", "TurnRowPage", "list_sessions", "get_session", "get_turns", "turn_page",
           "events_after", "SESSION_FIELDS", "SESSION_SUMMARY_FIELDS", "TURN_FIELDS", "ROW_OVERHEAD_BYTES",
           "MAX_TURN_INDEX", "count_open_sessions"]

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
#: :data:`SESSION_FIELDS` without ``metadata`` (up to ~1 MB a row): what a list shows unless asked for more.
SESSION_SUMMARY_FIELDS = tuple(name for name in SESSION_FIELDS if name != "metadata")
#: The ``transcript_turns`` columns a reader sees: every one but the key's ``session_id``, listed
#: so that a new column is shown only once someone decides it should be (a unit test holds the
#: list to the table: ``tests/unit/test_reader_fields.py``). ``status`` is ``partial``,
#: ``complete`` or ``interrupted`` (never completed: its writer died or the session ended);
#: ``barged_in`` marks a complete turn the other speaker cut short; ``attributes`` holds the
#: turn's optional attributes (the event model's ``stored_attributes``) or None.
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
    "attributes",
    "epoch",
    "seq",
)
#: What a row counts for in a page's byte budget besides its text, tool calls, metadata or payload
#: (its other columns, as JSON): so a page of tiny rows is bounded too.
ROW_OVERHEAD_BYTES = 256
#: The highest ``turn_index`` the store can hold (its column is a 32-bit integer).
MAX_TURN_INDEX = 2**31 - 1
#: Rows a bounded read takes from the database at a time (it stops at the page's bound).
_STREAM_ROWS = 32


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


@dataclass(frozen=True, slots=True)
class TurnRowPage:
    """A page of a session's turns (``TURN_FIELDS`` mappings) in ``turn_index`` order.
    ``next_after_turn``: the last ``turn_index`` given, when more turns follow (ask
    again with ``after_turn`` set to it); None on the last page."""

    turns: list[dict[str, Any]]
    next_after_turn: int | None


def _columns(table: Any, names: Collection[str]) -> list[Any]:
    return [table.c[name] for name in names]


def _json_bytes(value: Any) -> int:
    return 0 if value is None else len(msgspec.json.encode(value))


def _turn_bytes(row: dict[str, Any]) -> int:
    return (ROW_OVERHEAD_BYTES + len(row["text"].encode("utf-8")) + _json_bytes(row.get("tool_calls"))
            + _json_bytes(row.get("attributes")))


def _session_bytes(row: dict[str, Any]) -> int:
    return ROW_OVERHEAD_BYTES + _json_bytes(row.get("metadata"))


def _bounded_rows(
    conn: Connection, query: Select[Any], limit: int, max_bytes: int | None, size: Callable[[dict[str, Any]], int]
) -> tuple[list[dict[str, Any]], bool]:
    """The rows of ``query`` (which must not be limited yet) up to ``limit`` rows and ``max_bytes``
    (each row counted by ``size``; the first row always), and whether rows were left over."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    taken: list[dict[str, Any]] = []
    used = 0
    with conn.execute(query.limit(limit + 1).execution_options(yield_per=_STREAM_ROWS)) as result:
        for row in result:
            item = dict(row._mapping)
            if len(taken) == limit:
                return taken, True
            if max_bytes is not None:
                used += size(item)
                if taken and used > max_bytes:
                    return taken, True
            taken.append(item)
    return taken, False


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
    include_metadata: bool = True,
    max_bytes: int | None = None,
) -> tuple[list[dict[str, Any]], bool]:
    """Sessions ordered by id after ``after_id`` (keyset paging), at most ``limit``
    and, with ``max_bytes``, about that many bytes of metadata (the first always).
    Returns ``(rows, more)``: ``more`` if sessions follow the last row given.

    ``fleets`` is the caller's scope (None: all); ``fleet`` a filter inside it.
    ``started_after`` is inclusive, ``started_before`` exclusive (UTC). Without
    ``include_metadata`` the rows have :data:`SESSION_SUMMARY_FIELDS`. A session
    with an erasure (pending or done) is never listed (docs/design.md, "Encryption
    and erasure").
    """
    fields = SESSION_FIELDS if include_metadata else SESSION_SUMMARY_FIELDS
    query = select(*_columns(sessions, fields)).where(~being_forgotten()).order_by(sessions.c.id)
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
    return _bounded_rows(conn, query, limit, max_bytes, _session_bytes)


def count_open_sessions(conn: Connection) -> int:
    """How many sessions are open: status ``active`` (started, not ended) and not being
    forgotten, in every fleet. One ``count(*)`` over the ``status`` index: the operations
    page's figure (``turnlog.api.ops``), never a list."""
    query = select(func.count()).select_from(sessions).where(
        sessions.c.status == SessionStatus.ACTIVE.value, ~being_forgotten()
    )
    return int(conn.execute(query).scalar_one())


def get_session(
    conn: Connection, session_id: str, *, fleets: Collection[str] | None, include_metadata: bool = True
) -> dict[str, Any] | None:
    """The session's row, or None if it does not exist or lies outside ``fleets``
    (without ``include_metadata``: :data:`SESSION_SUMMARY_FIELDS`)."""
    fields = SESSION_FIELDS if include_metadata else SESSION_SUMMARY_FIELDS
    row = conn.execute(select(*_columns(sessions, fields)).where(sessions.c.id == session_id)).first()
    if row is None or (fleets is not None and row.fleet not in fleets):
        return None
    return dict(row._mapping)


def get_turns(conn: Connection, session_id: str) -> list[dict[str, Any]]:
    """Every turn of the session in ``turn_index`` order (partial ones included), unbounded:
    for in-process readers; whatever answers a client pages with :func:`turn_page`."""
    query = (
        select(*_columns(transcript_turns, TURN_FIELDS))
        .where(transcript_turns.c.session_id == session_id)
        .order_by(transcript_turns.c.turn_index)
    )
    return [dict(row._mapping) for row in conn.execute(query)]


def turn_page(
    conn: Connection, session_id: str, *, after_turn: int = -1, limit: int, max_bytes: int | None = None
) -> TurnRowPage:
    """The session's turns with ``turn_index > after_turn`` in ``turn_index`` order, at
    most ``limit`` and, with ``max_bytes``, about that many bytes of text and tool calls
    (the first turn always). Raises ValueError for ``limit`` < 1."""
    query = (
        select(*_columns(transcript_turns, TURN_FIELDS))
        .where(transcript_turns.c.session_id == session_id, transcript_turns.c.turn_index > after_turn)
        .order_by(transcript_turns.c.turn_index)
    )
    turns, more = _bounded_rows(conn, query, limit, max_bytes, _turn_bytes)
    return TurnRowPage(turns, turns[-1]["turn_index"] if more else None)


def events_after(
    conn: Connection, session_id: str, after_seq: int, *, limit: int = 1000, max_bytes: int | None = None
) -> EventPage:
    """Applied events with ``seq > after_seq``, in seq order, up to the session's
    contiguous ``last_seq`` (never past a gap), at most ``limit`` and, with
    ``max_bytes``, about that many bytes of payload (the first event always)."""
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
        )
        rows, _ = _bounded_rows(
            conn, query, limit, max_bytes, lambda r: ROW_OVERHEAD_BYTES + len(r["payload"].encode("utf-8"))
        )
        events = [StoredEvent(r["seq"], r["type"], r["payload"]) for r in rows]
    reached = events[-1].seq if events else after_seq
    if row.status == SessionStatus.ABANDONED:
        finished = reached >= row.last_seq
    else:
        finished = row.end_seq is not None and reached >= row.end_seq
    return EventPage(events, finished)
