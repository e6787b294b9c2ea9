"""Agents SIGKILLed and SIGSTOPped mid-turn (real processes, real broker, real Postgres)."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
import uuid

import pytest

from turnlog.deploy.processes import ServiceProcess, turnlog_command
from turnlog.producers import SessionRecorder

from tests.crash.test_service_crashes import read_topic
from tests.integration.test_pipeline import finalized, stored_turns
from tests.support import wait_until

TIMEOUT = 120
FLUSH = 0.2
WORDS = 40
TURN_SECONDS = 2.0


@pytest.fixture
def pipeline(new_pipeline):
    return new_pipeline(("sequencer", "sink", "finalizer"))


def write_transcript(path, session_id, turns=8):
    """Turns of WORDS words, TURN_SECONDS long, back to back: at speed 1 each turn takes 2 s."""
    lines = []
    for i in range(turns):
        text = " ".join(f"t{i}w{j}" for j in range(WORDS))
        start = i * (TURN_SECONDS + 0.1)
        lines.append(json.dumps({"session_id": session_id, "turn_index": i, "speaker": "AB"[i % 2], "text": text,
                                 "start_s": start, "end_s": start + TURN_SECONDS}))
    path.write_text("\n".join(lines) + "\n")
    return [json.loads(line) for line in lines]


class Agent:
    """``turnlog replay-agent`` as a child process, with its progress lines."""

    def __init__(self, pipeline, transcript, session_id, tmp_path):
        env = pipeline.settings.model_copy(update={"flush_interval_seconds": FLUSH}).as_environment()
        argv = turnlog_command("replay-agent", str(transcript), "--session-id", session_id, "--speed", "1")
        self.process = ServiceProcess("agent", argv, env, tmp_path / f"agent-{uuid.uuid4().hex[:4]}.log", stdout_pipe=True)
        self.turn_started: dict[int, float] = {}
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.process.popen.stdout:
            line = json.loads(raw)
            if line.get("type") == "turn":
                with self.changed:
                    self.turn_started[line["input_turn"]] = time.monotonic()
                    self.changed.notify_all()

    def wait_for_turn(self, index):
        with self.changed:
            assert self.changed.wait_for(lambda: index in self.turn_started, timeout=TIMEOUT), f"turn {index} never started"
            return self.turn_started[index]


def test_an_agent_killed_mid_turn_loses_at_most_one_flush_interval(pipeline, tmp_path):
    session_id = f"agentkill-{uuid.uuid4().hex[:6]}"
    turns = write_transcript(tmp_path / "t.jsonl", session_id)
    agent = Agent(pipeline, tmp_path / "t.jsonl", session_id, tmp_path)
    began = agent.wait_for_turn(3)
    moment = random.uniform(0.5, 1.8)  # a random point in the 2 s turn
    threading.Event().wait(moment)
    agent.process.kill()
    into_turn = time.monotonic() - began

    async def resume_and_end():
        async with SessionRecorder(pipeline.settings) as recorder:
            session = await recorder.resume(session_id, timeout=TIMEOUT)
            assert session.next_turn_index == 4
            await session.complete_turn(4, "A", turns[3]["text"])
            await session.end("completed")

    import asyncio

    asyncio.run(resume_and_end())
    wait_until(lambda: finalized(pipeline, session_id), timeout=TIMEOUT, what="finalized after the kill")
    stored = [tuple(t) for t in stored_turns(pipeline, session_id)]
    assert stored[:3] == [(i, turns[i]["speaker"], turns[i]["text"], "complete") for i in range(3)]
    index, speaker, text, status = stored[3]
    assert (index, speaker, status) == (3, "B", "interrupted")
    assert turns[3]["text"].startswith(text)
    # Words on screen at time t into the turn: 1 + floor(t * WORDS / TURN_SECONDS). The newest
    # partial is at most one flush interval old (plus scheduling slack on a busy 2-core box).
    spoken_by = lambda t: min(WORDS - 1, 1 + int(max(t, 0) * WORDS / TURN_SECONDS))  # noqa: E731
    assert len(text.split()) >= spoken_by(into_turn - FLUSH - 0.3), f"killed {into_turn:.2f}s into the turn (aimed {moment:.2f}s)"
    assert stored[4] == (4, "A", turns[3]["text"], "complete")


def test_a_stopped_agent_that_wakes_after_a_resume_is_fenced_and_the_new_owner_wins(pipeline, tmp_path):
    session_id = f"zombie-{uuid.uuid4().hex[:6]}"
    write_transcript(tmp_path / "t.jsonl", session_id)
    zombie = Agent(pipeline, tmp_path / "t.jsonl", session_id, tmp_path)
    zombie.wait_for_turn(2)
    zombie.process.popen.send_signal(signal.SIGSTOP)

    async def take_over():
        async with SessionRecorder(pipeline.settings) as recorder:
            session = await recorder.resume(session_id, timeout=TIMEOUT)
            assert session.epoch == 1
            owner_turn = session.next_turn_index
            await session.complete_turn(owner_turn, "owner", "the new owner's turn")
            zombie.process.popen.send_signal(signal.SIGCONT)  # the zombie wakes and keeps sending
            wait_until(lambda: fenced_records(), timeout=TIMEOUT, what="the zombie's events fenced to the DLQ")
            await session.complete_turn(owner_turn + 1, "owner", "and another")
            await session.end("completed")
            return owner_turn

    def fenced_records():
        return [m for m in read_topic(pipeline.settings, pipeline.settings.topics.dlq) if m.key == session_id.encode()]

    import asyncio

    owner_turn = asyncio.run(take_over())
    zombie.process.kill()
    wait_until(lambda: finalized(pipeline, session_id), timeout=TIMEOUT, what="finalized")
    stored = [tuple(t) for t in stored_turns(pipeline, session_id)]
    assert stored[owner_turn:] == [(owner_turn, "owner", "the new owner's turn", "complete"),
                                   (owner_turn + 1, "owner", "and another", "complete")]
    assert all(status in ("complete", "interrupted") for _, _, _, status in stored[:owner_turn])
    assert all(json.loads(m.value)["epoch"] == 0 for m in fenced_records())
