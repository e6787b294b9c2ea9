"""Resume claims: where a session stands in the store, and its next epoch.

The store side of a resume (``turnlog/resume_barrier.py``, docs/design.md, "Events":
resume barrier): :meth:`SqlResumeClaims.claim_epoch` hands out the next epoch of an
active session under the session row's lock, so two concurrent resumers get
different epochs and the higher one fences the other. The claim is written in
the caller's transaction (the same one that reads the stored turns); nothing
here commits.
"""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection

from turnlog.schemas import SessionStatus
from turnlog.sinks.interfaces import Dialect, SessionPosition
from turnlog.sinks.tables import sessions, transcript_turns

__all__ = ["SqlResumeClaims"]


class SqlResumeClaims:
    """:class:`~turnlog.sinks.interfaces.ResumeClaims` over the ``sessions`` table."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect

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
            self._dialect.lock(
                select(sessions.c.status, sessions.c.epoch, sessions.c.claimed_epoch).where(sessions.c.id == session_id)
            )
        ).first()
        if row is None:
            return None
        epoch = max(row.epoch, row.claimed_epoch) + 1
        if row.status == SessionStatus.ACTIVE:  # an ended session cannot be resumed: claim nothing
            conn.execute(update(sessions).where(sessions.c.id == session_id).values(claimed_epoch=epoch))
        position = self.session_position(conn, session_id)
        assert position is not None
        return epoch, position
