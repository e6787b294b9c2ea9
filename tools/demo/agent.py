"""A simulated agent: replays one transcript through SessionRecorder in real time, compressed.

Turns keep their real timing: each input turn opens at its (compressed) start
time and completes at its end time, so a turn may open while earlier ones are
still open (people talk over each other in these meetings), and turns complete
in whatever order their ends fall. While a turn is open its words arrive one by
one over its duration, the way speech recognition streams them, as
``update_partial`` calls; the recorder's timer flushes every open turn's newest
text. Event timestamps (``started_at``/``ended_at``) are the recording's own
times on a base date, so stored durations match the meeting whatever the speed.

Turn indexes: the first agent of a session stores input turn ``i`` at turn
index ``i``. An agent that resumes a session says again, in full and at their
recorded times, every input turn the store does not hold complete (the turns
its predecessor left open, and those it never reached), at new turn indexes
counted on from the recorder's ``next_turn_index``
(``turnlog.tools.demo.transcripts.unfinished_turns``).

Progress goes to stdout as JSON lines (``started``/``resumed``, ``turn`` when
a turn opens, ``said`` when its completion returned, ``done``) so the demo can
SIGKILL the process in the middle of a chosen turn. With a latency log
(``turnlog chaos``), each ``complete_turn`` that returned is also appended
there: when it began and how long it took
(``turnlog.tools.demo.latency.LatencyLog``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from turnlog.producers import SessionRecorder
from turnlog.resume_barrier import resume_source_for
from turnlog.settings import TurnlogSettings
from turnlog.tools.demo.keys import DEMO_FLEET
from turnlog.tools.demo.latency import CompletedTurn, LatencyLog
from turnlog.tools.demo.transcripts import InputTurn, load_transcript, recording_time, token_counts, unfinished_turns

__all__ = ["replay_transcript", "recording_time", "SpokenTurn", "replay_plan"]

_encode = msgspec.json.Encoder().encode


def _say(**fields: object) -> None:
    sys.stdout.write(_encode(fields).decode() + "\n")
    sys.stdout.flush()


@dataclass(frozen=True, slots=True)
class SpokenTurn:
    """An input turn and the turn index this agent records it under."""

    turn_index: int
    turn: InputTurn


def replay_plan(turns: list[InputTurn], *, first_turn_index: int = 0) -> list[SpokenTurn]:
    """``turns`` (in input order) at consecutive turn indexes from ``first_turn_index``."""
    return [SpokenTurn(first_turn_index + n, turn) for n, turn in enumerate(turns)]


async def replay_transcript(
    settings: TurnlogSettings,
    path: Path,
    session_id: str,
    *,
    speed: float,
    base_time: dt.datetime,
    resume: bool = False,
    fleet: str = DEMO_FLEET,
    latency_log: Path | None = None,
) -> None:
    """Record ``path`` as ``fleet``'s session ``session_id`` (written under its key,
    ``<fleet>:<session_id>``); with ``resume``, continue it in a new epoch.

    A resumed agent rebuilds its place in the conversation from the stored
    turns ``resume()`` returns, as a real agent would: after the resume barrier
    they include every turn its predecessor got recorded, so it says again
    each input turn not stored complete, and goes on from there.

    ``latency_log``: a file to append each returned ``complete_turn``'s start and
    duration to (:class:`~turnlog.tools.demo.latency.LatencyLog`); None: none kept.
    """
    turns = load_transcript(path)
    log = LatencyLog(latency_log) if latency_log is not None else None
    try:
        await _replay(settings, path, session_id, turns, speed=speed, base_time=base_time, resume=resume,
                      fleet=fleet, on_completed=log.write if log is not None else None)
    finally:
        if log is not None:
            log.close()


async def _replay(
    settings: TurnlogSettings,
    path: Path,
    session_id: str,
    turns: list[InputTurn],
    *,
    speed: float,
    base_time: dt.datetime,
    resume: bool,
    fleet: str,
    on_completed: Callable[[CompletedTurn], None] | None,
) -> None:
    recorder = SessionRecorder(settings, producer_id=f"demo-agent-{os.getpid()}",
                               resume_source=resume_source_for(settings))
    async with recorder:
        recorder.install_sigterm_drain()
        if resume:
            session = await recorder.resume(session_id, fleet=fleet)
            todo = unfinished_turns(turns, [(t.speaker, t.started_at, t.status) for t in session.turns], base_time)
            plan = replay_plan(todo, first_turn_index=session.next_turn_index)
            _say(
                type="resumed", epoch=session.epoch, next_seq=session.next_seq, next_turn=session.next_turn_index,
                unfinished=len(todo), first_input_turn=todo[0].turn_index if todo else None,
            )
        else:
            session = await recorder.start_session(
                session_id,
                fleet=fleet,
                agent_id=f"replay-{os.getpid()}",
                metadata={"source": path.name, "speed": speed},
                started_at=recording_time(base_time, turns[0].start_s),
            )
            plan = replay_plan(turns)
            _say(type="started")
        if not await _play(session, plan, speed=speed, base_time=base_time, terminating=recorder.terminating,
                           on_completed=on_completed):
            _say(type="terminated")
            return
        last_end = max(t.end_s for t in turns)
        await session.end("completed", ended_at=recording_time(base_time, last_end))
        _say(type="done", events=session.next_seq)


async def _play(
    session,  # noqa: ANN001
    plan: list[SpokenTurn],
    *,
    speed: float,
    base_time: dt.datetime,
    terminating: asyncio.Event,
    on_completed: Callable[[CompletedTurn], None] | None = None,
) -> bool:
    """Say every turn of ``plan`` at its recorded time, several at once where
    they overlap; True when all were said, False when SIGTERM stopped it (the
    turns still open then are left to the recorder's drain). ``on_completed``
    gets each ``complete_turn`` call that returned.

    Raises:
        the first error of a turn (e.g. ``SpoolFullError``); the other open turns are cancelled.
    """
    if not plan:
        return True
    t0 = plan[0].turn.start_s
    clock0 = time.monotonic()
    open_turns: set[asyncio.Task[None]] = set()
    failed: list[asyncio.Task[None]] = []
    stop = asyncio.Event()  # SIGTERM's drain finished, or a turn failed
    watcher = asyncio.create_task(terminating.wait())
    watcher.add_done_callback(lambda _: stop.set())

    def finished(task: asyncio.Task[None]) -> None:
        open_turns.discard(task)
        if not task.cancelled() and task.exception() is not None:
            failed.append(task)
            stop.set()

    try:
        for spoken in plan:
            turn = spoken.turn
            begin = clock0 + (turn.start_s - t0) / speed
            length = max(turn.end_s - turn.start_s, 0.0) / speed
            if await _wait(stop, begin):
                break
            _say(type="turn", input_turn=turn.turn_index, stored_turn=spoken.turn_index, real_seconds=round(length, 3),
                 open=len(open_turns) + 1)
            task = asyncio.create_task(_speak(session, spoken, base_time, begin, length, on_completed),
                                       name=f"turn-{spoken.turn_index}")
            open_turns.add(task)
            task.add_done_callback(finished)
        while open_turns and not stop.is_set():
            waiter = asyncio.create_task(stop.wait())
            await asyncio.wait({*open_turns, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
    finally:
        watcher.cancel()
        for task in list(open_turns):
            task.cancel()
    if failed:
        raise failed[0].exception()  # type: ignore[misc]
    return not terminating.is_set()


async def _wait(stop: asyncio.Event, deadline: float) -> bool:
    """Sleep until ``deadline`` (monotonic); True if ``stop`` was set first."""
    delay = deadline - time.monotonic()
    if delay <= 0:
        return stop.is_set()
    try:
        await asyncio.wait_for(stop.wait(), delay)
    except TimeoutError:
        return False
    return True


async def _speak(
    session,  # noqa: ANN001
    spoken: SpokenTurn,
    base_time: dt.datetime,
    start: float,
    length: float,
    on_completed: Callable[[CompletedTurn], None] | None = None,
) -> None:
    turn = spoken.turn
    words = turn.text.split(" ")
    started_at = recording_time(base_time, turn.start_s)
    for count in range(1, len(words)):
        session.update_partial(spoken.turn_index, turn.speaker, " ".join(words[:count]), started_at=started_at)
        await _sleep_until(start + length * count / len(words))
    await _sleep_until(start + length)
    input_tokens, output_tokens = token_counts(turn)
    called = time.monotonic()
    await session.complete_turn(
        spoken.turn_index,
        turn.speaker,
        turn.text,
        started_at=started_at,
        ended_at=recording_time(base_time, turn.end_s),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )
    if on_completed is not None:
        on_completed(CompletedTurn(session.session_id, spoken.turn_index, called, time.monotonic() - called))
    _say(type="said", input_turn=turn.turn_index, stored_turn=spoken.turn_index)


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
