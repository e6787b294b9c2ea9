"""Zombie workers on the cluster: a worker frozen (SIGSTOP) past its session timeout, whose
partitions moved to another worker, writes nothing when it wakes (SIGCONT).

The zombie freezes itself at a fault point (``TURNLOG_FAULTS=...=stop@1``), so the test knows
what it holds: a consumed batch not yet written (``sink.after_poll``), or a batch written in an
open transaction not yet committed (``sink.after_write``: it holds the offsets' row locks).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from turnlog.deploy.processes import ServiceProcess, turnlog_command
from turnlog.producers import SessionRecorder

from tests.cluster.conversations import Conversations, assert_stored_as_said
from tests.support import dump_store, fenced_batches, free_port, wait_until

TIMEOUT = 240
#: The sink that takes over holds its first batch this long before writing it (ms): the window in
#: which only the zombie could write.
TAKEOVER_STALL_MS = 40_000


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T``: stopped by a signal)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def sink_process(pipeline, name: str, **env: str) -> ServiceProcess:
    log_dir = pipeline.log_dir
    process = ServiceProcess(
        name, turnlog_command("sink"), {**pipeline.settings.as_environment(), **env}, log_dir / f"{name}.log",
        ready_path=log_dir / f"{name}.ready",
    )
    pipeline.processes[name] = process
    return process


@pytest.mark.parametrize("frozen_at", ["sink.after_poll", "sink.after_write"])
def test_a_zombie_sink_woken_after_its_partitions_moved_writes_nothing(cluster_pipeline, frozen_at):
    pipeline = cluster_pipeline(("sequencer",))
    zombie_metrics = free_port()
    zombie = sink_process(pipeline, "sink-zombie", TURNLOG_FAULTS=f"{frozen_at}=stop@1",
                          TURNLOG_METRICS_PORT=str(zombie_metrics))
    pipeline.wait_ready()

    async def talk():
        async with SessionRecorder(pipeline.settings) as recorder:
            conversations = Conversations(recorder, 3, f"{pipeline.settings.topic_prefix}-zombie")
            await conversations.open()
            await conversations.talk(turns=6)
            await conversations.end(delivered_within=TIMEOUT)
            return conversations

    said = asyncio.run(talk())
    wait_until(lambda: process_state(zombie.pid) == "T", timeout=TIMEOUT, what=f"the sink stopped at {frozen_at}")

    # The group moves every partition to the new sink once the frozen one's session times out;
    # the new sink claims them (ready) and then holds its first batch unwritten for TAKEOVER_STALL_MS.
    successor = sink_process(pipeline, "sink-successor", TURNLOG_FAULTS=f"sink.after_poll=stall:{TAKEOVER_STALL_MS}@1")
    successor.wait_ready(TIMEOUT)
    before = dump_store(pipeline.store, skip_columns=())
    zombie.popen.send_signal(signal.SIGCONT)
    wait_until(lambda: fenced_batches(zombie_metrics) >= 1, timeout=TAKEOVER_STALL_MS / 1000 / 2,
               what="the woken sink's batch refused by the fence")
    assert dump_store(pipeline.store, skip_columns=()) == before, "the zombie wrote after it woke"
    assert successor.alive() and zombie.alive(), pipeline.logs()

    assert_stored_as_said(pipeline, said, timeout=TIMEOUT)  # the successor writes everything, once
