"""The direct peer: the design a user would pick instead of turnlog.

Each agent writes its own session straight into Postgres, one transaction per
event, with the seed's idempotent statements (the sink's, ``sinks/base.py``):

- the event into ``session_events``: ``ON CONFLICT (session_id, seq) DO UPDATE``
  only for a higher epoch;
- the turn into ``transcript_turns``: ``ON CONFLICT (session_id, turn_index) DO
  UPDATE`` only when newer by ``(epoch, seq)``, and never a completed turn back
  to a partial;
- at the session's start and end, its ``sessions`` row.

The agent writes what it has at each event, as a user would without a log in
between: every partial the workload flushes is a commit, as is each completed
turn, and the agent awaits each commit before it goes on (as
``complete_turn`` awaits its ack). No Kafka, no spool, no sequencer: the
database is the only durable copy and its commit is the acknowledgement.

The workload is the pipeline's: the same ``SessionPlan`` s replayed on the
same open-loop compressed clock as ``load.py`` (same partial steps), so a
session count offers the same rate to both designs. The agents share a fixed
set of connections (``connections``): a thousand agents holding one each
would exhaust ``max_connections`` (100 here); a user would put PgBouncer in
transaction mode in front, and a pool is what that looks like to Postgres.
Statements go in pipeline mode (one round trip per transaction plus the
commit's), the best case for this design.

What it measures (:class:`DirectResult`): the commit latency of each completed
turn (from the moment the agent has the turn to its commit returning), the
transactions it committed, and how far behind its clock each write started
(lateness). Lateness that keeps growing means the writes do not keep up:
the phase's rate is sustained when its slope is flat, by the pipeline's 2 %
rule (:func:`lateness_flat`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Json

from turnlog.schemas import (
    SessionEnded,
    SessionStarted,
    SessionStatus,
    TurnCompleted,
    TurnPartial,
    TurnStatus,
    encode_event,
)
from turnlog.schemas.session_keys import session_key
from turnlog.sinks.batch import TurnRow
from turnlog.tools.bench.baselines import percentile
from turnlog.tools.bench.load import _sleep_until
from turnlog.tools.bench.workload import BENCH_FLEET, SessionPlan
from turnlog.tools.demo.transcripts import token_counts

__all__ = [
    "DirectResult",
    "DirectPool",
    "run_direct",
    "direct_summary",
    "least_squares_slope",
    "lateness_flat",
    "EVENT_SQL",
    "TURN_SQL",
    "SESSION_START_SQL",
    "SESSION_END_SQL",
]

#: Lateness may grow by at most this many seconds per second and still count as flat
#: (the pipeline's rule: lag growing by at most 2 % of the offered rate).
FLAT_LATENESS_SLOPE = 0.02

_EVENT_COLUMNS = ("session_id", "seq", "epoch", "event_id", "type", "emitted_at", "payload")
_TURN_COLUMNS = TurnRow.__slots__


def _values(columns: Sequence[str]) -> str:
    return "VALUES (" + ", ".join(f"%({c})s" for c in columns) + ")"


EVENT_SQL = (
    f"INSERT INTO session_events ({', '.join(_EVENT_COLUMNS)}) {_values(_EVENT_COLUMNS)}"
    " ON CONFLICT (session_id, seq) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in ("epoch", "event_id", "type", "emitted_at", "payload"))
    + " WHERE EXCLUDED.epoch > session_events.epoch"
)
TURN_SQL = (
    f"INSERT INTO transcript_turns ({', '.join(_TURN_COLUMNS)}) {_values(_TURN_COLUMNS)}"
    " ON CONFLICT (session_id, turn_index) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _TURN_COLUMNS if c not in ("session_id", "turn_index"))
    + " WHERE (EXCLUDED.epoch > transcript_turns.epoch"
    " OR (EXCLUDED.epoch = transcript_turns.epoch AND EXCLUDED.seq > transcript_turns.seq))"
    f" AND (transcript_turns.status <> '{TurnStatus.COMPLETE}'"
    f" OR EXCLUDED.status <> '{TurnStatus.PARTIAL}')"
)
SESSION_START_SQL = (
    "INSERT INTO sessions (id, fleet, agent_id, status, started_at, epoch, last_seq, max_seq)"
    f" VALUES (%(id)s, %(fleet)s, %(agent_id)s, '{SessionStatus.ACTIVE}', %(started_at)s, %(epoch)s,"
    " %(seq)s, %(seq)s)"
    " ON CONFLICT (id) DO NOTHING"
)
SESSION_END_SQL = (
    "INSERT INTO sessions (id, fleet, agent_id, status, ended_at, end_reason, epoch, last_seq, max_seq, end_seq)"
    f" VALUES (%(id)s, %(fleet)s, %(agent_id)s, '{SessionStatus.ENDED}', %(ended_at)s, %(end_reason)s,"
    " %(epoch)s, %(seq)s, %(seq)s, %(seq)s)"
    f" ON CONFLICT (id) DO UPDATE SET status = '{SessionStatus.ENDED}', ended_at = EXCLUDED.ended_at,"
    " end_reason = EXCLUDED.end_reason,"
    " last_seq = GREATEST(sessions.last_seq, EXCLUDED.last_seq),"
    " max_seq = GREATEST(sessions.max_seq, EXCLUDED.max_seq),"
    " end_seq = EXCLUDED.end_seq WHERE EXCLUDED.epoch >= sessions.epoch"
)


@dataclass(slots=True)
class DirectResult:
    """What the direct agents wrote. Times are ``time.monotonic()`` seconds."""

    seconds: float = 0.0
    events: int = 0
    turns: int = 0
    #: Transactions committed (one per event).
    transactions: int = 0
    #: the keys of the sessions written
    sessions: list[str] = field(default_factory=list)
    #: Milliseconds from the agent having a completed turn to its commit returning.
    commit_ms: list[float] = field(default_factory=list)
    #: Milliseconds of every write (partials, starts and ends too).
    write_ms: list[float] = field(default_factory=list)
    #: When each commit returned (monotonic): the committed rate over a window.
    committed_at: list[float] = field(default_factory=list)
    #: ``(due, seconds late)`` of each write: when the clock said to write, how late it began.
    lateness: list[tuple[float, float]] = field(default_factory=list)

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


class DirectPool:
    """The agents' shared connections (PgBouncer's view); a write waits for a free one.

    No I/O in the constructor: :meth:`open` connects, :meth:`close` closes.
    """

    def __init__(self, dsn: str, connections: int) -> None:
        self.dsn = dsn
        self.size = connections
        self._free: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
        self._all: list[psycopg.AsyncConnection[Any]] = []

    async def open(self) -> DirectPool:
        for _ in range(self.size):
            conn = await psycopg.AsyncConnection.connect(self.dsn)
            self._all.append(conn)
            self._free.put_nowait(conn)
        return self

    async def close(self) -> None:
        for conn in self._all:
            await conn.close()
        self._all.clear()

    async def __aenter__(self) -> DirectPool:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def write(self, statements: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Run ``statements`` in one transaction and commit it (pipeline mode)."""
        conn = await self._free.get()
        try:
            async with conn.pipeline():
                for sql, params in statements:
                    await conn.execute(sql, params)
                await conn.commit()
        except BaseException:
            await conn.rollback()
            raise
        finally:
            self._free.put_nowait(conn)


async def run_direct(
    dsn: str,
    plans: list[SessionPlan],
    *,
    speed: float,
    flush_interval: float,
    seconds: float,
    tag: str,
    connections: int = 16,
    paced: bool = True,
) -> DirectResult:
    """Replay ``plans`` concurrently for ``seconds`` as direct agents; session ids get ``tag``
    (``SessionPlan.replay_id``), and each is written under its key, as the pipeline stores it.

    ``paced=False`` drops the clock: each agent writes its events back to back,
    which gives the design's capacity (the pool and this process's core are
    the limit).
    """
    result = DirectResult()
    stop_at = time.monotonic() + seconds
    stop = asyncio.Event()  # never set: the phase ends at stop_at
    async with DirectPool(dsn, connections) as pool:

        async def drive(slot: int, plan: SessionPlan) -> None:
            await asyncio.sleep(slot % 100 / 100)  # spread the starts over the first second, as load.py
            round_ = 0
            while time.monotonic() < stop_at:
                key = session_key(BENCH_FLEET, plan.replay_id(tag, round_))
                result.sessions.append(key)
                await _replay(pool, plan, key, speed, flush_interval, stop_at, stop, result, paced=paced)
                round_ += 1

        began = time.monotonic()
        await asyncio.gather(*(drive(i, plan) for i, plan in enumerate(plans)))
        result.seconds = time.monotonic() - began
    return result


async def _replay(
    pool: DirectPool, plan: SessionPlan, session_id: str, speed: float, flush: float,
    stop_at: float, stop: asyncio.Event, result: DirectResult, *, paced: bool,
) -> None:
    """One session (``session_id``: its key), on ``load._replay``'s clock, each event a transaction of its own."""
    seq = 0

    async def write(event: Any, due: float, turn: bool = False, session: str | None = None) -> float:
        """Commit ``event`` (with its turn row or session row); milliseconds from ``began``."""
        nonlocal seq
        began = time.perf_counter()
        result.lateness.append((due, max(0.0, time.monotonic() - due)))
        statements: list[tuple[str, dict[str, Any]]] = [(EVENT_SQL, _event_row(event))]
        if turn:
            statements.append((TURN_SQL, _turn_row(event)))
        if session is not None:
            statements.append((session, _session_row(event)))
        await pool.write(statements)
        seq += 1
        ms = (time.perf_counter() - began) * 1000
        result.write_ms.append(ms)
        result.committed_at.append(time.monotonic())
        result.transactions += 1
        return ms

    def envelope() -> dict[str, Any]:
        return dict(event_id=uuid.uuid4(), session_id=session_id, seq=seq, epoch=0, producer_id="bench-direct",
                    emitted_at=_now())

    async def wait(deadline: float) -> bool:
        if paced:
            return await _sleep_until(deadline, stop_at, stop)
        return time.monotonic() < stop_at

    clock0 = time.monotonic()
    now = _now()
    await write(SessionStarted(fleet=BENCH_FLEET, agent_id="bench", started_at=now, **envelope()), clock0,
                session=SESSION_START_SQL)
    t0 = plan.turns[0].start_s
    free_at = 0.0
    reason = "completed"
    for index, turn in enumerate(plan.turns):
        begin = max((turn.start_s - t0) / speed, free_at)
        length = max(turn.end_s - turn.start_s, 0.0) / speed
        words = turn.text.split()
        steps = max(1, int(length / flush))
        started_at = _now()
        for step in range(steps):
            due = clock0 + begin + step * length / steps
            if not await wait(due):
                break
            text = " ".join(words[: max(1, math.ceil(len(words) * (step + 1) / (steps + 1)))])
            partial = TurnPartial(
                turn_index=index, speaker=turn.speaker, text=text, started_at=started_at, **envelope()
            )
            await write(partial, due, turn=True)
        due = clock0 + begin + length
        if not await wait(due):
            reason = "interrupted"
            break  # the phase is over: end the session mid-turn (the partial stays as written)
        tokens_in, tokens_out = token_counts(turn)
        completed = TurnCompleted(
            turn_index=index, speaker=turn.speaker, text=turn.text, started_at=started_at, ended_at=_now(),
            input_tokens=tokens_in, output_tokens=tokens_out, **envelope(),
        )
        result.commit_ms.append(await write(completed, due, turn=True))
        result.turns += 1
        free_at = begin + length
        if time.monotonic() >= stop_at:
            break
    ended = SessionEnded(ended_at=_now(), reason=reason, last_turn_index=len(plan.turns) - 1, **envelope())
    await write(ended, time.monotonic(), session=SESSION_END_SQL)
    result.events += seq


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _event_row(event: Any) -> dict[str, Any]:
    return {
        "session_id": event.session_id,
        "seq": event.seq,
        "epoch": event.epoch,
        "event_id": str(event.event_id),
        "type": type(event).__struct_config__.tag,
        "emitted_at": event.emitted_at,
        "payload": encode_event(event).decode("utf-8"),
    }


def _turn_row(event: Any) -> dict[str, Any]:
    row = TurnRow.from_event(event).as_row()
    if row["tool_calls"] is not None:
        row["tool_calls"] = Json(row["tool_calls"])
    return row


def _session_row(event: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"id": event.session_id, "fleet": BENCH_FLEET, "agent_id": "bench", "epoch": event.epoch,
                           "seq": event.seq}
    if isinstance(event, SessionStarted):
        row["started_at"] = event.started_at
    else:
        row["ended_at"], row["end_reason"] = event.ended_at, event.reason
    return row


# -- pure figures -------------------------------------------------------------------------------
def least_squares_slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of ``y`` over ``x`` of ``points`` ``(x, y)``; 0 with fewer than 3."""
    if len(points) < 3:
        return 0.0
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


def lateness_flat(slope: float) -> bool:
    """Whether lateness growing by ``slope`` seconds per second still counts as keeping up."""
    return slope <= FLAT_LATENESS_SLOPE


def direct_summary(result: DirectResult, window: tuple[float, float]) -> dict[str, Any]:
    """The figures of one direct phase; rates and lateness over ``window`` (monotonic
    seconds: after the ramp-up, before the phase's end)."""
    began, ended = window
    inside = [(due, late) for due, late in result.lateness if began <= due <= ended]
    committed = sum(1 for at in result.committed_at if began <= at <= ended)
    slope = least_squares_slope(inside)
    return {
        "sessions": len({s.rsplit("-", 1)[0] for s in result.sessions}),
        "seconds": result.seconds,
        "events": result.events,
        "turns": result.turns,
        "events_per_second": result.events_per_second,
        "committed_events_per_second": committed / (ended - began) if ended > began else float("nan"),
        "transactions": result.transactions,
        "transactions_per_turn": result.transactions / result.turns if result.turns else float("nan"),
        "events_per_turn": result.events / result.turns if result.turns else float("nan"),
        "commit_p50_ms": percentile(result.commit_ms, 50),
        "commit_p95_ms": percentile(result.commit_ms, 95),
        "commit_p99_ms": percentile(result.commit_ms, 99),
        "commit_max_ms": max(result.commit_ms) if result.commit_ms else float("nan"),
        "write_p99_ms": percentile(result.write_ms, 99),
        "lateness_slope": slope,
        "lateness_p99_ms": percentile([late * 1000 for _, late in inside], 99),
        "flat": lateness_flat(slope),
    }
