"""The Kafka layer's offsets helper against the real broker."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import TopicPartition

import turnlog.kafka as kafka
from turnlog.deploy.topics import create_topics
from turnlog.settings import TurnlogSettings

from tests.support import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(kafka_bootstrap: str) -> TurnlogSettings:
    run = uuid.uuid4().hex[:10]
    settings = TurnlogSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=f"test-{run}", partitions=3,
                               sequencer_group=f"test-{run}-sequencer", finalizer_group=f"test-{run}-finalizer")
    create_topics(settings)
    return settings


def test_watermarks_end_offsets_and_committed_offsets(settings: TurnlogSettings):
    topic = settings.topics.events
    producer = kafka.producer(settings, client_id="test-offsets")
    for n in range(5):
        kafka.produce(producer, topic, b"%d" % n, partition=1)
    kafka.produce(producer, topic, b"x", partition=2)
    assert producer.flush(10) == 0

    with kafka.OffsetReader(settings) as offsets:
        assert offsets.partitions(topic) == [0, 1, 2]
        assert offsets.end_offsets(topic) == {0: 0, 1: 5, 2: 1}
        assert offsets.watermarks(topic, [1]) == {1: kafka.Watermarks(low=0, high=5)}

        group = f"{settings.topic_prefix}-group"
        assert offsets.committed(group, topic, [0, 1]) == {0: None, 1: None}
        committer = kafka.consumer(settings, group_id=group)
        committer.commit(offsets=[TopicPartition(topic, 1, 3)], asynchronous=False)
        committer.close()
        assert offsets.committed(group, topic, [0, 1, 2]) == {0: None, 1: 3, 2: None}

        later = int(time.time() * 1000) + 60_000
        assert offsets.offsets_for_time(topic, [1], later) == {1: None}
        assert offsets.offsets_for_time(topic, [1], 0) == {1: 0}


def test_record_ends_stop_at_the_last_committed_record_not_at_transaction_markers(settings: TurnlogSettings):
    topic = settings.topics.transcript
    producer = kafka.producer(settings, client_id="test-record-ends", delivery_timeout_seconds=30,
                              **{"transactional.id": f"{topic}-writer"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for n in range(3):
        kafka.produce(producer, topic, b"%d" % n, partition=1)  # offsets 0..2, then a commit marker at 3
    producer.commit_transaction(30)
    producer.begin_transaction()
    kafka.produce(producer, topic, b"aborted", partition=1)  # offset 4, then an abort marker at 5
    assert producer.flush(30) == 0  # written before the abort, not purged from the queue
    producer.abort_transaction(30)
    producer.begin_transaction()
    kafka.produce(producer, topic, b"only", partition=2)  # offset 0, its marker at 1
    producer.commit_transaction(30)

    with kafka.OffsetReader(settings) as offsets:
        # The end a read_committed reader is given is the last stable offset: past the markers once
        # the transaction coordinator wrote them.
        wait_until(lambda: offsets.end_offsets(topic) == {0: 0, 1: 6, 2: 2}, timeout=30, what="the markers written")
        assert offsets.record_ends(topic) == {0: 0, 1: 3, 2: 1}


def test_an_unknown_topic_is_a_turnlog_error(settings: TurnlogSettings):
    with kafka.OffsetReader(settings) as offsets, pytest.raises(kafka.UnknownTopicError):
        offsets.end_offsets(f"{settings.topic_prefix}.no-such-topic")


def test_an_unreachable_broker_gives_up_within_the_budget():
    unreachable = TurnlogSettings(bootstrap_servers="127.0.0.1:1")
    began = time.monotonic()
    with kafka.OffsetReader(unreachable, log_level=0) as offsets, pytest.raises(kafka.BrokerUnavailableError):
        offsets.end_offsets("anything", [0], deadline=time.monotonic() + 3.0)
    assert time.monotonic() - began < 6.0


def test_creating_topics_twice_is_quiet(settings: TurnlogSettings):
    again = create_topics(settings)
    assert again.created == () and again.differences == ()
