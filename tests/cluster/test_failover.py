"""Broker failures on a replicated cluster under load: a partition leader SIGKILLed, a leader
SIGSTOPped past the producers' request timeout, two of three nodes down (below min ISR). The
recorder rides each out on its spool, the services keep running, and the store ends with every
turn once, in order."""

from __future__ import annotations

import asyncio
import time

from turnlog.kafka.partitioning import partition_for

from tests.cluster.conversations import Conversations, assert_stored_as_said
from tests.support import recorder_for, wait_until

TIMEOUT = 240
SERVICES = ("sequencer", "sink", "finalizer")


def test_a_leader_killed_under_load_loses_and_duplicates_nothing(cluster_pipeline, kafka_cluster):
    pipeline = cluster_pipeline(SERVICES)
    pipeline.wait_ready()
    events = pipeline.settings.topics.events

    async def talk_through_the_kill():
        async with recorder_for(pipeline.settings) as recorder:
            talk = Conversations(recorder, 6, f"{pipeline.settings.topic_prefix}-leaderkill")
            await talk.open()
            await talk.talk(turns=3)
            leader = kafka_cluster.busiest_leader([events])
            killing = asyncio.create_task(asyncio.to_thread(kafka_cluster.kill, leader))
            await talk.talk(turns=25)
            await killing
            await talk.end(delivered_within=TIMEOUT)
            return talk, leader

    talk, leader = asyncio.run(talk_through_the_kill())
    assert leader not in {p.leader for p in kafka_cluster.partitions([events])}, "leadership moved off the dead node"
    pipeline.wait_ready(TIMEOUT)  # every service ready with one broker down
    assert_stored_as_said(pipeline, talk, timeout=TIMEOUT)
    kafka_cluster.start(leader)
    assert all(p.alive() for p in pipeline.processes.values()), pipeline.logs()


def test_a_leader_paused_past_the_request_timeout_loses_and_duplicates_nothing(cluster_pipeline, kafka_cluster):
    pipeline = cluster_pipeline(SERVICES)
    pipeline.wait_ready()
    events = pipeline.settings.topics.events
    request_timeout = 5.0

    async def talk_through_the_pause():
        # The recorder's requests to the frozen leader time out (5 s here) and are sent again, to the
        # new leader once the controller has moved leadership off the node that stopped heartbeating.
        async with recorder_for(
            pipeline.settings, producer_config={"request.timeout.ms": int(request_timeout * 1000)}
        ) as recorder:
            talk = Conversations(recorder, 6, f"{pipeline.settings.topic_prefix}-pause")
            await talk.open()
            await talk.talk(turns=3)
            paused = kafka_cluster.busiest_leader([events])
            kafka_cluster.pause(paused)
            try:
                wake_at = time.monotonic() + 3 * request_timeout
                await talk.talk(until=lambda: time.monotonic() >= wake_at)
            finally:
                kafka_cluster.resume(paused)
            await talk.talk(turns=5)
            await talk.end(delivered_within=TIMEOUT)
            return talk

    talk = asyncio.run(talk_through_the_pause())
    assert_stored_as_said(pipeline, talk, timeout=TIMEOUT)
    assert all(p.alive() for p in pipeline.processes.values()), pipeline.logs()


def test_below_min_isr_the_recorder_degrades_to_its_spool_and_recovers_by_itself(cluster_pipeline, kafka_cluster):
    pipeline = cluster_pipeline(SERVICES, ack_wait_seconds=0.5)
    pipeline.wait_ready()
    events = pipeline.settings.topics.events

    async def talk_through_the_loss():
        async with recorder_for(pipeline.settings) as recorder:
            talk = Conversations(recorder, 4, f"{pipeline.settings.topic_prefix}-minisr")
            await talk.open()
            await talk.talk(turns=3)
            survivor = kafka_cluster.busiest_leader([events])
            down = [node for node in kafka_cluster.node_ids if node != survivor]
            for node in down:
                kafka_cluster.kill(node)
            said_before = sum(map(len, talk.said.values()))
            await talk.talk(until=lambda: recorder.degraded and sum(map(len, talk.said.values())) >= said_before + 20)
            assert recorder.spooled_events() > 0, "acks=all with one of three replicas: nothing acknowledged"
            await asyncio.to_thread(kafka_cluster.start)
            # No operator action: the spool drains once the ISR is back, and the recorder leaves degraded mode.
            await asyncio.to_thread(
                wait_until, lambda: recorder.spooled_events() == 0 and not recorder.degraded,
                timeout=TIMEOUT, what="the spool delivered after the nodes came back",
            )
            await talk.talk(turns=3)
            await talk.end(delivered_within=TIMEOUT)
            return talk

    talk = asyncio.run(talk_through_the_loss())
    assert_stored_as_said(pipeline, talk, timeout=TIMEOUT)
    assert all(p.alive() for p in pipeline.processes.values()), pipeline.logs()


def test_a_resume_passes_the_barrier_while_its_partition_leader_fails_over(cluster_pipeline, kafka_cluster):
    pipeline = cluster_pipeline(SERVICES)
    pipeline.wait_ready()
    settings = pipeline.settings

    async def talk_then_leave():
        async with recorder_for(settings) as recorder:
            talk = Conversations(recorder, 1, f"{settings.topic_prefix}-resume-failover")
            await talk.open()
            await talk.talk(turns=5)
            assert await talk.sessions[0].wait_acknowledged(TIMEOUT)
            return talk

    talk = asyncio.run(talk_then_leave())
    session_id = talk.sessions[0].session_id  # the session's key, which picks its partition
    leader = kafka_cluster.leader_of(settings.topics.events, partition_for(session_id, settings.partitions))

    async def resume_during_the_failover():
        async with recorder_for(settings) as recorder:
            # The barrier reads the end offset of the session's events partition while its leader fails.
            killing = asyncio.create_task(asyncio.to_thread(kafka_cluster.kill, leader))
            session = await recorder.resume(session_id, timeout=TIMEOUT)
            await killing
            assert (session.epoch, session.next_turn_index) == (1, 5)
            assert [(t.turn_index, t.text) for t in session.turns] == [(i, text) for i, _, text in talk.said[session_id]]
            talk.sessions[:] = [session]
            await talk.talk(turns=2)
            await talk.end(delivered_within=TIMEOUT)

    asyncio.run(resume_during_the_failover())
    assert_stored_as_said(pipeline, talk, timeout=TIMEOUT)
