"""The broker SIGKILLed and Postgres stopped mid-run: the pipeline recovers by itself.

These restart the shared local services with the deploy scripts (the same ones
CI uses), so they run only against a broker and Postgres started by
``deploy/services.sh`` on this machine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from turnlog import kafka
from turnlog.deploy.local import SCRIPTS
from turnlog.producers import SessionRecorder

from tests.integration.test_pipeline import finalized, stored_turns
from tests.support import wait_until

TIMEOUT = 180
STATE = Path(os.environ.get("TURNLOG_STATE_DIR", Path.home() / ".cache" / "turnlog"))
pytestmark = pytest.mark.outage  # each test stops the shared broker or Postgres


@pytest.fixture
def pipeline(new_pipeline):
    if not (STATE / "kafka" / "kafka.pid").exists():
        pytest.fail(f"these tests restart the local services: start them with `bash deploy/services.sh start` (state in {STATE})", pytrace=False)
    running = new_pipeline(("sequencer", "sink", "finalizer"))
    running.wait_ready()  # the outage hits a running pipeline, not one starting up
    return running


def script(name, command):
    subprocess.run(["bash", str(SCRIPTS / name), command], check=True, capture_output=True, timeout=TIMEOUT)


async def record(settings, session_id, turns, outage_after, outage):
    """Record ``turns`` turns; run ``outage()`` (blocking) after turn ``outage_after``; returns the session's key."""
    async with SessionRecorder(settings) as recorder:
        session = await recorder.start_session(session_id, fleet="tests", agent_id="outage")
        for index in range(turns):
            if index == outage_after:
                await asyncio.to_thread(outage)
            await session.complete_turn(index, "A", f"turn {index} before and after the outage")
        await session.end("completed")
        return session.session_id


def check(pipeline, key, turns):
    row = wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{key} finalized after the outage")
    assert [tuple(t) for t in stored_turns(pipeline, key)] == [
        (i, "A", f"turn {i} before and after the outage", "complete") for i in range(turns)
    ]
    assert row["turn_count"] == turns and row["last_seq"] == turns + 1


def test_the_pipeline_recovers_from_a_broker_killed_with_sigkill(pipeline):
    def kill_and_restart_broker():
        pid = int((STATE / "kafka" / "kafka.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=30, what="the broker process gone")
        script("kafka.sh", "start")

    key = asyncio.run(record(pipeline.settings, f"broker-{uuid.uuid4().hex[:6]}", 10, 4, kill_and_restart_broker))
    check(pipeline, key, 10)
    assert all(p.alive() for p in pipeline.processes.values()), pipeline.logs()


def test_the_sink_stays_in_its_group_through_a_postgres_outage_longer_than_its_poll_interval(new_pipeline):
    # max.poll.interval.ms of 10 s: a sink that stopped polling while it retried
    # the store would leave its group during this 25 s outage.
    pipeline = new_pipeline(("sequencer", "sink"), sink_max_poll_interval_seconds=10)
    pipeline.wait_ready()
    admin = kafka.admin(pipeline.settings)
    group = pipeline.settings.sink_group
    members_before = wait_until(lambda: (m := kafka.group_members(admin, group)).stable and m.member_ids and m, timeout=60,
                                what="the sink's group stable")

    async def record_during_outage():
        async with SessionRecorder(pipeline.settings) as recorder:
            session = await recorder.start_session(f"postgres-{uuid.uuid4().hex[:6]}", fleet="tests", agent_id="outage")
            await session.complete_turn(0, "A", "turn 0 before and after the outage")
            script("postgres.sh", "stop")
            try:
                for index in range(1, 8):  # the broker still takes turns while the store is down
                    await session.complete_turn(index, "A", f"turn {index} before and after the outage")
                outage_ends = time.monotonic() + 25
                while time.monotonic() < outage_ends:  # the same member, the group stable, all along
                    members = kafka.group_members(admin, group)
                    assert members.stable and members.member_ids == members_before.member_ids, members
                    await asyncio.sleep(1.0)  # one look a second through the outage: an observation, not a sync
            finally:
                script("postgres.sh", "start")
            await session.end("completed")
            return session.session_id

    key = asyncio.run(record_during_outage())
    check(pipeline, key, 8)
    assert kafka.group_members(admin, group).member_ids == members_before.member_ids
    assert all(p.alive() for p in pipeline.processes.values()), pipeline.logs()


def test_services_started_while_postgres_is_down_wait_for_it(new_pipeline):
    if not (STATE / "postgres").exists():
        pytest.fail(f"this test stops the local Postgres: start it with `bash deploy/services.sh start` (state in {STATE})", pytrace=False)
    pipeline = new_pipeline(("sequencer",))
    script("postgres.sh", "stop")
    try:
        pipeline.start("sink", "finalizer")
        exited = lambda: [n for n in ("sink", "finalizer") if not pipeline.processes[n].alive()]  # noqa: E731
        with pytest.raises(AssertionError, match="timed out"):  # before, both exited at once, in a crash loop
            wait_until(exited, timeout=8, what="a service to exit while Postgres is down")
    finally:
        script("postgres.sh", "start")
    key = asyncio.run(record(pipeline.settings, f"pgstart-{uuid.uuid4().hex[:6]}", 3, -1, lambda: None))
    check(pipeline, key, 3)
