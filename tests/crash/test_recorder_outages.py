"""The recorder through a broker outage longer than the delivery timeout, and
overlapping turns with barge-in, with agents SIGKILLed (real processes, real
broker, real Postgres).

The outage test restarts the shared local broker with the deploy scripts, so
it runs only against services started by ``deploy/services.sh``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select

from turnlog.deploy.local import SCRIPTS
from turnlog.ops.audit import fold_events
from turnlog.producers import ResumeBarrierTimeout
from turnlog.schemas.session_keys import session_key
from turnlog.sinks.tables import session_events, transcript_turns

from tests.crash.scripted_agent import FLEET
from tests.integration.test_pipeline import finalized
from tests.progress import ScriptProcess
from tests.support import recorder_for, wait_until

TIMEOUT = 180
STATE = Path(os.environ.get("TURNLOG_STATE_DIR", Path.home() / ".cache" / "turnlog"))
DELIVERY_TIMEOUT = 10.0
OUTAGE_SECONDS = 90.0


class ScriptedAgent(ScriptProcess):
    """``tests/crash/scripted_agent.py`` as a child process, with its JSON progress lines."""

    def __init__(self, settings, scenario: str, session_id: str, log: Path) -> None:
        super().__init__(
            "tests.crash.scripted_agent", scenario, session_id, env=settings.as_environment(), log_path=log, name=f"agent-{scenario}"
        )

    def completed(self) -> int:
        """The last turn the agent reported completed (-1: none yet)."""
        return max((line["completed"] for line in self.lines_so_far() if "completed" in line), default=-1)


def kafka(command: str) -> None:
    subprocess.run(["bash", str(SCRIPTS / "kafka.sh"), command], check=True, capture_output=True, timeout=TIMEOUT)


def store_rows(pipeline, session_id):
    with pipeline.store.engine.connect() as conn:
        turns = conn.execute(
            select(transcript_turns).where(transcript_turns.c.session_id == session_id).order_by(transcript_turns.c.turn_index)
        ).mappings().all()
        payloads = conn.execute(
            select(session_events.c.payload).where(session_events.c.session_id == session_id).order_by(session_events.c.seq)
        ).scalars().all()
    return turns, payloads


def agent_killed_without_a_broker(pipeline, session_id, tmp_path):
    """An agent whose broker never answers talks, degraded, for five turns and is SIGKILLed: its
    events are all in its spool. Returns its settings (the unreachable broker) and its last completed turn."""
    unreachable = pipeline.settings.model_copy(update={"bootstrap_servers": "127.0.0.1:1", "ack_wait_seconds": 0.2})
    agent = ScriptedAgent(unreachable, "talk", session_id, tmp_path / "agent.log")
    agent.wait_for(lambda lines: lines and lines[-1].get("completed", -1) >= 4 and lines[-1]["degraded"], "five turns, degraded", TIMEOUT)
    agent.process.kill()
    return unreachable, agent.completed()


def assert_aggregates_match_the_log(row, payloads):
    folded = fold_events(payloads)
    assert folded.seqs == list(range(len(payloads))), "the event log has a gap or a duplicate seq"
    assert (row["turn_count"], row["interrupted_turn_count"], row["input_tokens"], row["output_tokens"]) == (
        folded.turn_count, folded.interrupted_turn_count, folded.input_tokens, folded.output_tokens
    )
    assert row["duration_seconds"] == pytest.approx(folded.duration_seconds, abs=0.002)


@pytest.mark.outage  # it stops the shared broker
def test_an_agent_killed_during_a_long_broker_outage_loses_no_completed_turn(new_pipeline, tmp_path):
    if not (STATE / "kafka" / "kafka.pid").exists():
        pytest.fail(f"this test restarts the local broker: start it with `bash deploy/services.sh start` (state in {STATE})", pytrace=False)
    pipeline = new_pipeline(
        ("sequencer", "sink", "finalizer"), delivery_timeout_seconds=DELIVERY_TIMEOUT, ack_wait_seconds=0.5
    )
    pipeline.wait_ready()
    session_id = f"outage-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)  # the scripted agent's session
    agent = ScriptedAgent(pipeline.settings, "talk", session_id, tmp_path / "agent.log")
    agent.wait_for(lambda lines: any(line.get("completed") == 3 for line in lines), "turn 3 completed", TIMEOUT)

    pid = int((STATE / "kafka" / "kafka.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    outage_began = time.monotonic()
    broker_down = True
    try:
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=30, what="the broker process gone")
        before = agent.completed()
        # The agent keeps talking, degraded, past the delivery timeout: nothing is given up.
        agent.wait_for(
            lambda lines: lines and lines[-1].get("degraded") and lines[-1]["completed"] >= before + 5
            and time.monotonic() - outage_began > DELIVERY_TIMEOUT * 2,
            "talking on, degraded, past twice the delivery timeout",
            TIMEOUT,
        )
        agent.process.kill()
        last_completed = agent.completed()
        assert last_completed >= before + 5
        spool_files = list(Path(pipeline.settings.spool_dir).glob("spool-*.db"))
        assert spool_files, "the killed agent left its spool behind"
        wait_until(lambda: time.monotonic() - outage_began >= OUTAGE_SECONDS, timeout=OUTAGE_SECONDS + 5,
                   what="the outage to last its full length", interval=1)
        kafka("start")
        broker_down = False
    finally:
        if broker_down:
            kafka("start")

    async def resume_in_a_new_process():
        # Same host and spool folder: this recorder adopts the dead one's spool and delivers it first.
        async with recorder_for(pipeline.settings) as recorder:
            session = await recorder.resume(key, timeout=TIMEOUT)
            assert session.epoch == 1 and session.next_turn_index in (last_completed + 1, last_completed + 2)
            assert [(t.turn_index, t.text, t.status) for t in session.turns[: last_completed + 1]] == [
                (i, f"turn {i} said in full", "complete") for i in range(last_completed + 1)
            ]
            index = session.next_turn_index
            await session.complete_turn(index, "A", "after the outage", input_tokens=2)
            await session.end("completed")
            return index

    resumed_turn = asyncio.run(resume_in_a_new_process())
    row = wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="finalized after the outage")
    turns, payloads = store_rows(pipeline, key)
    completed = [(t["turn_index"], t["speaker"], t["text"]) for t in turns if t["status"] == "complete"]
    assert completed[: last_completed + 1] == [(i, "AB"[i % 2], f"turn {i} said in full") for i in range(last_completed + 1)]
    assert completed[-1] == (resumed_turn, "A", "after the outage")
    assert len(completed) in (last_completed + 2, last_completed + 3)  # turn N+1 may have been spooled, not reported
    assert row["epoch"] == 1
    assert_aggregates_match_the_log(row, payloads)
    assert not list(Path(pipeline.settings.spool_dir).glob("spool-*.db")), "a spool was left undelivered"
    assert all(p.alive() for p in pipeline.processes.values()), pipeline.logs()


def test_overlapping_open_turns_and_a_barge_in_survive_a_sigkill(new_pipeline, tmp_path):
    pipeline = new_pipeline(("sequencer", "sink", "finalizer"))
    session_id = f"overlap-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)  # the scripted agent's session
    agent = ScriptedAgent(pipeline.settings, "overlap", session_id, tmp_path / "agent.log")
    ready = agent.first_with("ready", TIMEOUT)  # both turns open and acknowledged
    assert ready["open_turns"] == [2, 3]
    agent.process.kill()

    async def resume_and_end():
        async with recorder_for(pipeline.settings) as recorder:
            session = await recorder.resume(key, timeout=TIMEOUT)
            assert session.next_turn_index == 4
            assert [(t.turn_index, t.text, t.status, t.barged_in) for t in session.turns] == [
                (0, "hello there", "complete", False),
                (1, "Let me tell you about our", "complete", True),
                (2, "wait, what about", "partial", False),
                (3, "Of course,", "partial", False),
            ]
            await session.complete_turn(4, "user", "wait, what about the price?")
            await session.end("completed")

    asyncio.run(resume_and_end())
    row = wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="finalized")
    turns, payloads = store_rows(pipeline, key)
    assert [(t["turn_index"], t["speaker"], t["text"], t["status"], t["barged_in"]) for t in turns] == [
        (0, "user", "hello there", "complete", False),
        (1, "agent", "Let me tell you about our", "complete", True),
        (2, "user", "wait, what about", "interrupted", False),
        (3, "agent", "Of course,", "interrupted", False),
        (4, "user", "wait, what about the price?", "complete", False),
    ]
    assert (row["turn_count"], row["interrupted_turn_count"]) == (5, 2)
    assert_aggregates_match_the_log(row, payloads)


def test_spool_drain_delivers_what_an_agent_that_never_reached_the_broker_left(new_pipeline, tmp_path):
    pipeline = new_pipeline(("sequencer", "sink", "finalizer"))
    session_id = f"nobroker-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)  # the scripted agent's session
    _, last_completed = agent_killed_without_a_broker(pipeline, session_id, tmp_path)

    env = {**os.environ, **pipeline.settings.as_environment()}
    drained = subprocess.run(
        [sys.executable, "-m", "turnlog.cli", "spool-drain", "--timeout", "60"], env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert drained.returncode == 0, drained.stderr[-3000:]
    assert "all delivered" in drained.stdout
    assert not list(Path(pipeline.settings.spool_dir).glob("spool-*.db"))

    def stored_complete():
        turns, _ = store_rows(pipeline, key)
        return [(t["turn_index"], t["text"]) for t in turns if t["status"] == "complete"]

    wait_until(lambda: len(stored_complete()) > last_completed, timeout=TIMEOUT, what="the drained turns stored")
    assert stored_complete()[: last_completed + 1] == [(i, f"turn {i} said in full") for i in range(last_completed + 1)]


def test_a_resume_waits_for_another_live_recorder_that_adopted_the_dead_agents_spool(new_pipeline, tmp_path):
    # An agent dies with undelivered events; another agent's recorder on the host adopts its spool
    # (it holds them while the broker is away for it); the session's resume must not claim the next
    # epoch before they are delivered, else the old epoch's events land after the resume position.
    pipeline = new_pipeline(("sequencer", "sink", "finalizer"))
    session_id = f"heldelsewhere-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)  # the scripted agent's session
    unreachable, last_completed = agent_killed_without_a_broker(pipeline, session_id, tmp_path)
    holder = ScriptedAgent(unreachable, "hold", session_id, tmp_path / "holder.log")
    held = holder.first_with("holding", TIMEOUT)["holding"]
    assert held > last_completed, "the holder adopted the dead agent's spool"

    async def resume_and_end():
        async with recorder_for(pipeline.settings) as recorder:
            with pytest.raises(ResumeBarrierTimeout) as waited:
                await recorder.resume(key, timeout=3)
            assert waited.value.undelivered_events == held
            assert recorder.spooled_events(key) == 0, "a live recorder's spool is not adopted"
            resuming = asyncio.create_task(recorder.resume(key, timeout=TIMEOUT))
            holder.process.kill()  # its spool is an orphan now: the waiting resume adopts and delivers it
            session = await resuming
            assert session.epoch == 1 and session.next_turn_index in (last_completed + 1, last_completed + 2)
            index = session.next_turn_index
            await session.complete_turn(index, "A", "after the resume", input_tokens=2)
            await session.end("completed")
            return index

    resumed_turn = asyncio.run(resume_and_end())
    row = wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="finalized after the resume")
    turns, payloads = store_rows(pipeline, key)
    completed = [(t["turn_index"], t["speaker"], t["text"]) for t in turns if t["status"] == "complete"]
    assert completed[: last_completed + 1] == [(i, "AB"[i % 2], f"turn {i} said in full") for i in range(last_completed + 1)]
    assert completed[-1] == (resumed_turn, "A", "after the resume")
    assert row["epoch"] == 1
    assert_aggregates_match_the_log(row, payloads)
    assert not list(Path(pipeline.settings.spool_dir).glob("spool-*.db")), "a spool was left undelivered"
