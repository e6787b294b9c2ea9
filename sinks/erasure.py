"""The store's side of erasure: the ``erasures`` table, and forgetting a session's rows.

docs/design.md, "Encryption and erasure". A request inserts a *pending*
``erasures`` row (:meth:`SqlErasures.request`) and its ledger record goes to
``<prefix>.erasures``; the sink consumes the ledger and, in the transaction
that moves its offset, deletes the session's ``session_events``,
``transcript_turns`` and ``sessions`` rows and completes the row
(:meth:`SqlErasures.apply`). From then on the sink stores nothing of the
session again (``sinks/transcript.py``: a record is dropped when its session's
fleet has an erasure row of its id). Each step is idempotent: applying a ledger
record twice, or after a crash between two steps, leaves the store as applying
it once.

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

__all__ = ["SqlErasures", "being_forgotten", "ErasureResult", "ErasureState", "ErasureStatus"]

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


def being_forgotten() -> ColumnElement[bool]:
    """True for a ``sessions`` row with an erasure of its own: one naming the session's fleet, or any
    (the session's fleet is unknown). An erasure is bound to its fleet."""
    return select(erasures.c.session_id).where(
        erasures.c.session_id == sessions.c.id,
        or_(sessions.c.fleet.is_(None), erasures.c.fleet == sessions.c.fleet),
    ).exists()


@dataclass(frozen=True, slots=True)
class ErasureResult:
    """What :meth:`SqlErasures.apply` did: the ids it applied, and the erasures it refused (each
    names a fleet other than the stored session's; nothing of them changed)."""

    applied: tuple[str, ...]
    refused: tuple[Erasure, ...]


class SqlErasures:
    """The ``erasures`` table and the deletes of :meth:`apply`, in the caller's transaction."""

    def __init__(self, store: SqlStore) -> None:
        self._store = store

    def erased_fleets(self, conn: Connection, session_ids: Collection[str]) -> dict[str, set[str]]:
        """``{session id: the fleets whose session of that id is forgotten or being forgotten}``
        for those of ``session_ids`` with an erasure row (an erasure is bound to its fleet)."""
        if not session_ids:
            return {}
        found: dict[str, set[str]] = {}
        rows = conn.execute(
            select(erasures.c.session_id, erasures.c.fleet).where(erasures.c.session_id.in_(sorted(session_ids)))
        )
        for row in rows:
            found.setdefault(row.session_id, set()).add(row.fleet)
        return found

    def forgotten_among(self, conn: Connection, session_ids: Collection[str]) -> set[str]:
        """The ids of ``session_ids`` whose session is forgotten or being forgotten: an erasure row
        names the stored session's fleet, or the store holds no session of the id (or one of no
        known fleet) and some fleet's erasure of it. Another fleet's erasure of a stored
        session's id does not count: an erasure is bound to its fleet."""
        erased = self.erased_fleets(conn, session_ids)
        if not erased:
            return set()
        stored = conn.execute(select(sessions.c.id, sessions.c.fleet).where(sessions.c.id.in_(sorted(erased))))
        fleets = {row.id: row.fleet for row in stored}
        return {sid for sid, forgotten in erased.items() if fleets.get(sid) is None or fleets[sid] in forgotten}

    def state(self, conn: Connection, session_id: str, fleets: Collection[str] | None = None) -> ErasureState | None:
        """The erasure of fleet ``fleets``' session ``session_id`` (None: of any fleet), the latest
        asked for if several fleets forgot that id; None if none was asked for."""
        query = select(erasures).where(erasures.c.session_id == session_id)
        if fleets is not None:
            query = query.where(erasures.c.fleet.in_(sorted(fleets)))
        row = conn.execute(query.order_by(erasures.c.requested_at.desc(), erasures.c.fleet)).mappings().first()
        return None if row is None else ErasureState(**row)

    def request(self, conn: Connection, erasure: Erasure) -> bool:
        """Record ``erasure`` as pending (not yet published, not applied); False if the
        fleet's session already has an erasure row (that one stands, whoever asked)."""
        stmt = self._store.insert(erasures).on_conflict_do_nothing(
            index_elements=[erasures.c.session_id, erasures.c.fleet]
        )
        inserted = conn.execute(stmt.returning(erasures.c.session_id), [_row(erasure)]).first()
        return inserted is not None

    def mark_published(self, conn: Connection, keys: Collection[tuple[str, str]], at: dt.datetime) -> None:
        """The broker acknowledged the ledger records of ``keys``: ``(session id, fleet)`` pairs."""
        for session_id, fleet in sorted(set(keys)):
            conn.execute(
                update(erasures)
                .where(erasures.c.session_id == session_id, erasures.c.fleet == fleet,
                       erasures.c.published_at.is_(None))
                .values(published_at=at)
            )

    def unpublished(self, conn: Connection, limit: int = 500) -> list[Erasure]:
        """Erasures whose ledger record the broker has not acknowledged yet (oldest first)."""
        rows = conn.execute(
            select(erasures).where(erasures.c.published_at.is_(None)).order_by(erasures.c.requested_at).limit(limit)
        ).mappings()
        return [ErasureState(**row).as_erasure() for row in rows]

    def apply(self, conn: Connection, ledger: Sequence[Erasure], now: dt.datetime) -> ErasureResult:
        """Forget each session of ``ledger``: delete its events, turns and row, and complete
        its ``erasures`` row (inserted if the request never reached this store).

        An erasure is bound to the fleet it names: one whose session the store holds under
        another fleet changes nothing and is returned in ``refused`` (the sink dead-letters
        its record). One whose session the store does not hold is recorded (the session may
        be in flight; the sink then stores nothing of that fleet's session of that id).
        """
        wanted: dict[tuple[str, str], Erasure] = {}
        for erasure in ledger:
            wanted.setdefault((erasure.session_id, erasure.fleet), erasure)
        if not wanted:
            return ErasureResult((), ())
        ids = sorted({session_id for session_id, _ in wanted})
        stored = conn.execute(select(sessions.c.id, sessions.c.fleet).where(sessions.c.id.in_(ids)))
        stored_fleets = {row.id: row.fleet for row in stored}
        refused = [erasure for (sid, fleet), erasure in sorted(wanted.items())
                   if stored_fleets.get(sid) not in (None, fleet)]
        applied = [key for key in sorted(wanted) if stored_fleets.get(key[0]) in (None, key[1])]
        if not applied:
            return ErasureResult((), tuple(refused))
        deleted = sorted({sid for sid, _ in applied if sid in stored_fleets})
        if deleted:
            conn.execute(delete(session_events).where(session_events.c.session_id.in_(deleted)))
            conn.execute(delete(transcript_turns).where(transcript_turns.c.session_id.in_(deleted)))
            conn.execute(delete(sessions).where(sessions.c.id.in_(deleted)))
        stmt = self._store.insert(erasures)
        stmt = stmt.on_conflict_do_update(
            index_elements=[erasures.c.session_id, erasures.c.fleet],
            set_={
                "completed_at": func.coalesce(erasures.c.completed_at, stmt.excluded.completed_at),
                "published_at": func.coalesce(erasures.c.published_at, stmt.excluded.published_at),
            },
        )
        conn.execute(stmt, [_row(wanted[key], published_at=now, completed_at=now) for key in applied])
        return ErasureResult(tuple(sid for sid, _ in applied), tuple(refused))

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
        not_erased = ~select(erasures.c.session_id).where(
            erasures.c.session_id == sessions.c.id, erasures.c.fleet == sessions.c.fleet
        ).exists()
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
