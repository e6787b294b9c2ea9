"""The sequencer re-reads a gap from the log: records a consumer skipped are not lost."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from turnlog.producers import partition_for
from turnlog.schemas.session_keys import session_key
from turnlog.stream_processors.log_ranges import LogRangeReader

from tests.integration.test_pipeline import finalized, stored_turns
from tests.support import EventFactory, signed_event, wait_until

TIMEOUT = 90


@pytest.fixture
def pipeline_without_sequencer(new_pipeline):
    return new_pipeline(("sink",))  # the sink finalizes the session in the batch that closes its gap


def produce(settings, events):
    """``events`` on the events topic, signed as their fleet's; their offsets."""
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "partitioner": "murmur2_random"})
    offsets = []
    for event in events:
        key, value, headers = signed_event(settings, event)
        producer.produce(
            settings.topics.events, key=key, value=value, headers=headers,
            on_delivery=lambda err, msg: offsets.append(msg.offset()),
        )
    assert producer.flush(10) == 0
    return offsets


def test_records_the_sequencer_group_committed_past_are_re_read_and_stored(pipeline_without_sequencer):
    """A consumer that committed past records it never processed (faust-streaming does, around restores)."""
    pipeline = pipeline_without_sequencer
    settings = pipeline.settings
    # keyed as the recorder writes it: its fleet owns the key from whichever seq comes first
    f = EventFactory(session_key("tests", f"gap-{uuid.uuid4().hex[:8]}"))
    events = [f.started(), f.completed(1, 0, "zero"), f.completed(2, 1, "one"), f.completed(3, 2, "two"), f.ended(4, last_turn=2)]
    offsets = produce(settings, events)
    # As if a stream processor had dropped seq 0..2 and committed past them:
    partition = partition_for(f.session_id, settings.partitions)
    committer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": settings.sequencer_group, "enable.auto.commit": False})
    committer.commit(offsets=[TopicPartition(settings.topics.events, partition, offsets[3])], asynchronous=False)
    committer.close()

    pipeline.start("sequencer")

    wait_until(lambda: finalized(pipeline, f.session_id), timeout=TIMEOUT, what="the session finalized after gap repair")
    assert [tuple(t) for t in stored_turns(pipeline, f.session_id)] == [
        (0, "A", "zero", "complete"), (1, "A", "one", "complete"), (2, "A", "two", "complete"),
    ]


def test_the_range_reader_returns_only_the_sessions_records_in_the_range(pipeline_without_sequencer):
    settings = pipeline_without_sequencer.settings
    f = EventFactory(f"range-{uuid.uuid4().hex[:8]}")
    offsets = produce(settings, [f.started(), f.completed(1, 0, "a"), f.completed(2, 1, "b")])
    reader = LogRangeReader(settings, settings.topics.events, settings.sequencer_group)
    partition = partition_for(f.session_id, settings.partitions)
    try:
        found = reader.read(partition, offsets[1], offsets[2], f.session_id.encode())
        assert [offset for offset, _, _, _ in found] == offsets[1:]
        assert reader.read(partition, offsets[1], offsets[2], b"other-key") == []
        assert [offset for offset, _, _, _ in reader.read(partition, offsets[0], offsets[2])] == list(range(offsets[0], offsets[2] + 1))
        assert reader.committed(partition) == 0
    finally:
        reader.close()
