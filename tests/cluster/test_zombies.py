"""Zombie workers on the cluster: a worker frozen (SIGSTOP) past its session timeout, whose
partitions moved to another worker, writes nothing when it wakes (SIGCONT).

The zombie freezes itself at a fault point (``TURNLOG_FAULTS=...=stop@1``), so the test knows
what it holds: a consumed batch not yet written (``sink.after_poll``), a batch written in an
open transaction not yet committed (``sink.after_write``: it holds the offsets' row locks), or
a sequencer's batch produced in a Kafka transaction not yet committed (``sequencer.before_commit``).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from turnlog.deploy.processes import ServiceProcess, turnlog_command
from turnlog.producers import SessionRecorder

from tests.cluster.conversations import Conversations, assert_stored_as_said
from tests.crash.test_recorder_outages import store_rows
from tests.support import dump_store, fenced_batches, free_port, wait_until

TIMEOUT = 240
#: The sink that takes over holds its first batch this long before writing it (ms): the window in
#: which only the zombie could write.
TAKEOVER_STALL_MS = 40_000


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T``: stopped by a signal)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def service_process(pipeline, name: str, service: str = "sink", **env: str) -> ServiceProcess:
    """Start ``turnlog <service>`` as ``name`` in ``pipeline``, with ``env`` on top of its settings."""
    log_dir = pipeline.log_dir
    process = ServiceProcess(
        name, turnlog_command(service), {**pipeline.settings.as_environment(), **env}, log_dir / f"{name}.log",
        ready_path=log_dir / f"{name}.ready",
    )
    pipeline.processes[name] = process
    return process


@pytest.mark.parametrize("frozen_at", ["sink.after_poll", "sink.after_write"])
def test_a_zombie_sink_woken_after_its_partitions_moved_writes_nothing(cluster_pipeline, frozen_at):
    pipeline = cluster_pipeline(("sequencer",))
    zombie_metrics = free_port()
    zombie = service_process(pipeline, "sink-zombie", TURNLOG_FAULTS=f"{frozen_at}=stop@1",
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
    successor = service_process(pipeline, "sink-successor", TURNLOG_FAULTS=f"sink.after_poll=stall:{TAKEOVER_STALL_MS}@1")
    successor.wait_ready(TIMEOUT)
    before = dump_store(pipeline.store, skip_columns=())
    zombie.popen.send_signal(signal.SIGCONT)
    wait_until(lambda: fenced_batches(zombie_metrics) >= 1, timeout=TAKEOVER_STALL_MS / 1000 / 2,
               what="the woken sink's batch refused by the fence")
    assert dump_store(pipeline.store, skip_columns=()) == before, "the zombie wrote after it woke"
    assert successor.alive() and zombie.alive(), pipeline.logs()

    assert_stored_as_said(pipeline, said, timeout=TIMEOUT)  # the successor writes everything, once


def test_a_zombie_sequencer_woken_after_its_partitions_moved_is_fenced_and_its_states_never_restored(
    cluster_pipeline,
):
    """The zombie freezes with its first batch produced in a transaction not yet committed; the
    successor fences it (``init_transactions``) and sequences everything since. Woken, the zombie's
    commit is refused and it stops. A third sequencer then restores the changelog: were a state of
    the zombie's there (older than the successor's), the sessions' next turns would wait on a seq
    emitted long ago and never be stored."""
    pipeline = cluster_pipeline(("sink",))
    zombie = service_process(pipeline, "sequencer-zombie", "sequencer", TURNLOG_FAULTS="sequencer.before_commit=stop@1")
    pipeline.wait_ready()

    def turns_stored(conversations: Conversations) -> bool:
        return all(len(store_rows(pipeline, session_id)[0]) == len(said)
                   for session_id, said in conversations.said.items())

    async def talk():
        async with SessionRecorder(pipeline.settings) as recorder:
            conversations = Conversations(recorder, 3, f"{pipeline.settings.topic_prefix}-zombie")
            await conversations.open()
            await conversations.talk(turns=3)
            await asyncio.to_thread(wait_until, lambda: process_state(zombie.pid) == "T", timeout=TIMEOUT,
                                    what="the sequencer stopped before its first commit")
            successor = service_process(pipeline, "sequencer-successor", "sequencer")
            await asyncio.to_thread(successor.wait_ready, TIMEOUT)
            await conversations.talk(turns=3)
            await asyncio.to_thread(wait_until, lambda: turns_stored(conversations), timeout=TIMEOUT,
                                    what="every turn stored through the successor")

            zombie.popen.send_signal(signal.SIGCONT)
            await asyncio.to_thread(wait_until, lambda: zombie.popen.poll() is not None, timeout=TIMEOUT,
                                    what="the woken sequencer stopped by the fence")
            assert successor.alive(), pipeline.logs()

            successor.popen.kill()  # the next owner restores every session's state from the changelog
            successor.popen.wait(TIMEOUT)
            third = service_process(pipeline, "sequencer-third", "sequencer")
            await asyncio.to_thread(third.wait_ready, TIMEOUT)
            await conversations.talk(turns=2)
            await conversations.end(delivered_within=TIMEOUT)
            return conversations

    said = asyncio.run(talk())
    assert zombie.popen.returncode != 0, "the fenced sequencer exited as if nothing happened"
    assert_stored_as_said(pipeline, said, timeout=TIMEOUT)
