"""The sequencer's emission producer (``stream_processors/emitter.py``) against the real broker."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import turnlog.kafka as kafka
from turnlog.deploy.topics import create_topics
from turnlog.settings import TurnlogSettings
from turnlog.stream_processors.emitter import EmissionFailed, EmissionProducer

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(kafka_bootstrap: str) -> TurnlogSettings:
    settings = TurnlogSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=f"test-{uuid.uuid4().hex[:10]}", partitions=3)
    create_topics(settings)
    return settings


async def test_a_batch_is_acknowledged_only_when_every_record_is_in_the_topic(settings: TurnlogSettings):
    emissions = EmissionProducer(lambda: kafka.producer(settings, client_id="test-emitter"))
    topic = settings.topics.transcript
    try:
        for round_ in range(3):
            batch = emissions.batch()
            for n in range(2000):
                batch.send(topic, key=b"k%d" % n, value=b"%d-%d" % (round_, n), partition=n % 3)
            await asyncio.wait_for(batch.delivered(), 60)
        empty = emissions.batch()
        await asyncio.wait_for(empty.delivered(), 5)  # nothing sent: done at once
        with kafka.OffsetReader(settings) as offsets:
            assert sum(offsets.end_offsets(topic).values()) == 3 * 2000
    finally:
        await emissions.close()


async def test_a_record_the_broker_cannot_take_fails_its_batch_with_a_typed_error(settings: TurnlogSettings):
    emissions = EmissionProducer(lambda: kafka.producer(settings, client_id="test-emitter", delivery_timeout_seconds=5))
    try:
        batch = emissions.batch()
        batch.send(settings.topics.transcript, key=b"k", value=b"fine", partition=0)
        with pytest.raises(EmissionFailed) as failed:
            batch.send(settings.topics.transcript, key=b"k", value=b"x", partition=7)  # no such partition
            await asyncio.wait_for(batch.delivered(), 30)
        assert isinstance(failed.value.cause, kafka.BrokerError)
    finally:
        await emissions.close()
