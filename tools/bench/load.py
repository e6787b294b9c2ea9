"""The load generator: session plans replayed through the real ``SessionRecorder``.

One recorder (one idempotent producer), one asyncio task per concurrent
session. Each task replays its plan on the compressed clock: a turn's text
grows word by word (``update_partial``) and the recorder's own timer flushes it
every ``flush_interval`` seconds; the turn then completes (awaiting its ack).
When a plan ends, the task ends the session and starts the next one under a
new id, so ``concurrency`` sessions stay open for the whole run. The clock is
open-loop: a task that falls behind does not sleep until it has caught up, so
the offered rate does not drop because the pipeline is slow.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

from turnlog.producers import SessionRecorder
from turnlog.settings import TurnlogSettings
from turnlog.tools.bench.workload import BENCH_FLEET, SessionPlan, events_per_second
from turnlog.tools.demo.transcripts import token_counts

__all__ = ["LoadResult", "run_load", "plans_for_rate"]

_STOP_CHECK_SECONDS = 0.5


@dataclass(slots=True)
class LoadResult:
    """What the generator sent: events and completed turns, per second of the run."""

    seconds: float = 0.0
    events: int = 0
    turns: int = 0
    #: the keys of the sessions started (``RecordedSession.session_id``)
    sessions: list[str] = field(default_factory=list)
    #: Milliseconds each ``complete_turn`` took (its spool fsync and broker ack): a
    #: session's next turn waits for it, so slow acks lower the offered rate.
    complete_ms: list[float] = field(default_factory=list)
    #: Whether the recorder sealed the sessions' content (it had a KEK: ``SessionRecorder.encrypted``).
    encrypted: bool = False

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


def plans_for_rate(plans: list[SessionPlan], rate: float, *, speed: float, flush_interval: float) -> list[SessionPlan]:
    """The fewest leading ``plans`` that, replayed together at ``speed``, offer ``rate`` events/s.

    The offered rate is set by the number of concurrent sessions, not by the
    speed: a speaking session sends about one partial per flush interval at
    any speed, so slowing the clock down cannot go below that floor.

    Raises:
        ValueError: all of ``plans`` together offer less than ``rate``.
    """
    offered = 0.0
    for count, plan in enumerate(plans, start=1):
        offered += events_per_second([plan], speed=speed, flush_interval=flush_interval)
        if offered >= rate:
            return plans[:count]
    raise ValueError(f"{len(plans)} sessions at x{speed:g} offer only {offered:,.0f} events/s, not {rate:,.0f}: use"
                     " more sessions")


async def run_load(
    settings: TurnlogSettings, plans: list[SessionPlan], *, speed: float, seconds: float, tag: str,
    stop: asyncio.Event | None = None
) -> LoadResult:
    """Replay ``plans`` concurrently at ``speed`` for ``seconds``, or until ``stop`` is
    set (each session then ends at its next step); session ids get ``tag`` (``SessionPlan.replay_id``).

    Raises:
        SpoolFullError: the broker stayed away until the recorder's spool filled.
    """
    result = LoadResult()
    stop_at = time.monotonic() + seconds
    stop = stop or asyncio.Event()
    async with SessionRecorder(settings, producer_id=f"bench-{tag}") as recorder:
        result.encrypted = recorder.encrypted
        async def drive(slot: int, plan: SessionPlan) -> None:
            await asyncio.sleep(slot % 100 / 100)  # spread the starts over the first second
            round_ = 0
            while time.monotonic() < stop_at and not stop.is_set():
                await _replay(recorder, plan, plan.replay_id(tag, round_), speed, stop_at, stop, result)
                round_ += 1

        began = time.monotonic()
        await asyncio.gather(*(drive(i, plan) for i, plan in enumerate(plans)))
        result.seconds = time.monotonic() - began
    return result


async def _replay(
    recorder: SessionRecorder, plan: SessionPlan, session_id: str, speed: float, stop_at: float, stop: asyncio.Event,
    result: LoadResult
) -> None:
    session = await recorder.start_session(session_id, fleet=BENCH_FLEET, agent_id="bench")
    result.sessions.append(session.session_id)
    flush = recorder.settings.flush_interval_seconds
    clock0 = time.monotonic()
    t0 = plan.turns[0].start_s
    free_at = 0.0
    for index, turn in enumerate(plan.turns):
        begin = max((turn.start_s - t0) / speed, free_at)
        length = max(turn.end_s - turn.start_s, 0.0) / speed
        words = turn.text.split()
        steps = max(1, int(length / flush))
        for step in range(steps):
            if not await _sleep_until(clock0 + begin + step * length / steps, stop_at, stop):
                break
            session.update_partial(index, turn.speaker,
                                   " ".join(words[: max(1, math.ceil(len(words) * (step + 1) / (steps + 1)))]))
        if not await _sleep_until(clock0 + begin + length, stop_at, stop):
            break  # the phase is over: end the session mid-turn (the partial is kept, interrupted)
        tokens_in, tokens_out = token_counts(turn)
        began = time.perf_counter()
        await session.complete_turn(index, turn.speaker, turn.text, input_tokens=tokens_in, output_tokens=tokens_out)
        result.complete_ms.append((time.perf_counter() - began) * 1000)
        result.turns += 1
        free_at = begin + length
        if time.monotonic() >= stop_at or stop.is_set():
            break
    await session.end("completed")
    result.events += session.next_seq  # seqs 0..next_seq-1: every event of the session


async def _sleep_until(deadline: float, stop_at: float, stop: asyncio.Event) -> bool:
    """Sleep until ``deadline``; False (at ``stop_at``) if the phase ends first, or
    if ``stop`` is set (checked at least every ``_STOP_CHECK_SECONDS``: a silence
    in a transcript can last many seconds)."""
    until = min(deadline, stop_at)
    while not stop.is_set():
        delay = until - time.monotonic()
        if delay <= 0:
            break
        await asyncio.sleep(min(delay, _STOP_CHECK_SECONDS))
    return deadline <= stop_at and not stop.is_set()
