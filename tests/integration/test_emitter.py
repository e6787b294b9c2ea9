"""The sequencer's emission producer (``stream_processors/emitter.py``) against the real broker."""

from __future__ import annotations

import asyncio
import base64
import os
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient, NewTopic

import turnlog.kafka as kafka
from turnlog.deploy.topics import create_topics
from turnlog.settings import TurnlogSettings
from turnlog.stream_processors.emitter import MESSAGE_MAX_BYTES, EmissionFailed, EmissionProducer

from tests.integration.conftest import drop_topics
from tests.support import create_topic

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(kafka_bootstrap: str) -> Iterator[TurnlogSettings]:
    run = f"test-{uuid.uuid4().hex[:10]}"
    settings = TurnlogSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=run, partitions=3,
                               sequencer_group=f"{run}-sequencer", finalizer_group=f"{run}-finalizer")
    create_topics(settings)
    yield settings
    drop_topics(settings)


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


async def test_a_record_too_large_for_the_client_is_reported_by_its_token_and_the_rest_is_delivered(
    settings: TurnlogSettings,
):
    emissions = EmissionProducer(lambda: kafka.producer(settings, client_id="test-emitter", delivery_timeout_seconds=10))
    topic = settings.topics.transcript
    try:
        batch = emissions.batch()
        batch.send(topic, key=b"k", value=b"before", partition=0, token="before")
        batch.send(topic, key=b"k", value=b"x" * (MESSAGE_MAX_BYTES + 1), partition=0, token="big")
        batch.send(topic, key=b"k", value=b"after", partition=0, token="after")
        [(token, error)] = await asyncio.wait_for(batch.delivered(), 30)
        assert token == "big" and isinstance(error, kafka.RecordRefusedError)
        assert error.code == KafkaError.MSG_SIZE_TOO_LARGE
        with kafka.OffsetReader(settings) as offsets:
            assert offsets.end_offsets(topic, [0])[0] == 2
    finally:
        await emissions.close()


async def test_a_record_the_topic_refuses_is_reported_and_the_producer_goes_on(settings: TurnlogSettings):
    topic = f"{settings.topic_prefix}.small-records"
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    create_topic(admin, NewTopic(topic, 1, 1, config={"max.message.bytes": "100000"}))
    emissions = EmissionProducer(lambda: kafka.producer(settings, client_id="test-emitter", delivery_timeout_seconds=10))
    try:
        batch = emissions.batch()
        incompressible = base64.b64encode(os.urandom(150_000))  # fits the client, not the topic
        batch.send(topic, key=b"k", value=incompressible, partition=0, token="big")
        refused = await asyncio.wait_for(batch.delivered(), 30)  # the broker's refusal does not fail the batch
        assert [token for token, _ in refused] == ["big"]
        assert refused[0][1].code == KafkaError.MSG_SIZE_TOO_LARGE
        again = emissions.batch()
        again.send(topic, key=b"k", value=b"small", partition=0, token="small")
        assert await asyncio.wait_for(again.delivered(), 30) == []  # the idempotent producer still delivers
        without_token = emissions.batch()
        without_token.send(topic, key=b"k", value=incompressible, partition=0)
        with pytest.raises(EmissionFailed):  # a caller that gave no token gets the batch failed, as before
            await asyncio.wait_for(without_token.delivered(), 30)
    finally:
        await emissions.close()
