"""The transcript writer: a batch's rows, as idempotent upserts, then its finalizations.

:meth:`TranscriptWriter.write` is the transcript sink's
:data:`~turnlog.sinks.interfaces.BatchWriter`. It runs inside the offsets
frame (``sinks/offsets.py``), in the batch's one transaction, after the
offsets are locked and the stale records dropped, and before the offsets
move. Its own order:

1. lock the batch's ``sessions`` rows (in id order; a new session's id is
   claimed with a placeholder row first, so two writers of it take turns) and
   merge the batch into them (``last_seq`` = highest contiguous seq applied);
   a session with seqs stored past a gap reads the log for that, after this
   batch's events are in;
2. insert ``session_events`` (dedupe by primary key ``(session_id, seq)``; a
   higher epoch replaces a fenced writer's event at the same seq);
3. upsert ``sessions``;
4. upsert ``transcript_turns`` under the ``(epoch, seq)`` and status guard
   (a stale writer never overwrites, a partial never downgrades a completed
   turn: the rule of :func:`~turnlog.sinks.batch.turn_update_wins`);
5. mark partial turns ``interrupted`` when their writer's epoch is superseded
   or their session has ended;
6. finalize every session of the batch that is now ended and complete
   (:meth:`~turnlog.sinks.interfaces.Finalization.finalize_ready`, after the rows).

Steps 2 to 5 read no results, so they are sent together in one round trip
(:meth:`~turnlog.sinks.interfaces.Dialect.pipeline`: Postgres' pipeline
mode). The sink's transaction waits for the server 6 times per batch
(``BEGIN``, the offsets lock, the sessions lock, the writes, the offsets
and the commit; the sink's pool also skips the liveness check per checkout:
``turnlog sink``), plus 2 in a batch with a new session (its placeholder
and its lock), 1 per session finalized and 1 per gap closed from the log.

Nothing here commits: the rows, the finalizations and the offsets commit
together in the caller's ``engine.begin()`` block (``sinks/base.py``).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy import and_, bindparam, case, func, or_, select, update
from sqlalchemy.engine import Connection, RowMapping

from turnlog import metrics
from turnlog.crypto.envelope import EventOpener
from turnlog.schemas import EventValidationError, SessionStarted, SessionStatus, decode_event
from turnlog.sinks.batch import (
    TURN_COMPLETE,
    TURN_INTERRUPTED,
    TURN_PARTIAL,
    SessionChanges,
    WriteResult,
    advance_contiguous,
    merge_session,
    plan_batch,
    ready_to_finalize,
)
from turnlog.sinks.erasure import SqlErasures
from turnlog.sinks.interfaces import Dialect, Finalization
from turnlog.sinks.source_records import SourceMessage
from turnlog.sinks.tables import session_events, sessions, transcript_turns

__all__ = ["TranscriptWriter"]


class TranscriptWriter:
    """Writes the transcript's rows (``session_events``, ``sessions``,
    ``transcript_turns``) and hands the sessions they complete to ``finalization``."""

    def __init__(
        self, dialect: Dialect, finalization: Finalization, opener: EventOpener | None = None, *,
        erasures: SqlErasures | None = None,
    ) -> None:
        self._dialect = dialect
        self._finalization = finalization
        self._erasures = erasures
        #: opens sealed events (None: each sealed record is refused, to the DLQ)
        self.opener = opener

    def write(self, conn: Connection, messages: Sequence[SourceMessage]) -> WriteResult:
        """Write the transcript rows of ``messages`` (no offsets), then finalize, in
        ``conn``'s transaction, the sessions they leave ended and complete.

        Returns the undecodable records and the sessions finalized here. The
        candidates are the batch's sessions whose merged row is ended and
        complete (:func:`~turnlog.sinks.batch.ready_to_finalize`): the batch
        applied their ``session.ended``, or closed the last gap of a session
        ended before. The decision comes from the decoded events, never from
        the record's bytes; the guarded ``UPDATE`` has the last word.
        """
        if self._erasures is not None:
            messages = self._without_erased(conn, messages)
        plan = plan_batch(messages, self.opener)
        event_rows = plan.event_rows
        session_rows: list[dict[str, Any]] = []
        if plan.sessions:
            stored = self._lock_sessions(conn, sorted(plan.sessions))
            reaches = {sid: _reach(stored.get(sid), changes) for sid, changes in sorted(plan.sessions.items())}
            if event_rows and any(reach.reads_log for reach in reaches.values()):
                # A gap to close from the log: the log must hold this batch's events first.
                self._insert_events(conn, event_rows)
                event_rows = []
            session_rows = self._session_rows(conn, plan.sessions, stored, reaches)
            _stamp_progress(session_rows, stored, dt.datetime.now(dt.UTC))
        # The writes read no results: they go out together, one round trip for all.
        with self._dialect.pipeline(conn):
            if event_rows:
                self._insert_events(conn, event_rows)
            if session_rows:
                conn.execute(self._sessions_upsert, session_rows)
            if plan.turns:
                self._upsert_turns(conn, [t.as_row() for t in plan.turns])
            self._mark_interrupted(conn, plan.sessions)
        ready = {row["id"]: row["ended_at"] for row in session_rows if ready_to_finalize(row)}
        finalized = self._finalization.finalize_ready(conn, list(ready))
        return WriteResult(plan.rejected, finalized, plan.turns_emitted_at, {sid: ready[sid] for sid in finalized})

    def _without_erased(self, conn: Connection, messages: Sequence[SourceMessage]) -> Sequence[SourceMessage]:
        """``messages`` less those of forgotten sessions, which are dropped unread and counted.

        A record names its session by its key (the sequencer admits a record only under its
        session's id); an erasure is bound to its fleet, so a record is dropped when the session's
        fleet (the stored row's, or the batch's ``session.started``) has an erasure of that id,
        or when its fleet is unknown (the rows of a forgotten session are gone; what is still in
        flight of it is dropped)."""
        assert self._erasures is not None
        ids = {m.key.decode("utf-8", "replace") for m in messages if m.key is not None}
        erased = self._erasures.erased_fleets(conn, ids)
        if not erased:
            return messages
        fleets = _session_fleets(conn, messages, set(erased))
        dropped = {sid for sid, forgotten in erased.items() if fleets.get(sid) is None or fleets[sid] in forgotten}
        if not dropped:
            return messages
        kept = [m for m in messages if m.key is None or m.key.decode("utf-8", "replace") not in dropped]
        metrics.ERASED_RECORDS_SKIPPED.labels(component="sink").inc(len(messages) - len(kept))
        return kept

    # The upsert statements are built once per store: building one (its
    # ``excluded`` columns) costs about as much as executing it for a small batch.
    @functools.cached_property
    def _events_upsert(self) -> Any:
        stmt = self._dialect.insert(session_events)
        # A higher epoch replaces a fenced writer's event at the same seq; an
        # equal one is a duplicate and changes nothing.
        return stmt.on_conflict_do_update(
            index_elements=[session_events.c.session_id, session_events.c.seq],
            set_={c: stmt.excluded[c] for c in ("epoch", "event_id", "type", "emitted_at", "payload")},
            where=stmt.excluded.epoch > session_events.c.epoch,
        )

    @functools.cached_property
    def _sessions_upsert(self) -> Any:
        stmt = self._dialect.insert(sessions)
        writable = (
            "fleet",
            "agent_id",
            "started_at",
            "ended_at",
            "end_reason",
            "epoch",
            "last_seq",
            "max_seq",
            "end_seq",
            "metadata",
            "last_applied_at",
        )
        # No IN (...) here: expanding parameters cannot be used with executemany.
        status_kept = or_(sessions.c.status == SessionStatus.FINALIZED, sessions.c.status == SessionStatus.ABANDONED)
        return stmt.on_conflict_do_update(
            index_elements=[sessions.c.id],
            set_={
                **{c: stmt.excluded[c] for c in writable},
                "status": case((status_kept, sessions.c.status), else_=stmt.excluded.status),
            },
        )

    @functools.cached_property
    def _turns_upsert(self) -> Any:
        stmt = self._dialect.insert(transcript_turns)
        t = transcript_turns.c
        new = stmt.excluded
        newer = or_(new.epoch > t.epoch, and_(new.epoch == t.epoch, new.seq > t.seq))
        no_downgrade = or_(t.status != TURN_COMPLETE, new.status != TURN_PARTIAL)
        return stmt.on_conflict_do_update(
            index_elements=[t.session_id, t.turn_index],
            set_={c.name: new[c.name] for c in transcript_turns.c if not c.primary_key},
            where=and_(newer, no_downgrade),
        )

    @functools.cached_property
    def _sessions_claim(self) -> Any:
        """Placeholder ``sessions`` rows for ids without one (``_lock_sessions``)."""
        return self._dialect.insert(sessions).on_conflict_do_nothing(index_elements=[sessions.c.id])

    @functools.cached_property
    def _sessions_locked(self) -> Any:
        """The batch's ``sessions`` rows (``ids``), locked in id order."""
        return self._dialect.lock(
            select(sessions).where(sessions.c.id.in_(bindparam("ids", expanding=True))).order_by(sessions.c.id)
        )

    def _insert_events(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        conn.execute(self._events_upsert, rows)

    def _lock_sessions(self, conn: Connection, ids: list[str]) -> dict[str, RowMapping]:
        """The ``sessions`` rows of ``ids`` (sorted), locked to the end of the transaction.

        An id without a row has nothing to lock: it gets a placeholder row
        (:func:`_placeholder`; replaced by the batch's upsert before the commit,
        so nobody else ever sees it). The insert waits while another writer's
        uncommitted row of that id exists, so two writers of a new session
        (``turnlog replay`` beside the sink, a zombie sink) take turns; the
        second then locks and merges into the first one's committed row,
        never into an empty one.
        """
        stored = {row.id: row._mapping for row in conn.execute(self._sessions_locked, {"ids": ids})}
        missing = [session_id for session_id in ids if session_id not in stored]
        if missing:
            conn.execute(self._sessions_claim, [_placeholder(session_id) for session_id in missing])
            stored.update((row.id, row._mapping) for row in conn.execute(self._sessions_locked, {"ids": missing}))
        return stored

    def _session_rows(
        self,
        conn: Connection,
        changes_by_id: Mapping[str, SessionChanges],
        stored: Mapping[str, RowMapping],
        reaches: Mapping[str, _Reach],
    ) -> list[dict[str, Any]]:
        """The batch's ``sessions`` rows, in the order of ``reaches`` (id order): each
        stored row (``stored``) merged with the batch's changes. Reads the log only
        for a session whose reach says so (the caller has written this batch's events by then)."""
        rows = []
        for session_id, reach in reaches.items():
            changes = changes_by_id[session_id]
            current = stored.get(session_id)
            reached, max_seq = reach.contiguous, reach.max_seq
            if reach.reads_log:
                reached = self._contiguous_from_log(conn, session_id, reached)
                if current is not None and current["max_seq"] is None:
                    max_seq = max(max_seq, self._max_seq_in_log(conn, session_id))
            row = merge_session(current, changes, reached)
            row["max_seq"] = max(max_seq, row["last_seq"])
            rows.append(row)
        return rows

    def _contiguous_from_log(self, conn: Connection, session_id: str, last_seq: int) -> int:
        later = conn.execute(
            select(session_events.c.seq)
            .where(session_events.c.session_id == session_id, session_events.c.seq > last_seq)
            .order_by(session_events.c.seq)
        ).scalars()
        return advance_contiguous(last_seq, later)

    def _max_seq_in_log(self, conn: Connection, session_id: str) -> int:
        found = conn.execute(
            select(func.max(session_events.c.seq)).where(session_events.c.session_id == session_id)
        ).scalar()
        return -1 if found is None else found

    def _upsert_turns(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        conn.execute(self._turns_upsert, rows)

    def _mark_interrupted(self, conn: Connection, changes_by_id: Mapping[str, Any]) -> None:
        for session_id, changes in changes_by_id.items():
            if changes.ended is not None:
                conn.execute(self._interrupt_partials, {"of_session": session_id, "below_epoch": None})
            elif changes.max_epoch > 0:
                conn.execute(self._interrupt_partials, {"of_session": session_id, "below_epoch": changes.max_epoch})

    @functools.cached_property
    def _interrupt_partials(self) -> Any:
        """A session's partial turns become interrupted: every one once it has ended
        (``below_epoch`` NULL), else those of writers below ``below_epoch`` (superseded by a resume)."""
        t = transcript_turns.c
        epoch = bindparam("below_epoch", type_=t.epoch.type)
        return (
            update(transcript_turns)
            .where(t.session_id == bindparam("of_session"), t.status == TURN_PARTIAL,
                   or_(epoch.is_(None), t.epoch < epoch))
            .values(status=TURN_INTERRUPTED)
        )


def _stamp_progress(rows: list[dict[str, Any]], stored: Mapping[str, RowMapping], now: dt.datetime) -> None:
    """Set each row's ``last_applied_at``: ``now`` (this host's clock: the age retention counts for
    a session that never settles) where the batch moved the session's seqs on, else the stored
    value, so a batch of duplicates (a restarted sequencer's re-emission) changes nothing."""
    for row in rows:
        before = stored.get(row["id"])
        kept = None if before is None else before["last_applied_at"]
        if before is not None and (row["last_seq"], row["max_seq"]) == (before["last_seq"], before["max_seq"]):
            row["last_applied_at"] = kept or now
        else:
            row["last_applied_at"] = now


def _placeholder(session_id: str) -> dict[str, Any]:
    """A ``sessions`` row that merges like no row at all (:func:`~turnlog.sinks.batch.merge_session`
    and :func:`_reach` read it as a new session)."""
    return {"id": session_id, "status": SessionStatus.ACTIVE, "epoch": 0, "last_seq": -1, "max_seq": -1}


class _Reach(NamedTuple):
    """How far a batch takes a session's contiguous seqs, from its stored row alone."""

    #: The highest seq reachable from the stored ``last_seq`` through the batch's seqs.
    contiguous: int
    #: The highest seq stored or in the batch.
    max_seq: int
    #: Seqs past a gap are stored (now or before), or the row predates ``max_seq``
    #: (NULL): only the log can say how far the contiguous run goes.
    reads_log: bool


def _reach(current: RowMapping | None, changes: SessionChanges) -> _Reach:
    last_seq = current["last_seq"] if current is not None else -1
    contiguous = advance_contiguous(last_seq, changes.seqs)
    stored_max = current["max_seq"] if current is not None else -1
    max_seq = max(changes.seqs) if stored_max is None else max(stored_max, *changes.seqs)
    return _Reach(contiguous, max_seq, stored_max is None or contiguous < max_seq)


def _session_fleets(conn: Connection, messages: Sequence[SourceMessage], session_ids: set[str]) -> dict[str, str]:
    """``{session id: fleet}`` for those of ``session_ids`` whose fleet is known: the stored row's,
    else the fleet of the ``session.started`` among ``messages``."""
    stored = conn.execute(select(sessions.c.id, sessions.c.fleet).where(sessions.c.id.in_(sorted(session_ids))))
    fleets = {row.id: row.fleet for row in stored if row.fleet is not None}
    for message in messages:
        session_id = message.key.decode("utf-8", "replace") if message.key is not None else None
        if session_id is None or session_id not in session_ids or session_id in fleets:
            continue
        try:
            event = decode_event(message.value)
        except EventValidationError:
            continue  # rejected when the batch is planned
        if isinstance(event, SessionStarted):
            fleets[session_id] = event.fleet
    return fleets
