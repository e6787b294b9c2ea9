"""The sequencer's state and records stay bounded in bytes on the real broker: a gap behind
megabytes of large partials, an event too large to carry, and a record the broker refuses
never stop the worker, and the healthy sessions of the same partition are stored intact."""

from __future__ import annotations

import base64
import json
import os
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from turnlog import kafka
from turnlog.producers import partition_for
from turnlog.schemas import MAX_TEXT_CHARS, decode_event
from turnlog.stream_processors.sequencer import MAX_STATE_BYTES, TABLE_NAME

from tests.integration.test_pipeline import finalized, read_partition, stored_turns
from tests.support import EventFactory, signed_event, wait_until

pytestmark = pytest.mark.integration
TIMEOUT = 120


def ids_on_one_partition(prefix: str, count: int, partitions: int) -> list[str]:
    """``count`` fresh session ids whose records all go to the same partition."""
    found: list[str] = []
    target = None
    while len(found) < count:
        session_id = f"{prefix}-{uuid.uuid4().hex[:10]}"
        partition = partition_for(session_id, partitions)
        if target is None or partition == target:
            target = partition
            found.append(session_id)
    return found


def incompressible_text(chars: int = MAX_TEXT_CHARS) -> str:
    return base64.b64encode(os.urandom(chars)).decode()[:chars]


def healthy_events(f: EventFactory) -> list:
    return [f.started(), f.completed(1, 0, f"turn of {f.session_id}"), f.ended(2, last_turn=0)]


def assert_stored_intact(pipeline, sessions: list[EventFactory]) -> None:
    for f in sessions:
        wait_until(lambda f=f: finalized(pipeline, f.session_id), timeout=TIMEOUT, what=f"{f.session_id} finalized")
        assert [tuple(t) for t in stored_turns(pipeline, f.session_id)] == [(0, "A", f"turn of {f.session_id}", "complete")]


def changelog(pipeline) -> str:
    return f"{pipeline.settings.sequencer_group}-{TABLE_NAME}-changelog"


def stored_states(pipeline, session_id: str) -> list[bytes]:
    return read_partition(pipeline, changelog(pipeline), session_id)


def test_a_gap_behind_megabytes_of_partials_keeps_the_worker_running_and_its_state_small(new_pipeline):
    pipeline = new_pipeline(("sequencer", "sink"))
    pipeline.wait_ready()
    settings = pipeline.settings
    big_id, *healthy_ids = ids_on_one_partition("bounds", 8, settings.partitions)
    big, healthy = EventFactory(big_id), [EventFactory(i) for i in healthy_ids]
    producer = kafka.producer(settings, client_id="test-bounds", delivery_timeout_seconds=30)  # lz4, as the recorder's
    topic = settings.topics.events
    sent: dict[int, bytes] = {}

    def produce(event) -> None:
        key, value, headers = signed_event(settings, event)
        if event.session_id == big_id:
            sent[event.seq] = value
        producer.produce(topic, key=key, value=value, headers=headers)

    produce(big.started())
    # seq 1 is late: 13 partials of a long turn (~256 KiB of barely compressible text each, 3.4 MB
    # in all) wait behind it, the healthy sessions' events among them, each pair in its own flush.
    for n, seq in enumerate(range(2, 15)):
        produce(big.partial(seq, 0, incompressible_text()))
        for event in healthy_events(healthy[n % len(healthy)]) if n < len(healthy) else []:
            produce(event)
        assert producer.flush(30) == 0

    assert_stored_intact(pipeline, healthy)
    # The state went through the changelog holding all 13 partials, as positions.
    wait_until(lambda: any(len(json.loads(s)["buffered"]) == 13 for s in stored_states(pipeline, big_id)),
               timeout=TIMEOUT, what="the state with 13 buffered partials stored")
    assert pipeline.processes["sequencer"].popen.poll() is None, pipeline.logs()

    produce(big.partial(1, 0, "the late one"))
    produce(big.ended(15, last_turn=0))
    assert producer.flush(30) == 0
    wait_until(lambda: finalized(pipeline, big_id), timeout=TIMEOUT, what="the gapped session finalized")
    transcript = read_partition(pipeline, settings.topics.transcript, big_id)
    assert [decode_event(value).seq for value in transcript] == list(range(16))
    assert transcript == [sent[seq] for seq in range(16)]  # each event's own bytes, in seq order
    assert [tuple(t)[:2] + (tuple(t)[3],) for t in stored_turns(pipeline, big_id)] == [(0, "A", "interrupted")]
    assert stored_turns(pipeline, big_id)[0].text == decode_event(sent[14]).text
    states = stored_states(pipeline, big_id)
    assert max(len(state) for state in states) < 4_096 < MAX_STATE_BYTES
    assert read_partition(pipeline, settings.topics.dlq, big_id) == []
    assert pipeline.processes["sequencer"].popen.poll() is None, pipeline.logs()


def test_records_the_sequencer_cannot_send_go_to_the_dlq_as_references_and_the_worker_goes_on(new_pipeline):
    pipeline = new_pipeline(("sequencer", "sink"))
    pipeline.wait_ready()
    settings = pipeline.settings
    huge_id, refused_id, *healthy_ids = ids_on_one_partition("refs", 6, settings.partitions)
    huge, refused, healthy = EventFactory(huge_id), EventFactory(refused_id), [EventFactory(i) for i in healthy_ids]
    # The transcript topic now takes less than the events topic (an operator's change): an event of
    # 262 KB reaches the sequencer, and the broker refuses it on the transcript.
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    resource = ConfigResource(ResourceType.TOPIC, settings.topics.transcript, incremental_configs=[
        ConfigEntry("max.message.bytes", "200000", incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    # A writer that compresses: the broker takes a 1 MiB event (4-byte characters) that the
    # sequencer cannot send on (over its producer's message.max.bytes).
    writer = Producer({"bootstrap.servers": settings.bootstrap_servers, "partitioner": "murmur2_random",
                       "compression.type": "lz4", "message.max.bytes": 5_000_000})
    topic = settings.topics.events
    events = [
        huge.started(), healthy[0].started(), huge.partial(1, 0, "\U0001f600" * MAX_TEXT_CHARS),
        refused.started(), healthy[0].completed(1, 0, f"turn of {healthy[0].session_id}"),
        refused.completed(1, 0, incompressible_text()),
        healthy[0].ended(2, last_turn=0), *healthy_events(healthy[1]), refused.ended(2, last_turn=0),
        *healthy_events(healthy[2]), *healthy_events(healthy[3]),
    ]
    for event in events:
        key, value, headers = signed_event(settings, event)
        writer.produce(topic, key=key, value=value, headers=headers)
    assert writer.flush(30) == 0

    assert_stored_intact(pipeline, healthy)
    [too_large] = wait_until(lambda: read_partition(pipeline, settings.topics.dlq, huge_id, with_headers=True),
                             timeout=TIMEOUT, what="the too-large event's reference in the DLQ")
    value, headers = too_large
    assert value == b"" and dict(headers)["turnlog-reason"].startswith(b"too large: the event would be a ")
    [refusal] = wait_until(lambda: read_partition(pipeline, settings.topics.dlq, refused_id, with_headers=True),
                           timeout=TIMEOUT, what="the refused record's reference in the DLQ")
    value, headers = refusal
    assert value == b"" and dict(headers)["turnlog-reason"].startswith(b"refused: the broker refused it")
    # The refused session goes on around its hole: its end is in the transcript, seq 1 is not.
    assert [decode_event(v).seq for v in read_partition(pipeline, settings.topics.transcript, refused_id)] == [0, 2]
    assert pipeline.processes["sequencer"].popen.poll() is None, pipeline.logs()
