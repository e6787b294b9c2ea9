"""Finalization: a session's aggregates, computed exactly once from its persisted rows.

:meth:`SqlFinalization.finalize_session` is the guarded ``UPDATE ... WHERE
status = 'ended' AND last_seq >= end_seq`` (DESIGN.md, "finalize once"): it
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
matches nothing. The finalizer service (``stream_processors/finalizer.py``)
runs the same guarded ``UPDATE`` as a sweep, one session per transaction, for
stores written otherwise (:meth:`SqlFinalization.finalizable_sessions`).

Nothing here commits. :func:`report_finalized` counts and logs sessions once
their finalization has committed (the caller calls it after the commit).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.engine import Connection

from turnlog import metrics
from turnlog.faults import fault_point
from turnlog.schemas import SessionStatus, TurnStatus
from turnlog.sinks.tables import SecondsBetween, sessions, transcript_turns
from turnlog.tracing import finalization_span

__all__ = ["SqlFinalization", "report_finalized"]

logger = logging.getLogger(__name__)


def report_finalized(session_ids: Iterable[str]) -> None:
    """Count and log sessions whose finalization has committed (call it after the commit)."""
    for session_id in session_ids:
        metrics.SESSIONS_FINALIZED.inc()
        logger.info("finalized %s", session_id)


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
        was finalized already or is not complete yet (DESIGN.md, "finalize once").
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
