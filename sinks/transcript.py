"""The transcript writer: a batch's rows, as idempotent upserts, then its finalizations.

:meth:`TranscriptWriter.write` is the transcript sink's
:data:`~turnlog.sinks.interfaces.BatchWriter`. It runs inside the offsets
frame (``sinks/offsets.py``), in the batch's one transaction, after the
offsets are locked and the stale records dropped, and before the offsets
move. Its own order:

1. insert ``session_events`` (dedupe by primary key ``(session_id, seq)``; a
   higher epoch replaces a fenced writer's event at the same seq);
2. upsert ``sessions`` (``last_seq`` = highest contiguous seq applied);
3. upsert ``transcript_turns`` under the ``(epoch, seq)`` and status guard
   (a stale writer never overwrites, a partial never downgrades a completed
   turn: the rule of :func:`~turnlog.sinks.batch.turn_update_wins`);
4. mark partial turns ``interrupted`` when their writer's epoch is superseded
   or their session has ended;
5. finalize every session of the batch that is now ended and complete
   (:meth:`~turnlog.sinks.interfaces.Finalization.finalize_ready`, after the rows).

Nothing here commits: the rows, the finalizations and the offsets commit
together in the caller's ``engine.begin()`` block (``sinks/base.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import and_, bindparam, case, func, or_, select, update
from sqlalchemy.engine import Connection

from turnlog.schemas import SessionStatus
from turnlog.sinks.batch import (
    TURN_COMPLETE,
    TURN_INTERRUPTED,
    TURN_PARTIAL,
    SourceMessage,
    WriteResult,
    advance_contiguous,
    merge_session,
    plan_batch,
    ready_to_finalize,
)
from turnlog.sinks.interfaces import Dialect, Finalization
from turnlog.sinks.tables import session_events, sessions, transcript_turns

__all__ = ["TranscriptWriter"]


class TranscriptWriter:
    """Writes the transcript's rows (``session_events``, ``sessions``,
    ``transcript_turns``) and hands the sessions they complete to ``finalization``."""

    def __init__(self, dialect: Dialect, finalization: Finalization) -> None:
        self._dialect = dialect
        self._finalization = finalization

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
        plan = plan_batch(messages)
        ready: list[str] = []
        if plan.event_rows:
            self._insert_events(conn, plan.event_rows)
        if plan.sessions:
            ready = self._upsert_sessions(conn, plan.sessions)
        if plan.turns:
            self._upsert_turns(conn, [t.as_row() for t in plan.turns])
        self._mark_interrupted(conn, plan.sessions)
        return WriteResult(plan.rejected, self._finalization.finalize_ready(conn, ready))

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
    def _sessions_locked(self) -> Any:
        """The batch's ``sessions`` rows (``ids``), locked in id order."""
        return self._dialect.lock(
            select(sessions).where(sessions.c.id.in_(bindparam("ids", expanding=True))).order_by(sessions.c.id)
        )

    def _insert_events(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        conn.execute(self._events_upsert, rows)

    def _upsert_sessions(self, conn: Connection, changes_by_id: Mapping[str, Any]) -> list[str]:
        """Upsert the batch's ``sessions`` rows (locked, in id order); return the ids the
        rows leave ended and complete (candidates for the guarded finalize)."""
        ids = sorted(changes_by_id)
        stored = {row.id: row._mapping for row in conn.execute(self._sessions_locked, {"ids": ids})}
        rows = []
        for session_id in ids:
            changes = changes_by_id[session_id]
            current = stored.get(session_id)
            last_seq = current["last_seq"] if current is not None else -1
            reached = advance_contiguous(last_seq, changes.seqs)
            stored_max = current["max_seq"] if current is not None else -1
            max_seq = max(changes.seqs) if stored_max is None else max(stored_max, *changes.seqs)
            if stored_max is None or reached < max_seq:
                # Seqs past a gap were stored (now or before): the log (step 1
                # wrote this batch's events already) says how far it closes.
                reached = self._contiguous_from_log(conn, session_id, reached)
                if stored_max is None:
                    max_seq = max(max_seq, self._max_seq_in_log(conn, session_id))
            row = merge_session(current, changes, reached)
            row["max_seq"] = max(max_seq, row["last_seq"])
            rows.append(row)
        conn.execute(self._sessions_upsert, rows)
        return [row["id"] for row in rows if ready_to_finalize(row)]

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
