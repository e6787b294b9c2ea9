"""A simulated agent: replays one transcript through SessionRecorder in real time, compressed.

Each turn's words arrive one by one over the turn's (compressed) duration, the
way speech recognition streams them, as ``update_partial`` calls; the
recorder's timer flushes the newest partial. Progress goes to stdout as JSON
lines so the demo can SIGKILL the process in the middle of a chosen turn.
Event timestamps (``started_at``/``ended_at``) are the recording's own times
on a base date, so stored durations match the meeting, whatever the speed.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import sys
import time
from pathlib import Path

import msgspec
from sqlalchemy import func, select

from turnlog.demo.transcripts import InputTurn, load_transcript, token_counts
from turnlog.producers import SessionRecorder
from turnlog.settings import TurnlogSettings
from turnlog.sinks import open_store
from turnlog.sinks.tables import transcript_turns

__all__ = ["replay_transcript"]

_encode = msgspec.json.Encoder().encode


def _say(**fields: object) -> None:
    sys.stdout.write(_encode(fields).decode() + "\n")
    sys.stdout.flush()


def recording_time(base: dt.datetime, seconds: float) -> dt.datetime:
    """The event timestamp of ``seconds`` on the recording's clock."""
    return base + dt.timedelta(seconds=seconds)


async def replay_transcript(
    settings: TurnlogSettings,
    path: Path,
    session_id: str,
    *,
    speed: float,
    base_time: dt.datetime,
    resume: bool = False,
    fleet: str = "demo",
) -> None:
    """Record ``path`` as ``session_id``; with ``resume``, continue it after its last completed turn.

    A resumed agent reloads the conversation from the store, as a real agent
    would: after the resume barrier the store holds every turn its predecessor
    completed, so it goes on with the first input turn not stored complete.
    """
    turns = load_transcript(path)
    async with SessionRecorder(settings, producer_id=f"demo-agent-{os.getpid()}") as recorder:
        recorder.install_sigterm_drain()
        from_turn = 0
        if resume:
            session = await recorder.resume(session_id)
            from_turn = await asyncio.to_thread(_completed_turns, settings, session_id)
            _say(type="resumed", epoch=session.epoch, next_seq=session.next_seq, next_turn=session.next_turn_index, from_input_turn=from_turn)
        else:
            session = await recorder.start_session(
                session_id,
                fleet=fleet,
                agent_id=f"replay-{os.getpid()}",
                metadata={"source": path.name, "speed": speed},
                started_at=recording_time(base_time, turns[0].start_s),
            )
            _say(type="started")
        stored_index = session.next_turn_index
        t0 = turns[min(from_turn, len(turns) - 1)].start_s
        clock0 = time.monotonic()
        free_at = 0.0  # real seconds: one turn at a time
        for turn in turns[from_turn:]:
            begin = max((turn.start_s - t0) / speed, free_at)
            length = max(turn.end_s - turn.start_s, 0.0) / speed
            await _sleep_until(clock0 + begin)
            _say(type="turn", input_turn=turn.turn_index, stored_turn=stored_index, real_seconds=round(length, 3))
            await _speak(session, stored_index, turn, base_time, clock0 + begin, length)
            free_at = begin + length
            stored_index += 1
            if recorder.terminating.is_set():
                _say(type="terminated")
                return
        last_end = max(t.end_s for t in turns)
        await session.end("completed", ended_at=recording_time(base_time, last_end))
        _say(type="done", events=session.next_seq)


def _completed_turns(settings: TurnlogSettings, session_id: str) -> int:
    store = open_store(settings.database_url)
    try:
        with store.engine.connect() as conn:
            return conn.execute(
                select(func.count()).where(transcript_turns.c.session_id == session_id, transcript_turns.c.status == "complete")
            ).scalar_one()
    finally:
        store.engine.dispose()


async def _speak(session, stored_index: int, turn: InputTurn, base_time: dt.datetime, start: float, length: float) -> None:  # noqa: ANN001
    words = turn.text.split(" ")
    started_at = recording_time(base_time, turn.start_s)
    for count in range(1, len(words)):
        session.update_partial(stored_index, turn.speaker, " ".join(words[:count]), started_at=started_at)
        await _sleep_until(start + length * count / len(words))
    input_tokens, output_tokens = token_counts(turn)
    await session.complete_turn(
        stored_index,
        turn.speaker,
        turn.text,
        started_at=started_at,
        ended_at=recording_time(base_time, turn.end_s),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
