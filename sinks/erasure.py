"""The store's side of erasure: the ``erasures`` table, and forgetting a session's rows.

docs/design.md, "Encryption and erasure". A request inserts a *pending*
``erasures`` row (:meth:`SqlErasures.request`) and its ledger record goes to
``<prefix>.erasures``; the sink consumes the ledger and, in the transaction
that moves its offset, deletes the session's ``session_events``,
``transcript_turns`` and ``sessions`` rows and completes the row
(:meth:`SqlErasures.apply`). From then on the sink stores nothing of the
session again (:meth:`SqlErasures.erased_among`). Each step is idempotent:
applying a ledger record twice, or after a crash between two steps, leaves
the store as applying it once.

The analytics projection forgets its own figures of a session in its own
transaction (``sinks/analytics.py``). Nothing here reads or logs content.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from sqlalchemy import ColumnElement, and_, case, delete, func, or_, select, update
from sqlalchemy.engine import Connection

from turnlog.schemas import SessionStatus
from turnlog.schemas.erasure import Erasure
from turnlog.sinks.tables import erasures, session_events, sessions, transcript_turns

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from turnlog.sinks.base import SqlStore

__all__ = ["SqlErasures", "ErasureState", "ErasureStatus"]

#: ``pending``: asked, not yet applied to the store; ``done``: the store holds nothing of the session.
ErasureStatus = Literal["pending", "done"]


@dataclass(frozen=True, slots=True)
class ErasureState:
    """One ``erasures`` row, as operators and the API report it (never content)."""

    session_id: str
    fleet: str
    requested_by: str
    requested_at: dt.datetime
    reason: str
    published_at: dt.datetime | None
    completed_at: dt.datetime | None

    @property
    def status(self) -> ErasureStatus:
        return "done" if self.completed_at is not None else "pending"

    def as_erasure(self) -> Erasure:
        return Erasure(session_id=self.session_id, fleet=self.fleet, requested_by=self.requested_by,
                       requested_at=self.requested_at, reason="retention" if self.reason == "retention" else "request")


class SqlErasures:
    """The ``erasures`` table and the deletes of :meth:`apply`, in the caller's transaction."""

    def __init__(self, store: SqlStore) -> None:
        self._store = store

    def erased_among(self, conn: Connection, session_ids: Collection[str]) -> set[str]:
        """The ids of ``session_ids`` that were forgotten, or are being forgotten (any ``erasures`` row)."""
        if not session_ids:
            return set()
        found = conn.execute(select(erasures.c.session_id).where(erasures.c.session_id.in_(sorted(session_ids))))
        return set(found.scalars())

    def state(self, conn: Connection, session_id: str) -> ErasureState | None:
        """The erasure of ``session_id``, or None if it was never asked for."""
        row = conn.execute(select(erasures).where(erasures.c.session_id == session_id)).mappings().first()
        return None if row is None else ErasureState(**row)

    def request(self, conn: Connection, erasure: Erasure) -> bool:
        """Record ``erasure`` as pending (not yet published, not applied); False if the
        session already has an erasure row (that one stands, whoever asked)."""
        stmt = self._store.insert(erasures).on_conflict_do_nothing(index_elements=[erasures.c.session_id])
        inserted = conn.execute(stmt.returning(erasures.c.session_id), [_row(erasure)]).first()
        return inserted is not None

    def mark_published(self, conn: Connection, session_ids: Collection[str], at: dt.datetime) -> None:
        """The broker acknowledged the ledger records of ``session_ids``."""
        if session_ids:
            conn.execute(
                update(erasures)
                .where(erasures.c.session_id.in_(sorted(session_ids)), erasures.c.published_at.is_(None))
                .values(published_at=at)
            )

    def unpublished(self, conn: Connection, limit: int = 500) -> list[Erasure]:
        """Erasures whose ledger record the broker has not acknowledged yet (oldest first)."""
        rows = conn.execute(
            select(erasures).where(erasures.c.published_at.is_(None)).order_by(erasures.c.requested_at).limit(limit)
        ).mappings()
        return [ErasureState(**row).as_erasure() for row in rows]

    def apply(self, conn: Connection, ledger: Sequence[Erasure], now: dt.datetime) -> list[str]:
        """Forget each session of ``ledger``: delete its events, turns and row, and complete
        its ``erasures`` row (inserted if the request never reached this store). Returns the
        ids applied; an erasure naming another fleet than the stored session's is not
        applied (the request's scope check was for that fleet, not this session).
        """
        wanted: dict[str, Erasure] = {}
        for erasure in ledger:
            wanted.setdefault(erasure.session_id, erasure)
        if not wanted:
            return []
        ids = sorted(wanted)
        stored = conn.execute(select(sessions.c.id, sessions.c.fleet).where(sessions.c.id.in_(ids)))
        stored_fleets = {row.id: row.fleet for row in stored}
        applied = [sid for sid in ids if stored_fleets.get(sid) in (None, wanted[sid].fleet)]
        for sid in sorted(set(ids) - set(applied)):
            logger.warning("erasure of %s refused: it names fleet %s, the stored session is fleet %s's (the request "
                           "was scoped to the wrong fleet; ask again with the right one)", sid, wanted[sid].fleet,
                           stored_fleets[sid])
        if not applied:
            return []
        conn.execute(delete(session_events).where(session_events.c.session_id.in_(applied)))
        conn.execute(delete(transcript_turns).where(transcript_turns.c.session_id.in_(applied)))
        conn.execute(delete(sessions).where(sessions.c.id.in_(applied)))
        stmt = self._store.insert(erasures)
        stmt = stmt.on_conflict_do_update(
            index_elements=[erasures.c.session_id],
            set_={
                "completed_at": func.coalesce(erasures.c.completed_at, stmt.excluded.completed_at),
                "published_at": func.coalesce(erasures.c.published_at, stmt.excluded.published_at),
            },
        )
        conn.execute(stmt, [_row(wanted[sid], published_at=now, completed_at=now) for sid in applied])
        return applied

    def expired(
        self, conn: Connection, default_cutoff: dt.datetime | None, fleet_cutoffs: Mapping[str, dt.datetime],
        limit: int = 500,
    ) -> list[tuple[str, str]]:
        """``(session_id, fleet)`` of the sessions past their fleet's cutoff (``fleet_cutoffs``,
        else ``default_cutoff``; None: no policy) that have no erasure yet: the retention
        sweep's candidates, oldest first, at most ``limit``.

        A settled session (finalized or abandoned) is past the cutoff when it ended before it.
        ``ended_at`` is the agent's word; a session the sink finalized before the cutoff
        (``finalized_at``, the store's clock) is past it too, so an ``ended_at`` in the future
        (a skewed clock, a hostile agent) cannot keep a session past the policy. A settled
        session whose ``ended_at`` is unset never expires.

        A session that never settled (its agent crashed and was never resumed, or its end
        never became complete) is past the cutoff when the sink last applied an event of it
        before the cutoff (``last_applied_at``, the sink host's clock). A session whose
        ``session.started`` was never applied has no fleet, so no fleet's policy, and is left to
        ``turnlog forget``."""
        settled = sessions.c.status.in_([SessionStatus.FINALIZED, SessionStatus.ABANDONED])

        def before(cutoff: dt.datetime) -> ColumnElement[bool]:
            ended_before = and_(settled, sessions.c.ended_at.is_not(None),
                                or_(sessions.c.ended_at < cutoff, sessions.c.finalized_at < cutoff))
            idle_since = and_(~settled, sessions.c.last_applied_at < cutoff)
            return or_(ended_before, idle_since)

        by_fleet = [and_(sessions.c.fleet == fleet, before(cutoff)) for fleet, cutoff in sorted(fleet_cutoffs.items())]
        if default_cutoff is not None:
            others = sessions.c.fleet.not_in(sorted(fleet_cutoffs)) if fleet_cutoffs else sessions.c.fleet.is_not(None)
            by_fleet.append(and_(others, before(default_cutoff)))
        if not by_fleet:
            return []
        not_erased = ~select(erasures.c.session_id).where(erasures.c.session_id == sessions.c.id).exists()
        age = case((settled, sessions.c.ended_at), else_=sessions.c.last_applied_at)
        rows = conn.execute(
            select(sessions.c.id, sessions.c.fleet)
            .where(or_(*by_fleet), not_erased)
            .order_by(age, sessions.c.id)
            .limit(limit)
        ).all()
        return [(row.id, row.fleet) for row in rows]


def _row(erasure: Erasure, *, published_at: dt.datetime | None = None,
         completed_at: dt.datetime | None = None) -> dict[str, object]:
    return {
        "session_id": erasure.session_id, "fleet": erasure.fleet, "requested_by": erasure.requested_by,
        "requested_at": erasure.requested_at, "reason": erasure.reason, "published_at": published_at,
        "completed_at": completed_at,
    }
