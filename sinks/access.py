"""The store's named operations, in one transaction: what :meth:`SqlStore.reading` and
:meth:`SqlStore.writing` hand their caller.

Everything outside ``sinks/`` reaches the database through these two classes: it
never holds an engine or a connection and never builds SQL. The transaction and
the conversion of driver errors belong to :meth:`SqlStore.reading` and
:meth:`SqlStore.writing` (``sinks/driver_errors.py``: ``StoreUnavailableError`` for
an outage, ``RecordRejectedError`` for rows the database refuses), so every
operation below raises those and never a driver's own class.

    with store.reading() as reads:       # one read-only transaction
        session = reads.session(session_id, fleets=None)
        page = reads.turn_page(session_id, limit=50)

    with store.writing() as writes:      # one transaction, committed at the end of the block
        writes.finalize_session(session_id, now)

Several operations in one block share one transaction. Under the default
isolation (read committed) each statement sees what was committed when it
began: a check made after a read sees every erasure committed before that read
(the API reads, then checks), and rows locked in a writing block (a claimed
epoch's session row) stay as read to its end.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from turnlog.schemas.erasure import Erasure
from turnlog.sinks import reads as queries
from turnlog.sinks.erasure import ErasureResult, ErasureState
from turnlog.sinks.finalization import session_ended_at, unfinalized_sessions
from turnlog.sinks.interfaces import BatchResult, OnRejected, SessionPosition
from turnlog.sinks.source_records import SourceMessage
from turnlog.sinks.tables import erasures, session_events, sessions, sink_offsets, transcript_turns

if TYPE_CHECKING:
    from turnlog.sinks.analytics import FleetFigures
    from turnlog.sinks.base import SqlStore

__all__ = ["StoreReads", "StoreWrites", "SequencingStart", "SessionSnapshot"]

#: Session ids per ``IN (...)`` list: well under every backend's bound-parameter limit.
_IDS_PER_QUERY = 500


@dataclass(frozen=True, slots=True)
class SequencingStart:
    """Where a replay starts sequencing a session: its stored position (None: no row), the
    ``event_id`` of its stored ``session.started`` (seq 0) and its stored fleet."""

    position: SessionPosition | None
    started_event_id: str | None
    fleet: str | None


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """The stored rows of some sessions, for a comparison of two stores (``turnlog verify``):
    ``sessions`` ``{id: {column: value}}`` with ``session_fields``; ``turns`` ``{id: [row,
    ...]}`` in ``turn_index`` order with ``turn_fields``; ``events`` ``{id: [(seq, epoch, type,
    payload), ...]}`` in seq order."""

    sessions: dict[str, dict[str, Any]]
    turns: dict[str, list[dict[str, Any]]]
    events: dict[str, list[tuple[int, int, str, str]]]


class StoreReads:
    """Named reads in one transaction of ``store`` (from :meth:`SqlStore.reading`). None of
    them writes. Fleet scoping is the caller's: ``fleets=None`` means every fleet."""

    def __init__(self, store: SqlStore, conn: Connection) -> None:
        self._store = store
        self._conn = conn

    # -- sessions and turns ------------------------------------------------------------------
    def session(
        self, session_id: str, *, fleets: Collection[str] | None, include_metadata: bool = True
    ) -> dict[str, Any] | None:
        """The session's row (:func:`~turnlog.sinks.reads.get_session`), or None if it does not
        exist or lies outside ``fleets``."""
        return queries.get_session(self._conn, session_id, fleets=fleets, include_metadata=include_metadata)

    def sessions(self, *, fleets: Collection[str] | None, **filters: Any) -> tuple[list[dict[str, Any]], bool]:
        """A keyset page of sessions, ``(rows, more)``: :func:`~turnlog.sinks.reads.list_sessions`
        (``status``, ``fleet``, ``started_after``, ``started_before``, ``after_id``, ``limit``,
        ``include_metadata``, ``max_bytes``)."""
        return queries.list_sessions(self._conn, fleets=fleets, **filters)

    def open_session_count(self) -> int:
        """How many sessions are active and not being forgotten, in every fleet
        (:func:`~turnlog.sinks.reads.count_open_sessions`)."""
        return queries.count_open_sessions(self._conn)

    def turns(self, session_id: str) -> list[dict[str, Any]]:
        """Every turn of the session, unbounded (:func:`~turnlog.sinks.reads.get_turns`): for
        in-process readers; what answers a client pages with :meth:`turn_page`."""
        return queries.get_turns(self._conn, session_id)

    def turn_page(
        self, session_id: str, *, after_turn: int = -1, limit: int, max_bytes: int | None = None
    ) -> queries.TurnRowPage:
        """A bounded page of the session's turns (:func:`~turnlog.sinks.reads.turn_page`).
        Raises ValueError for ``limit`` < 1."""
        return queries.turn_page(self._conn, session_id, after_turn=after_turn, limit=limit, max_bytes=max_bytes)

    def events_after(self, session_id: str, after_seq: int, *, max_bytes: int | None = None) -> queries.EventPage:
        """The session's applied events after ``after_seq``, bounded
        (:func:`~turnlog.sinks.reads.events_after`)."""
        return queries.events_after(self._conn, session_id, after_seq, max_bytes=max_bytes)

    def session_position(self, session_id: str) -> SessionPosition | None:
        """Where ``session_id`` stands in the store, or None if it has no row."""
        return self._store.claims.session_position(self._conn, session_id)

    def sequencing_start(self, session_id: str) -> SequencingStart:
        """What a replay needs to go on sequencing ``session_id`` after what is stored."""
        started = self._conn.execute(
            select(session_events.c.event_id).where(session_events.c.session_id == session_id,
                                                    session_events.c.seq == 0)
        ).scalar()
        fleet = self._conn.execute(select(sessions.c.fleet).where(sessions.c.id == session_id)).scalar()
        return SequencingStart(self.session_position(session_id), started, fleet)

    def snapshot(self, session_ids: Collection[str], session_fields: Sequence[str],
                 turn_fields: Sequence[str]) -> SessionSnapshot:
        """The rows of ``session_ids`` (every session if empty), unbounded: for ``turnlog verify``."""
        wanted = sorted(set(session_ids))
        query = select(sessions.c.id, *(sessions.c[name] for name in session_fields)).order_by(sessions.c.id)
        t = transcript_turns.c
        turn_query = select(t.session_id, *(t[name] for name in turn_fields)).order_by(t.session_id, t.turn_index)
        e = session_events.c
        event_query = select(e.session_id, e.seq, e.epoch, e.type, e.payload).order_by(e.session_id, e.seq)
        if wanted:
            query = query.where(sessions.c.id.in_(wanted))
            turn_query = turn_query.where(t.session_id.in_(wanted))
            event_query = event_query.where(e.session_id.in_(wanted))
        rows = {row.id: {name: row._mapping[name] for name in session_fields} for row in self._conn.execute(query)}
        turns: dict[str, list[dict[str, Any]]] = {}
        for row in self._conn.execute(turn_query):
            turns.setdefault(row.session_id, []).append({name: row._mapping[name] for name in turn_fields})
        events: dict[str, list[tuple[int, int, str, str]]] = {}
        for row in self._conn.execute(event_query):
            events.setdefault(row.session_id, []).append((row.seq, row.epoch, row.type, row.payload))
        return SessionSnapshot(rows, turns, events)

    # -- erasures ----------------------------------------------------------------------------
    def erasure_state(self, session_id: str, fleets: Collection[str] | None = None) -> ErasureState | None:
        """The store's erasure (pending or applied) of the session ``session_id`` of one of
        ``fleets`` (None: of any fleet; an erasure is bound to its fleet), or None."""
        return self._store.erasures.state(self._conn, session_id, fleets)

    def forgotten_among(self, session_ids: Collection[str]) -> set[str]:
        """Those of ``session_ids`` whose session is forgotten or being forgotten, by an erasure of
        its own fleet (:meth:`SqlErasures.forgotten_among <turnlog.sinks.erasure.SqlErasures.forgotten_among>`)."""
        return self._store.erasures.forgotten_among(self._conn, session_ids)

    def erased_sessions(self, session_ids: Collection[str] = ()) -> set[str]:
        """Every session forgotten or being forgotten (of ``session_ids`` if given), by an erasure of
        its own fleet (:meth:`forgotten_among`): another fleet's erasure of a stored session's id
        does not count."""
        ids = sorted(session_ids) if session_ids else sorted(set(self._conn.execute(
            select(erasures.c.session_id)).scalars()))
        forgotten: set[str] = set()
        for start in range(0, len(ids), _IDS_PER_QUERY):
            forgotten |= self.forgotten_among(ids[start:start + _IDS_PER_QUERY])
        return forgotten

    def completed_erasures(self, session_ids: Sequence[str]) -> int:
        """How many of ``session_ids`` the store holds as erased (applied, not pending)."""
        done = 0
        for start in range(0, len(session_ids), _IDS_PER_QUERY):
            chunk = session_ids[start:start + _IDS_PER_QUERY]
            done += self._conn.execute(
                select(func.count()).select_from(erasures)
                .where(erasures.c.session_id.in_(chunk), erasures.c.completed_at.is_not(None))
            ).scalar_one()
        return int(done)

    # -- finalization --------------------------------------------------------------------------
    def finalizable_sessions(self, limit: int = 100) -> list[str]:
        """Ids of sessions ended and complete but not finalized (the finalizer's sweep)."""
        return self._store.finalization.finalizable_sessions(self._conn, limit)

    def unfinalized_sessions(self) -> tuple[int, dt.datetime | None]:
        """``(count, oldest ended_at)`` of the sessions ended but not finalized."""
        return unfinalized_sessions(self._conn)

    def session_ended_at(self, session_id: str) -> dt.datetime | None:
        """The ``ended_at`` stored for ``session_id`` (None: not ended, or no such session)."""
        return session_ended_at(self._conn, session_id)

    # -- offsets and figures ------------------------------------------------------------------
    def stored_offsets(self, consumer_group: str, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """``{(topic, partition): next offset}`` stored for ``consumer_group`` (no locks)."""
        return self._store.offsets.stored_offsets(self._conn, consumer_group, partitions)

    def group_offsets(self, consumer_group: str, topics: Sequence[str]) -> dict[tuple[str, int], int]:
        """``{(topic, partition): next offset}`` of every ``sink_offsets`` row of ``consumer_group``
        on ``topics``: what the lag collector (``turnlog/kafka/lag.py``) compares with the ends."""
        if not topics:
            return {}
        o = sink_offsets.c
        query = select(o.topic, o.partition, o.next_offset).where(
            o.consumer_group == consumer_group, o.topic.in_(sorted(set(topics)))
        )
        return {(r.topic, r.partition): r.next_offset for r in self._conn.execute(query)}

    def fleet_figures(self, fleet: str, *, minutes: int = 60) -> FleetFigures:
        """``fleet``'s analytics (:meth:`AnalyticsProjection.figures
        <turnlog.sinks.analytics.AnalyticsProjection.figures>`)."""
        from turnlog.sinks.analytics import AnalyticsProjection  # it imports the store: not at import time

        return AnalyticsProjection(self._store).figures(self._conn, fleet, minutes=minutes)

    def ping(self) -> None:
        """One round trip to the database (a health check)."""
        self._conn.execute(select(1)).scalar_one()


class StoreWrites(StoreReads):
    """Named reads and writes in one transaction of ``store`` (from :meth:`SqlStore.writing`),
    committed when the caller's block ends without an exception, rolled back otherwise."""

    def claim_epoch(self, session_id: str) -> tuple[int, SessionPosition] | None:
        """Hand out the next epoch of an active session, atomically (its row stays locked to the
        end of the transaction): :meth:`SqlStore.claim_epoch`. None: no such session."""
        return self._store.claim_epoch(self._conn, session_id)

    def finalize_session(self, session_id: str, finalized_at: dt.datetime) -> bool:
        """The guarded finalize (:meth:`SqlStore.finalize_session`): True means this call finalized it."""
        return self._store.finalize_session(self._conn, session_id, finalized_at)

    def apply_batch(
        self, consumer_group: str | None, messages: Sequence[SourceMessage], *, on_rejected: OnRejected | None = None
    ) -> BatchResult:
        """Write a batch of transcript records (:meth:`SqlStore.apply_batch`); ``consumer_group``
        None writes the rows without reading or moving offsets (``turnlog replay``)."""
        return self._store.apply_batch(self._conn, consumer_group, messages, on_rejected=on_rejected)

    def apply_erasures(self, ledger: Sequence[Erasure], now: dt.datetime) -> ErasureResult:
        """Apply the erasure ledger's records to the store (:meth:`SqlErasures.apply
        <turnlog.sinks.erasure.SqlErasures.apply>`): the ids forgotten now, and those refused."""
        return self._store.erasures.apply(self._conn, ledger, now)
