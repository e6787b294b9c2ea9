"""Finalization: a session's aggregates, computed exactly once from its persisted rows.

:meth:`SqlFinalization.finalize_session` is the guarded ``UPDATE ... WHERE
status = 'ended' AND last_seq >= end_seq`` (docs/design.md, "Guarantees": finalize once): it
matches one row only while the session is ended, complete in the store and
not yet finalized.

Where it runs, and the commit order: the sink calls
:meth:`SqlFinalization.finalize_ready` inside its batch's transaction, after
the batch's rows are written (``sinks/transcript.py``) and before the offsets
move (``sinks/offsets.py``). The aggregates are computed in SQL from the rows
this transaction just wrote, never from running totals, and the offsets of
the ``session.ended`` (or of the record that closed the session's last gap)
commit with them. A crash before the commit loses the rows, the aggregates and
the offsets together and the batch is applied again; a re-delivered batch is
below the stored offsets, or finds the session ``finalized`` already and
matches nothing. The sweep (``sinks/sweep.py``, run by the finalizer service)
runs the same guarded ``UPDATE`` as a sweep, one session per transaction, for
stores written otherwise (:meth:`SqlFinalization.finalizable_sessions`).

Nothing here commits. :func:`report_finalized` counts and logs sessions once
their finalization has committed (the caller calls it after the commit).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.engine import Connection

from turnlog import metrics
from turnlog.faults import fault_point
from turnlog.schemas import SessionStatus, TurnStatus
from turnlog.sinks.tables import SecondsBetween, sessions, transcript_turns
from turnlog.tracing import finalization_span

__all__ = ["SqlFinalization", "report_finalized", "report_turns_stored", "session_ended_at", "unfinalized_sessions"]

logger = logging.getLogger(__name__)


def report_finalized(session_ids: Iterable[str], ended_at: Mapping[str, dt.datetime] | None = None) -> None:
    """Count and log sessions whose finalization has committed (call it right after the commit).

    With ``ended_at`` (a session's ``ended_at``, the agent's clock), each session found there is
    observed in ``turnlog_finalization_delay_seconds``: now (this host's clock, just after the
    commit) minus its ``ended_at``, at least 0 (the agent's clock may run ahead of this host's).
    """
    committed_at = time.time()
    for session_id in session_ids:
        metrics.SESSIONS_FINALIZED.inc()
        logger.info("finalized %s", session_id)
        ended = None if ended_at is None else ended_at.get(session_id)
        if ended is not None:
            metrics.FINALIZATION_DELAY_SECONDS.observe(max(0.0, committed_at - ended.timestamp()))


def report_turns_stored(emitted_at: Iterable[dt.datetime]) -> None:
    """Observe each completed turn a committed batch stored in ``turnlog_sink_turn_to_store_seconds``:
    now (this host's clock, just after the commit) minus the ``turn.completed`` event's
    ``emitted_at`` (the agent's clock), at least 0: clocks of different hosts may disagree,
    and a skewed agent clock must not yield a negative latency. Call it right after the commit."""
    committed_at = time.time()
    observe = metrics.TURN_TO_STORE_SECONDS.observe
    for emitted in emitted_at:
        observe(max(0.0, committed_at - emitted.timestamp()))


class SqlFinalization:
    """:class:`~turnlog.sinks.interfaces.Finalization` over the ``sessions`` and
    ``transcript_turns`` tables (plain SQL: no dialect hook needed)."""

    def finalize_ready(self, conn: Connection, session_ids: Sequence[str]) -> tuple[str, ...]:
        """The guarded finalize of each of ``session_ids``, after the batch's rows; those it finalized."""
        if not session_ids:
            return ()
        # When, not what: finalized_at is the one wall-clock value; the
        # aggregates come from the persisted rows and event timestamps.
        finalized_at = dt.datetime.now(dt.UTC)
        done = tuple(sid for sid in session_ids if self._finalize_traced(conn, sid, finalized_at))
        if done:
            fault_point("sink.after_finalize")
        return done

    def _finalize_traced(self, conn: Connection, session_id: str, finalized_at: dt.datetime) -> bool:
        """:meth:`finalize_session` inside a ``finalize`` span when the sink's batch is traced
        (``turnlog.tracing.finalization_span``: linked to the session's ``session.ended`` record)."""
        with finalization_span(session_id) as span:
            done = self.finalize_session(conn, session_id, finalized_at)
            if span is not None:
                span.set({"turnlog.finalized": done})
            return done

    def finalize_session(self, conn: Connection, session_id: str, finalized_at: dt.datetime) -> bool:
        """Compute a session's aggregates from its persisted rows, exactly once.

        The guarded ``UPDATE ... WHERE status = 'ended' AND last_seq >= end_seq``
        matches one row only while the session is ended, complete in the store
        and not yet finalized: True means this call finalized it; False means it
        was finalized already or is not complete yet (docs/design.md, "Guarantees": finalize once).
        """
        result = conn.execute(self._finalize, {"finalized_session": session_id, "finalized_time": finalized_at})
        return result.rowcount == 1

    @functools.cached_property
    def _finalize(self) -> Any:
        """The guarded finalize of ``finalized_session`` at ``finalized_time`` (built once: its
        subqueries cost more to build than to run)."""
        t = transcript_turns.c
        of_session = t.session_id == sessions.c.id
        figures = {
            "turn_count": select(func.count()).where(of_session).scalar_subquery(),
            "interrupted_turn_count": select(func.count())
            .where(of_session, t.status == TurnStatus.INTERRUPTED)
            .scalar_subquery(),
            "input_tokens": select(func.coalesce(func.sum(t.input_tokens), 0)).where(of_session).scalar_subquery(),
            "output_tokens": select(func.coalesce(func.sum(t.output_tokens), 0)).where(of_session).scalar_subquery(),
            "duration_seconds": SecondsBetween(sessions.c.started_at, sessions.c.ended_at),
        }
        return (
            update(sessions)
            .where(
                sessions.c.id == bindparam("finalized_session"),
                sessions.c.status == SessionStatus.ENDED,
                sessions.c.end_seq.is_not(None),
                sessions.c.last_seq >= sessions.c.end_seq,
            )
            .values(status=SessionStatus.FINALIZED, finalized_at=bindparam("finalized_time"), **figures)
        )

    def finalizable_sessions(self, conn: Connection, limit: int = 100) -> list[str]:
        """Ids of sessions that are ended and complete in the store but not finalized
        (none, once every batch is written by the transcript writer; the
        finalizer's sweep looks for them)."""
        query = (
            select(sessions.c.id)
            .where(sessions.c.status == SessionStatus.ENDED, sessions.c.last_seq >= sessions.c.end_seq)
            .order_by(sessions.c.id)
            .limit(limit)
        )
        return list(conn.execute(query).scalars())


def unfinalized_sessions(conn: Connection) -> tuple[int, dt.datetime | None]:
    """``(count, oldest ended_at)`` of the sessions ended in the store but not finalized
    (complete or still waiting for a gap: status ``ended``); ``(0, None)`` when there are none.
    One aggregate over ``ix_sessions_status`` (the finalizer's sweep reports it)."""
    row = conn.execute(
        select(func.count(), func.min(sessions.c.ended_at)).where(sessions.c.status == SessionStatus.ENDED)
    ).one()
    oldest = row[1]
    if isinstance(oldest, str):  # SQLite's min() of a UtcDateTime column comes back as its text
        oldest = dt.datetime.fromisoformat(oldest).replace(tzinfo=dt.UTC)
    return int(row[0]), oldest


def session_ended_at(conn: Connection, session_id: str) -> dt.datetime | None:
    """The ``ended_at`` the store holds for ``session_id`` (None: not ended, or no such session)."""
    return conn.execute(select(sessions.c.ended_at).where(sessions.c.id == session_id)).scalar()
