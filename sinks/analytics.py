"""The analytics projection: per-fleet figures from the ordered transcript.

A second consumer group on ``<prefix>.transcript`` (``turnlog analytics``) runs
:class:`~turnlog.sinks.service.SinkService` with :meth:`AnalyticsProjection.write`
instead of the transcript writer, so it gets the sink's batching, offsets in the
same transaction, retries and dead-lettering unchanged.

Figures, per fleet:

- ``fleet_activity``: sessions started, ended, and active (started, not ended);
- ``fleet_turns_per_minute``: completed turns by the UTC minute they ended in;
- ``fleet_talk_time``: completed turns and talk time (seconds, ``ended_at -
  started_at``) per speaker. Interrupted turns are not counted.

Idempotence: the transcript may carry an event twice (a sequencer restarted
between emit and commit). A figure is incremented only when the keyed row
that counts it is new: ``analytics_sessions`` for a start, its ``ended_at``
going from NULL to a value for an end, ``analytics_turns`` for a turn. With the
offsets in the same transaction, each record's effect lands exactly once.

Erasure: the projection consumes the erasure ledger too (``SinkService``'s
``forget``: :meth:`AnalyticsProjection.forget`). A forgotten session's turns
are taken out of the figures they were counted in (each ``analytics_turns``
row keeps what it added), its start and end out of ``fleet_activity``, and its
``analytics_sessions`` row is marked ``erased_at`` and kept, without times, so
that none of its records counts again, whenever they arrive.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.engine import Connection

from turnlog.schemas import Event, SessionEnded, SessionStarted, TurnCompleted, decode_event
from turnlog.schemas.erasure import Erasure
from turnlog.sinks.base import SqlStore
from turnlog.sinks.batch import RejectedMessage, WriteResult, plan_each
from turnlog.sinks.source_records import SourceMessage
from turnlog.sinks.tables import (
    analytics_sessions,
    analytics_turns,
    fleet_activity,
    fleet_talk_time,
    fleet_turns_per_minute,
)

__all__ = ["AnalyticsProjection", "FleetFigures", "UNKNOWN_FLEET"]

#: Fleet of a turn whose session.started the projection never saw (replayed from mid-log).
UNKNOWN_FLEET = "(unknown)"


@dataclass(frozen=True, slots=True)
class FleetFigures:
    """One fleet's figures. ``turns_per_minute``: ``[(minute start, turns)]``, oldest first;
    ``talk_time``: ``{speaker: (turns, seconds)}``."""

    fleet: str
    active_sessions: int
    started_sessions: int
    ended_sessions: int
    turns_per_minute: list[tuple[dt.datetime, int]]
    talk_time: dict[str, tuple[int, float]]


def _tally(turns: Sequence[Any]) -> tuple[Counter[tuple[str, dt.datetime]], dict[tuple[str, str], list[Any]]]:
    """What ``turns`` (rows with ``fleet``, ``speaker``, ``minute``, ``talk_seconds``) add to the
    figures: ``({(fleet, minute): turns}, {(fleet, speaker): [turns, seconds]})``."""
    per_minute: Counter[tuple[str, dt.datetime]] = Counter()
    talk: dict[tuple[str, str], list[Any]] = {}
    for row in turns:
        per_minute[(row.fleet, row.minute)] += 1
        figures = talk.setdefault((row.fleet, row.speaker), [0, 0.0])
        figures[0] += 1
        figures[1] += row.talk_seconds
    return per_minute, talk


def _decode(message: SourceMessage) -> Event:
    return decode_event(message.value)


class AnalyticsProjection:
    """Writes and reads the analytics tables of ``store``'s database."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    def write(self, conn: Connection, messages: Sequence[SourceMessage]) -> WriteResult:
        """Apply ``messages`` to the figures in ``conn``'s transaction (a ``BatchWriter``;
        it finalizes nothing: finalizing is the transcript sink's). A record that
        fails to decode, in any way, is returned in ``rejected`` with a reason."""
        rejected: list[RejectedMessage] = []
        starts: dict[str, SessionStarted] = {}
        turns: dict[tuple[str, int], TurnCompleted] = {}
        ends: dict[str, SessionEnded] = {}
        # Any failure of one record refuses that record alone (plan_each): the sink's DLQ gets it.
        for _, event in plan_each(messages, _decode, rejected):
            if isinstance(event, SessionStarted):
                starts.setdefault(event.session_id, event)
            elif isinstance(event, TurnCompleted):
                turns.setdefault((event.session_id, event.turn_index), event)
            elif isinstance(event, SessionEnded):
                ends.setdefault(event.session_id, event)
        # A session's start precedes its turns and its end in the transcript, so
        # applying the three kinds in this order keeps each session's order.
        if starts:
            self._count_starts(conn, starts)
        if turns:
            self._count_turns(conn, turns)
        if ends:
            self._count_ends(conn, ends)
        return WriteResult(rejected)

    def forget(self, conn: Connection, ledger: Sequence[Erasure]) -> None:
        """Take the sessions of ``ledger`` out of the figures, in ``conn``'s transaction (the
        ``forget`` of this projection's ``SinkService``); idempotent. An erasure naming another
        fleet than the counted session's changes nothing (an erasure is bound to its fleet)."""
        now = dt.datetime.now(dt.UTC)
        for erasure in sorted({(e.session_id, e.fleet): e for e in ledger}.values(),
                              key=lambda e: (e.session_id, e.fleet)):
            row = conn.execute(
                self.store.lock(select(analytics_sessions).where(analytics_sessions.c.session_id == erasure.session_id))
            ).first()
            if row is None:  # nothing counted yet: a marker row, so nothing ever is
                conn.execute(self.store.insert(analytics_sessions).on_conflict_do_nothing(
                    index_elements=[analytics_sessions.c.session_id]
                ), [{"session_id": erasure.session_id, "fleet": erasure.fleet, "started_at": None,
                     "ended_at": None, "erased_at": now}])
                continue
            if row.erased_at is not None or row.fleet not in (None, erasure.fleet):
                continue
            ended = row.ended_at is not None
            self._add_activity(conn, Counter({row.fleet: 1}), active=0 if ended else -1, started=-1,
                               ended=-1 if ended else 0)
            self._uncount_turns(conn, erasure.session_id)
            conn.execute(
                update(analytics_sessions).where(analytics_sessions.c.session_id == erasure.session_id)
                .values(erased_at=now, started_at=None, ended_at=None)
            )

    def _uncount_turns(self, conn: Connection, session_id: str) -> None:
        t = analytics_turns.c
        counted = conn.execute(
            select(t.fleet, t.speaker, t.minute, t.talk_seconds)
            .where(t.session_id == session_id, t.speaker.is_not(None))
        ).all()
        per_minute, talk = _tally(counted)
        m = fleet_turns_per_minute.c
        for (fleet, minute), n in sorted(per_minute.items()):
            conn.execute(update(fleet_turns_per_minute).where(m.fleet == fleet, m.minute == minute)
                         .values(turns=m.turns - n))
        k = fleet_talk_time.c
        for (fleet, speaker), (n, seconds) in sorted(talk.items()):
            conn.execute(update(fleet_talk_time).where(k.fleet == fleet, k.speaker == speaker)
                         .values(turns=k.turns - n, talk_seconds=k.talk_seconds - seconds))
        conn.execute(delete(analytics_turns).where(t.session_id == session_id))

    def _count_starts(self, conn: Connection, starts: dict[str, SessionStarted]) -> None:
        stmt = self.store.insert(analytics_sessions).on_conflict_do_nothing(
            index_elements=[analytics_sessions.c.session_id]
        )
        rows = [
            {"session_id": s.session_id, "fleet": s.fleet, "started_at": s.started_at, "ended_at": None}
            for s in starts.values()
        ]
        new = conn.execute(stmt.returning(analytics_sessions.c.fleet), rows).scalars().all()
        self._add_activity(conn, Counter(new), active=1, started=1, ended=0)

    def _count_ends(self, conn: Connection, ends: dict[str, SessionEnded]) -> None:
        ended_fleets: Counter[str] = Counter()
        for session_id, event in sorted(ends.items()):
            fleet = conn.execute(
                update(analytics_sessions)
                .where(analytics_sessions.c.session_id == session_id, analytics_sessions.c.ended_at.is_(None),
                       analytics_sessions.c.erased_at.is_(None))
                .values(ended_at=event.ended_at)
                .returning(analytics_sessions.c.fleet)
            ).scalar()
            if fleet is not None:
                ended_fleets[fleet] += 1
        self._add_activity(conn, ended_fleets, active=-1, started=0, ended=1)

    def _add_activity(self, conn: Connection, by_fleet: Counter[str], *, active: int, started: int, ended: int) -> None:
        if not by_fleet:
            return
        t = fleet_activity.c
        stmt = self.store.insert(fleet_activity)
        stmt = stmt.on_conflict_do_update(
            index_elements=[t.fleet],
            set_={
                "active_sessions": t.active_sessions + stmt.excluded.active_sessions,
                "started_sessions": t.started_sessions + stmt.excluded.started_sessions,
                "ended_sessions": t.ended_sessions + stmt.excluded.ended_sessions,
            },
        )
        rows = [
            {"fleet": fleet, "active_sessions": active * n, "started_sessions": started * n,
             "ended_sessions": ended * n}
            for fleet, n in sorted(by_fleet.items())
        ]
        conn.execute(stmt, rows)

    def _count_turns(self, conn: Connection, turns: dict[tuple[str, int], TurnCompleted]) -> None:
        session_ids = sorted({session_id for session_id, _ in turns})
        known = conn.execute(
            select(analytics_sessions.c.session_id, analytics_sessions.c.fleet, analytics_sessions.c.erased_at)
            .where(analytics_sessions.c.session_id.in_(session_ids))
        ).all()
        fleets = {row.session_id: row.fleet for row in known}
        erased = {row.session_id for row in known if row.erased_at is not None}
        stmt = self.store.insert(analytics_turns).on_conflict_do_nothing(
            index_elements=[analytics_turns.c.session_id, analytics_turns.c.turn_index]
        )
        rows = []
        for (session_id, turn_index), turn in sorted(turns.items()):
            if session_id in erased:
                continue
            rows.append({
                "session_id": session_id, "turn_index": turn_index, "fleet": fleets.get(session_id, UNKNOWN_FLEET),
                "speaker": turn.speaker, "minute": turn.ended_at.astimezone(dt.UTC).replace(second=0, microsecond=0),
                "talk_seconds": max(0.0, (turn.ended_at - turn.started_at).total_seconds()),
            })
        if not rows:
            return
        t = analytics_turns.c
        new = conn.execute(stmt.returning(t.fleet, t.speaker, t.minute, t.talk_seconds), rows).all()
        if not new:
            return
        per_minute, talk = _tally(new)
        m = fleet_turns_per_minute.c
        minute_stmt = self.store.insert(fleet_turns_per_minute)
        minute_stmt = minute_stmt.on_conflict_do_update(
            index_elements=[m.fleet, m.minute], set_={"turns": m.turns + minute_stmt.excluded.turns}
        )
        conn.execute(
            minute_stmt,
            [{"fleet": f, "minute": minute, "turns": n} for (f, minute), n in sorted(per_minute.items())],
        )
        k = fleet_talk_time.c
        talk_stmt = self.store.insert(fleet_talk_time)
        talk_stmt = talk_stmt.on_conflict_do_update(
            index_elements=[k.fleet, k.speaker],
            set_={"turns": k.turns + talk_stmt.excluded.turns,
                  "talk_seconds": k.talk_seconds + talk_stmt.excluded.talk_seconds},
        )
        conn.execute(
            talk_stmt,
            [
                {"fleet": f, "speaker": s, "turns": n, "talk_seconds": secs}
                for (f, s), (n, secs) in sorted(talk.items())
            ],
        )

    # -- reads ---------------------------------------------------------------
    def figures(self, conn: Connection, fleet: str, *, minutes: int = 60) -> FleetFigures:
        """``fleet``'s figures; ``turns_per_minute`` holds its last ``minutes`` buckets that have turns."""
        activity = conn.execute(select(fleet_activity).where(fleet_activity.c.fleet == fleet)).first()
        m = fleet_turns_per_minute.c
        recent = conn.execute(
            select(m.minute, m.turns).where(m.fleet == fleet).order_by(m.minute.desc()).limit(minutes)
        ).all()
        k = fleet_talk_time.c
        talk = conn.execute(
            select(k.speaker, k.turns, k.talk_seconds).where(k.fleet == fleet).order_by(k.speaker)
        ).all()
        return FleetFigures(
            fleet=fleet,
            active_sessions=activity.active_sessions if activity else 0,
            started_sessions=activity.started_sessions if activity else 0,
            ended_sessions=activity.ended_sessions if activity else 0,
            turns_per_minute=[(row.minute, row.turns) for row in reversed(recent)],
            talk_time={row.speaker: (row.turns, row.talk_seconds) for row in talk},
        )
