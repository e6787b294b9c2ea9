"""Sessions talking through one recorder while a test breaks the cluster, and the check that the
store holds exactly what they said."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from turnlog.producers import RecordedSession, SessionRecorder

from tests.crash.test_recorder_outages import assert_aggregates_match_the_log, store_rows
from tests.integration.test_pipeline import finalized
from tests.support import wait_until


@dataclass
class Conversations:
    """``count`` sessions on ``recorder``, each completing a turn in its turn (speakers A and B)."""

    recorder: SessionRecorder
    count: int
    prefix: str
    sessions: list[RecordedSession] = field(default_factory=list)
    said: dict[str, list[tuple[int, str, str]]] = field(default_factory=dict)

    async def open(self) -> None:
        for i in range(self.count):
            session = await self.recorder.start_session(f"{self.prefix}-{i}", fleet="tests", agent_id=f"talker-{i}")
            self.sessions.append(session)
            self.said[session.session_id] = []

    async def talk(self, *, turns: int | None = None, until: Callable[[], bool] | None = None) -> list[float]:
        """Complete ``turns`` rounds (a turn per session each), or rounds until ``until()``;
        returns how long each ``complete_turn`` took (seconds)."""
        took: list[float] = []
        rounds = 0
        while (turns is not None and rounds < turns) or (until is not None and not until()):
            for session in self.sessions:
                index = session.next_turn_index
                speaker, text = "AB"[index % 2], f"{session.session_id} turn {index}"
                began = time.monotonic()
                await session.complete_turn(index, speaker, text, input_tokens=index, output_tokens=1)
                took.append(time.monotonic() - began)
                self.said[session.session_id].append((index, speaker, text))
            rounds += 1
        return took

    async def end(self, *, delivered_within: float) -> None:
        """End every session and wait until the broker acknowledged all it was told."""
        for session in self.sessions:
            await session.end("completed")
        for session in self.sessions:
            assert await session.wait_acknowledged(delivered_within), f"{session.session_id}: not acknowledged"


def assert_stored_as_said(pipeline, conversations: Conversations, *, timeout: float) -> None:
    """Every session finalized with exactly the turns said, in order, once each, and aggregates
    that match its event log."""
    for session_id, said in conversations.said.items():
        row = wait_until(lambda s=session_id: finalized(pipeline, s), timeout=timeout, what=f"{session_id} finalized")
        turns, payloads = store_rows(pipeline, session_id)
        assert [(t["turn_index"], t["speaker"], t["text"], t["status"]) for t in turns] == [
            (index, speaker, text, "complete") for index, speaker, text in said
        ], session_id
        assert_aggregates_match_the_log(row, payloads)
