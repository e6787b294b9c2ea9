"""The SQL store: one transaction per batch, rows and offsets together.

:class:`SqlStore` holds everything the backends share; ``postgres.py`` and
``sqlite.py`` supply the dialect's ``INSERT ... ON CONFLICT`` construct, row
locking and connection set-up.

Order inside :meth:`SqlStore.apply_batch` (one transaction, so all or nothing):

1. lock this consumer group's ``sink_offsets`` rows for the batch's partitions
   and drop records below the stored offsets (a paused, zombie sink re-sending
   an old batch writes nothing);
2. insert ``session_events`` (dedupe by primary key ``(session_id, seq)``);
3. upsert ``sessions`` (``last_seq`` = highest contiguous seq applied);
4. upsert ``transcript_turns`` under the ``(epoch, seq)`` and status guard;
5. mark partial turns ``interrupted`` when their writer's epoch is superseded
   or their session has ended;
6. finalize every session of the batch that is now ended and complete: the
   guarded ``UPDATE`` of :meth:`SqlStore.finalize_session`, after the rows;
7. move ``sink_offsets`` forward (never backward).

Finalization sits in the batch's transaction (DESIGN.md, "finalize once" and
"exactly-once effect in the store"). The aggregates are computed in SQL from
the rows this transaction just wrote, never from running totals; the guard
(``status = 'ended' AND last_seq >= end_seq``) matches once, and the offsets
of the ``session.ended`` (or of the record that closed the session's last gap)
commit with it. A crash before the commit loses the rows, the aggregates and
the offsets together and the batch is applied again; a re-delivered batch is
below the stored offsets, or finds the session ``finalized`` already and
matches nothing. No moment exists where a committed session is ended and
complete but not finalized, and no second consumer of the transcript is needed
to find the ``session.ended``. The finalizer service remains as a sweep for
stores written otherwise (``stream_processors/finalizer.py``).

The Kafka consumer (``sinks/service.py``) never commits offsets to Kafka; on
partition assignment it seeks to the offsets stored here.
"""

from __future__ import annotations

import abc
import datetime as dt
import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, and_, case, func, literal, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql import Select

from turnlog import metrics
from turnlog.faults import fault_point
from turnlog.sinks.batch import (
    TURN_COMPLETE,
    TURN_INTERRUPTED,
    TURN_PARTIAL,
    SourceMessage,
    WriteResult,
    advance_contiguous,
    merge_session,
    next_offsets,
    plan_batch,
    ready_to_finalize,
)
from turnlog.sinks.tables import SecondsBetween, session_events, sessions, sink_offsets, transcript_turns

__all__ = ["SqlStore", "BatchResult", "BatchWriter", "SessionPosition", "WriteResult", "report_finalized"]

logger = logging.getLogger(__name__)


#: Writes the rows of a batch's fresh records in the caller's transaction and
#: says which records it refused and which sessions it finalized
#: (``SqlStore.apply_tracked``).
BatchWriter = Callable[[Connection, Sequence[SourceMessage]], WriteResult]


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What :meth:`SqlStore.apply_batch` did: counts of records, and the sessions
    it finalized (in its transaction: they are finalized once that commits)."""

    applied: int
    stale: int
    rejected: int
    finalized: tuple[str, ...] = ()


def report_finalized(session_ids: Iterable[str]) -> None:
    """Count and log sessions whose finalization has committed (call it after the commit)."""
    for session_id in session_ids:
        metrics.SESSIONS_FINALIZED.inc()
        logger.info("finalized %s", session_id)


@dataclass(frozen=True, slots=True)
class SessionPosition:
    """A session's durable position in the store (the resume point)."""

    session_id: str
    status: str
    epoch: int
    last_seq: int
    max_turn_index: int | None


class SqlStore(abc.ABC):
    """Store operations over one SQLAlchemy engine. Helpers never commit: every
    method takes the caller's connection, whose ``engine.begin()`` block is the
    transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- dialect hooks -----------------------------------------------------
    @abc.abstractmethod
    def insert(self, table: Any) -> Any:
        """The dialect's ``INSERT`` construct with ``on_conflict_do_*``."""

    @abc.abstractmethod
    def lock(self, query: Select[Any]) -> Select[Any]:
        """``query`` with row locks held to the end of the transaction."""

    # -- the batch ---------------------------------------------------------
    def apply_batch(
        self,
        conn: Connection,
        consumer_group: str | None,
        messages: Sequence[SourceMessage],
        *,
        on_rejected: Callable[[SourceMessage, str], None] | None = None,
    ) -> BatchResult:
        """Write one batch of transcript records and their offsets, in ``conn``'s transaction.

        Records below the group's stored offset are skipped (counted ``stale``).
        Undecodable records are handed to ``on_rejected(message, reason)``
        before the offsets move past them (the sink dead-letters them there);
        without it they are logged. Applying the same batch twice leaves the
        store as applying it once. ``consumer_group=None`` writes the rows
        without reading or moving any offsets (``turnlog replay``).
        """
        return self.apply_tracked(conn, consumer_group, messages, self.write_transcript, on_rejected=on_rejected)

    def apply_tracked(
        self,
        conn: Connection,
        consumer_group: str | None,
        messages: Sequence[SourceMessage],
        write: BatchWriter,
        *,
        on_rejected: Callable[[SourceMessage, str], None] | None = None,
    ) -> BatchResult:
        """The offset-in-transaction frame every projection of the transcript shares.

        In ``conn``'s transaction: lock ``consumer_group``'s ``sink_offsets`` rows
        for the batch's partitions, drop records below them, let ``write`` turn
        the rest into rows (it returns the records it refused, with a reason,
        and the sessions it finalized), then move the offsets past the whole
        batch. The transcript sink and the analytics projection
        (``sinks/analytics.py``) are two ``write`` functions over this one frame.
        Sessions in ``BatchResult.finalized`` are finalized once the caller
        commits; :func:`report_finalized` counts them after that.
        """
        stored: dict[tuple[str, int], int] = {}
        if consumer_group is not None:
            partitions = {(m.topic, m.partition) for m in messages}
            stored = self.stored_offsets(conn, consumer_group, partitions, lock=True)
        fresh = [m for m in messages if m.offset >= stored.get((m.topic, m.partition), 0)]
        written = write(conn, fresh)
        rejected = written.rejected
        for refused in rejected:
            m = refused.message
            if on_rejected is not None:
                on_rejected(m, f"invalid: {refused.reason}")
            else:
                logger.error("skipping undecodable record %s[%d]@%d: %s", m.topic, m.partition, m.offset, refused.reason)
        if consumer_group is not None:
            self._advance_offsets(conn, consumer_group, next_offsets(fresh), stored)
        return BatchResult(
            applied=len(fresh) - len(rejected),
            stale=len(messages) - len(fresh),
            rejected=len(rejected),
            finalized=written.finalized,
        )

    def write_transcript(self, conn: Connection, messages: Sequence[SourceMessage]) -> WriteResult:
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
        return WriteResult(plan.rejected, self._finalize_ready(conn, ready))

    def _finalize_ready(self, conn: Connection, session_ids: Sequence[str]) -> tuple[str, ...]:
        """The guarded finalize of each of ``session_ids``, after the batch's rows; those it finalized."""
        if not session_ids:
            return ()
        # When, not what: finalized_at is the one wall-clock value; the
        # aggregates come from the persisted rows and event timestamps.
        finalized_at = dt.datetime.now(dt.timezone.utc)
        done = tuple(sid for sid in session_ids if self.finalize_session(conn, sid, finalized_at))
        if done:
            fault_point("sink.after_finalize")
        return done

    # The upsert statements are built once per store: building one (its
    # ``excluded`` columns) costs about as much as executing it for a small batch.
    @functools.cached_property
    def _events_upsert(self) -> Any:
        stmt = self.insert(session_events)
        # A higher epoch replaces a fenced writer's event at the same seq; an
        # equal one is a duplicate and changes nothing.
        return stmt.on_conflict_do_update(
            index_elements=[session_events.c.session_id, session_events.c.seq],
            set_={c: stmt.excluded[c] for c in ("epoch", "event_id", "type", "emitted_at", "payload")},
            where=stmt.excluded.epoch > session_events.c.epoch,
        )

    @functools.cached_property
    def _sessions_upsert(self) -> Any:
        stmt = self.insert(sessions)
        writable = (
            "fleet", "agent_id", "started_at", "ended_at", "end_reason", "epoch", "last_seq", "max_seq", "end_seq", "metadata",
        )
        # No IN (...) here: expanding parameters cannot be used with executemany.
        status_kept = or_(sessions.c.status == "finalized", sessions.c.status == "abandoned")
        return stmt.on_conflict_do_update(
            index_elements=[sessions.c.id],
            set_={
                **{c: stmt.excluded[c] for c in writable},
                "status": case((status_kept, sessions.c.status), else_=stmt.excluded.status),
            },
        )

    @functools.cached_property
    def _turns_upsert(self) -> Any:
        stmt = self.insert(transcript_turns)
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
    def _offsets_upsert(self) -> Any:
        stmt = self.insert(sink_offsets)
        return stmt.on_conflict_do_update(
            index_elements=[sink_offsets.c.consumer_group, sink_offsets.c.topic, sink_offsets.c.partition],
            set_={"next_offset": stmt.excluded.next_offset},
            where=stmt.excluded.next_offset > sink_offsets.c.next_offset,
        )

    def _insert_events(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        conn.execute(self._events_upsert, rows)

    def _upsert_sessions(self, conn: Connection, changes_by_id: Mapping[str, Any]) -> list[str]:
        """Upsert the batch's ``sessions`` rows (locked, in id order); return the ids the
        rows leave ended and complete (candidates for the guarded finalize)."""
        ids = sorted(changes_by_id)
        query = self.lock(select(sessions).where(sessions.c.id.in_(ids)).order_by(sessions.c.id))
        stored = {row.id: row._mapping for row in conn.execute(query)}
        rows = []
        for session_id in ids:
            changes = changes_by_id[session_id]
            current = stored.get(session_id)
            last_seq = current["last_seq"] if current is not None else -1
            reached = advance_contiguous(last_seq, changes.seqs)
            stored_max = current["max_seq"] if current is not None else -1
            max_seq = max(changes.seqs) if stored_max is None else max(stored_max, *changes.seqs)
            if stored_max is None or reached < max_seq:
                # Seqs past a gap were stored (now or before): the log (step 2
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
        found = conn.execute(select(func.max(session_events.c.seq)).where(session_events.c.session_id == session_id)).scalar()
        return -1 if found is None else found

    def _upsert_turns(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        conn.execute(self._turns_upsert, rows)

    def _mark_interrupted(self, conn: Connection, changes_by_id: Mapping[str, Any]) -> None:
        t = transcript_turns.c
        for session_id, changes in changes_by_id.items():
            if changes.ended is not None:
                superseded = literal(True)
            elif changes.max_epoch > 0:
                superseded = t.epoch < changes.max_epoch
            else:
                continue
            conn.execute(
                update(transcript_turns)
                .where(t.session_id == session_id, t.status == TURN_PARTIAL, superseded)
                .values(status=TURN_INTERRUPTED)
            )

    def _advance_offsets(
        self,
        conn: Connection,
        consumer_group: str,
        next_offsets: Mapping[tuple[str, int], int],
        stored: Mapping[tuple[str, int], int],
    ) -> None:
        rows = [
            {"consumer_group": consumer_group, "topic": topic, "partition": partition, "next_offset": offset}
            for (topic, partition), offset in sorted(next_offsets.items())
            if offset > stored.get((topic, partition), -1)
        ]
        if not rows:
            return
        conn.execute(self._offsets_upsert, rows)

    def skip_records(self, conn: Connection, consumer_group: str, messages: Sequence[SourceMessage]) -> None:
        """Move the group's offsets past ``messages`` without writing their rows
        (for records dead-lettered by the sink)."""
        partitions = {(m.topic, m.partition) for m in messages}
        stored = self.stored_offsets(conn, consumer_group, partitions, lock=True)
        self._advance_offsets(conn, consumer_group, next_offsets(messages), stored)

    # -- reads ---------------------------------------------------------------
    def stored_offsets(
        self, conn: Connection, consumer_group: str, partitions: Iterable[tuple[str, int]], *, lock: bool = False
    ) -> dict[tuple[str, int], int]:
        """``{(topic, partition): next offset}`` stored for ``consumer_group``."""
        wanted = set(partitions)
        if not wanted:
            return {}
        topics = sorted({topic for topic, _ in wanted})
        query = (
            select(sink_offsets.c.topic, sink_offsets.c.partition, sink_offsets.c.next_offset)
            .where(sink_offsets.c.consumer_group == consumer_group, sink_offsets.c.topic.in_(topics))
            .order_by(sink_offsets.c.topic, sink_offsets.c.partition)
        )
        if lock:
            query = self.lock(query)
        return {(r.topic, r.partition): r.next_offset for r in conn.execute(query) if (r.topic, r.partition) in wanted}

    def session_position(self, conn: Connection, session_id: str) -> SessionPosition | None:
        """Where ``session_id`` stands in the store, or None if it has no row."""
        row = conn.execute(
            select(sessions.c.status, sessions.c.epoch, sessions.c.last_seq).where(sessions.c.id == session_id)
        ).first()
        if row is None:
            return None
        max_turn = conn.execute(
            select(func.max(transcript_turns.c.turn_index)).where(transcript_turns.c.session_id == session_id)
        ).scalar()
        return SessionPosition(session_id, row.status, row.epoch, row.last_seq, max_turn)

    def claim_epoch(self, conn: Connection, session_id: str) -> tuple[int, SessionPosition] | None:
        """Hand out the next epoch of an active session, atomically (row lock).

        The new epoch is above both the applied ``epoch`` and every epoch claimed
        before, so two concurrent resumers get different epochs and the higher
        one fences the other. Returns None if the session has no row.
        """
        row = conn.execute(
            self.lock(
                select(sessions.c.status, sessions.c.epoch, sessions.c.claimed_epoch).where(sessions.c.id == session_id)
            )
        ).first()
        if row is None:
            return None
        epoch = max(row.epoch, row.claimed_epoch) + 1
        if row.status == "active":  # an ended session cannot be resumed: claim nothing
            conn.execute(update(sessions).where(sessions.c.id == session_id).values(claimed_epoch=epoch))
        position = self.session_position(conn, session_id)
        assert position is not None
        return epoch, position

    # -- finalization --------------------------------------------------------
    def finalize_session(self, conn: Connection, session_id: str, finalized_at: dt.datetime) -> bool:
        """Compute a session's aggregates from its persisted rows, exactly once.

        The guarded ``UPDATE ... WHERE status = 'ended' AND last_seq >= end_seq``
        matches one row only while the session is ended, complete in the store
        and not yet finalized: True means this call finalized it; False means it
        was finalized already or is not complete yet (DESIGN.md, "finalize once").
        """
        t = transcript_turns.c
        of_session = t.session_id == sessions.c.id
        figures = {
            "turn_count": select(func.count()).where(of_session).scalar_subquery(),
            "interrupted_turn_count": select(func.count())
            .where(of_session, t.status == TURN_INTERRUPTED)
            .scalar_subquery(),
            "input_tokens": select(func.coalesce(func.sum(t.input_tokens), 0)).where(of_session).scalar_subquery(),
            "output_tokens": select(func.coalesce(func.sum(t.output_tokens), 0)).where(of_session).scalar_subquery(),
            "duration_seconds": SecondsBetween(sessions.c.started_at, sessions.c.ended_at),
        }
        result = conn.execute(
            update(sessions)
            .where(
                sessions.c.id == session_id,
                sessions.c.status == "ended",
                sessions.c.end_seq.is_not(None),
                sessions.c.last_seq >= sessions.c.end_seq,
            )
            .values(status="finalized", finalized_at=finalized_at, **figures)
        )
        return result.rowcount == 1

    def finalizable_sessions(self, conn: Connection, limit: int = 100) -> list[str]:
        """Ids of sessions that are ended and complete in the store but not finalized
        (none, once every batch is written by :meth:`write_transcript`; the
        finalizer's sweep looks for them)."""
        query = (
            select(sessions.c.id)
            .where(sessions.c.status == "ended", sessions.c.last_seq >= sessions.c.end_seq)
            .order_by(sessions.c.id)
            .limit(limit)
        )
        return list(conn.execute(query).scalars())
