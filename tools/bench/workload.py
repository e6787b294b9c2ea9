"""The benchmark's workload: the real transcripts as many concurrent sessions.

Session ``i`` replays a window of ``turns_per_session`` turns of transcript
``i mod len(files)``, starting at a turn that shifts with ``i`` so sessions on
the same file say different things. Each is :data:`BENCH_FLEET`'s session, written under
its key (``bench:<id>``) as the recorder writes it. Time is compressed by ``speed``: a turn
starts when the recording says (or when the previous one ended, one turn at a
time) and lasts its recorded length. While a turn is spoken its text grows
word by word and the recorder's timer flushes it as a partial every
``flush_interval`` seconds; the turn then completes.

:func:`encoded_events` gives the same sessions as the exact event bytes, for
the baselines and for pre-filling a backlog.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnlog.schemas import SessionEnded, SessionStarted, TurnCompleted, TurnPartial, encode_event
from turnlog.schemas.session_keys import session_key
from turnlog.tools.demo.transcripts import InputTurn, find_transcripts, load_transcript, token_counts

__all__ = ["SessionPlan", "plan_sessions", "encoded_events", "events_per_second", "replayed_keys", "BENCH_FLEET"]

BENCH_FLEET = "bench"
_BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """One benchmark session: its id (as an agent gives it to ``start_session``) and the input turns
    it says, in order."""

    session_id: str
    turns: tuple[InputTurn, ...]

    @property
    def key(self) -> str:
        """The session's key: what the recorder writes it under, so what the topics and the store name it by."""
        return session_key(BENCH_FLEET, self.session_id)

    def replay_id(self, tag: str, round_: int) -> str:
        """The id of this plan's ``round_``-th replay in the phase ``tag`` (``load.run_load``,
        ``direct.run_direct``); :func:`replayed_keys` matches their keys."""
        return f"{self.session_id}-{tag}-{round_}"

    def partials(self, turn: InputTurn, flush_interval: float, speed: float) -> int:
        """Partials the timer sends for ``turn`` (one per whole flush interval it lasts)."""
        return int(max(turn.end_s - turn.start_s, 0.0) / speed / flush_interval)

    def seconds(self, speed: float) -> float:
        """Length of the replay at ``speed`` (seconds)."""
        end = self.turns[0].start_s
        for turn in self.turns:
            end = max(end, turn.start_s) + max(turn.end_s - turn.start_s, 0.0)
        return (end - self.turns[0].start_s) / speed


def plan_sessions(
    sessions_dir: Path, count: int, turns_per_session: int, *, run_id: str | None = None
) -> list[SessionPlan]:
    """``count`` session plans over the transcripts of ``sessions_dir``.

    Raises:
        ConfigurationError: no transcripts, or a malformed one.
    """
    run = run_id or uuid.uuid4().hex[:8]
    transcripts = [load_transcript(path) for path in find_transcripts(sessions_dir)]
    plans = []
    for i in range(count):
        turns = transcripts[i % len(transcripts)]
        window = min(turns_per_session, len(turns))
        start = (i // len(transcripts)) * 7 % max(1, len(turns) - window + 1)
        plans.append(SessionPlan(f"{_id_prefix(run)}{i:05d}", tuple(turns[start : start + window])))
    return plans


def _id_prefix(run_id: str) -> str:
    return f"bench-{run_id}-"


def replayed_keys(run_id: str, tag: str) -> str:
    """A ``LIKE`` prefix (``%``: any run of characters) of the keys of the sessions the plans of run
    ``run_id`` (:func:`plan_sessions`) were replayed as in the phase ``tag`` (:meth:`SessionPlan.replay_id`),
    as ``probes.turn_latencies_ms`` and ``stages.turn_stage_latencies`` take it."""
    return f"{session_key(BENCH_FLEET, _id_prefix(run_id))}%-{tag}-"


def events_per_second(plans: list[SessionPlan], *, speed: float, flush_interval: float) -> float:
    """Mean events per second all ``plans`` send together when each replays at ``speed``."""
    total = 0.0
    for plan in plans:
        events = 2 + sum(1 + plan.partials(t, flush_interval, speed) for t in plan.turns)
        total += events / max(plan.seconds(speed), 1e-9)
    return total


def encoded_events(plans: list[SessionPlan], *, flush_interval: float, speed: float) -> list[tuple[str, bytes]]:
    """``[(session key, event bytes)]`` of every plan, the sessions interleaved
    round-robin (each session's own events in seq order), as the recorder would send them
    (each under its key: :attr:`SessionPlan.key`)."""
    per_session = [_session_events(plan, flush_interval, speed) for plan in plans]
    interleaved: list[tuple[str, bytes]] = []
    for position in range(max(len(events) for events in per_session)):
        for plan, events in zip(plans, per_session, strict=True):
            if position < len(events):
                interleaved.append((plan.key, events[position]))
    return interleaved


def _session_events(plan: SessionPlan, flush_interval: float, speed: float) -> list[bytes]:
    sid = plan.key
    seq = 0
    now = dt.datetime.now(dt.UTC)

    def envelope() -> dict[str, Any]:
        nonlocal seq
        seq += 1
        return dict(event_id=uuid.uuid4(), session_id=sid, seq=seq - 1, epoch=0, producer_id="bench", emitted_at=now)

    def at(seconds: float) -> dt.datetime:
        return _BASE + dt.timedelta(seconds=seconds)

    out = [encode_event(SessionStarted(fleet=BENCH_FLEET, agent_id="bench", started_at=at(plan.turns[0].start_s),
                                       **envelope()))]
    for index, turn in enumerate(plan.turns):
        words = turn.text.split()
        steps = plan.partials(turn, flush_interval, speed)
        for j in range(1, steps + 1):
            text = " ".join(words[: max(1, math.ceil(len(words) * j / (steps + 1)))])
            out.append(encode_event(TurnPartial(turn_index=index, speaker=turn.speaker, text=text,
                                                started_at=at(turn.start_s), **envelope())))
        tokens_in, tokens_out = token_counts(turn)
        out.append(
            encode_event(
                TurnCompleted(
                    turn_index=index,
                    speaker=turn.speaker,
                    text=turn.text,
                    started_at=at(turn.start_s),
                    ended_at=at(max(turn.end_s, turn.start_s)),
                    input_tokens=tokens_in,
                    output_tokens=tokens_out,
                    **envelope(),
                )
            )
        )
    last = plan.turns[-1]
    out.append(encode_event(SessionEnded(ended_at=at(last.end_s), reason="completed",
                                         last_turn_index=len(plan.turns) - 1, **envelope())))
    return out
