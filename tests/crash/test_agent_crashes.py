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
from turnlog.schemas import TurnPartial, decode_event
from turnlog.schemas.session_keys import session_key

from tests.crash.test_service_crashes import read_topic
from tests.integration.test_pipeline import finalized, stored_turns
from tests.support import recorder_for, wait_until

TIMEOUT = 120
FLUSH = 0.2
WORDS = 40
TURN_SECONDS = 4.0  # room for the random kill after turn 3's first partial is in the log


@pytest.fixture
def pipeline(new_pipeline):
    return new_pipeline(("sequencer", "sink", "finalizer"))


def write_transcript(path, session_id, turns=8):
    """Turns of WORDS words, TURN_SECONDS long, back to back (at speed 1, a turn takes TURN_SECONDS)."""
    lines = []
    for i in range(turns):
        text = " ".join(f"t{i}w{j}" for j in range(WORDS))
        start = i * (TURN_SECONDS + 0.1)
        lines.append(json.dumps({"session_id": session_id, "turn_index": i, "speaker": "AB"[i % 2], "text": text,
                                 "start_s": start, "end_s": start + TURN_SECONDS}))
    path.write_text("\n".join(lines) + "\n")
    return [json.loads(line) for line in lines]


class Agent:
    """``turnlog replay-agent`` as a child process, with its progress lines: it records fleet
    ``FLEET``'s session ``session_id``, keyed ``self.key``."""

    FLEET = "tests"

    def __init__(self, pipeline, transcript, session_id, tmp_path):
        self.key = session_key(self.FLEET, session_id)
        env = pipeline.settings.model_copy(update={"flush_interval_seconds": FLUSH}).as_environment()
        argv = turnlog_command("replay-agent", str(transcript), "--fleet", self.FLEET, "--session-id", session_id,
                               "--speed", "1")
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


def partials_in_log(pipeline, key, turn_index):
    """Texts of the partials of ``turn_index`` of the session keyed ``key`` that the broker holds, in log order."""
    events = (decode_event(m.value) for m in read_topic(pipeline.settings, pipeline.settings.topics.events))
    return [e.text for e in events
            if isinstance(e, TurnPartial) and e.session_id == key and e.turn_index == turn_index]


def test_an_agent_killed_mid_turn_loses_nothing_the_broker_got_and_its_successor_continues_after_the_turn(
        pipeline, tmp_path):
    """What a SIGKILL may lose is the part of the open turn not yet durable: at most
    one flush interval of words while the spool and the broker keep up. How long
    that is in seconds depends on the disk, so this asserts the exact rule instead:
    every partial the broker got is kept. The kill waits until turn 3 has a partial
    in the log (a turn with nothing durable yet may be lost whole)."""
    session_id = f"agentkill-{uuid.uuid4().hex[:6]}"
    turns = write_transcript(tmp_path / "t.jsonl", session_id)
    agent = Agent(pipeline, tmp_path / "t.jsonl", session_id, tmp_path)
    agent.wait_for_turn(3)
    wait_until(lambda: partials_in_log(pipeline, agent.key, 3), timeout=TIMEOUT, what="a partial of turn 3 in the log")
    threading.Event().wait(random.uniform(0.0, 1.0))  # a random later point in the turn (TURN_SECONDS long)
    agent.process.kill()
    in_log = partials_in_log(pipeline, agent.key, 3)

    async def resume_and_end():
        async with recorder_for(pipeline.settings) as recorder:
            session = await recorder.resume(agent.key, timeout=TIMEOUT)
            assert session.next_turn_index == 4
            await session.complete_turn(4, "A", turns[3]["text"])
            await session.end("completed")

    import asyncio

    asyncio.run(resume_and_end())
    wait_until(lambda: finalized(pipeline, agent.key), timeout=TIMEOUT, what="finalized after the kill")
    stored = [tuple(t) for t in stored_turns(pipeline, agent.key)]
    assert stored[:3] == [(i, turns[i]["speaker"], turns[i]["text"], "complete") for i in range(3)]
    index, speaker, text, status = stored[3]
    assert (index, speaker, status) == (3, "B", "interrupted")
    assert turns[3]["text"].startswith(text)
    # The newest partial the broker got, or a later one the dead agent's spool still held.
    assert len(text.split()) >= max(len(t.split()) for t in in_log), f"{len(in_log)} partials in the log"
    assert stored[4] == (4, "A", turns[3]["text"], "complete")


def test_a_stopped_agent_that_wakes_after_a_resume_is_fenced_and_the_new_owner_wins(pipeline, tmp_path):
    session_id = f"zombie-{uuid.uuid4().hex[:6]}"
    write_transcript(tmp_path / "t.jsonl", session_id)
    zombie = Agent(pipeline, tmp_path / "t.jsonl", session_id, tmp_path)
    zombie.wait_for_turn(2)
    zombie.process.popen.send_signal(signal.SIGSTOP)

    async def take_over():
        async with recorder_for(pipeline.settings) as recorder:
            session = await recorder.resume(zombie.key, timeout=TIMEOUT)
            assert session.epoch == 1
            owner_turn = session.next_turn_index
            await session.complete_turn(owner_turn, "owner", "the new owner's turn")
            zombie.process.popen.send_signal(signal.SIGCONT)  # the zombie wakes and keeps sending
            wait_until(lambda: fenced_records(), timeout=TIMEOUT, what="the zombie's events fenced to the DLQ")
            await session.complete_turn(owner_turn + 1, "owner", "and another")
            await session.end("completed")
            return owner_turn

    def fenced_records():
        return [m for m in read_topic(pipeline.settings, pipeline.settings.topics.dlq) if m.key == zombie.key.encode()]

    import asyncio

    owner_turn = asyncio.run(take_over())
    zombie.process.kill()
    wait_until(lambda: finalized(pipeline, zombie.key), timeout=TIMEOUT, what="finalized")
    stored = [tuple(t) for t in stored_turns(pipeline, zombie.key)]
    assert stored[owner_turn:] == [(owner_turn, "owner", "the new owner's turn", "complete"),
                                   (owner_turn + 1, "owner", "and another", "complete")]
    assert all(status in ("complete", "interrupted") for _, _, _, status in stored[:owner_turn])
    assert all(json.loads(m.value)["epoch"] == 0 for m in fenced_records())
