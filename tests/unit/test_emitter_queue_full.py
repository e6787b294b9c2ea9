"""The emission producer's send while librdkafka's queue is full (a stub producer: no broker)."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from turnlog import kafka
from turnlog.stream_processors import emitter
from turnlog.stream_processors.emitter import EmissionFailed, EmissionProducer


class QueueFullFor:
    """A producer whose queue is full for the first ``full`` sends; then it takes records."""

    def __init__(self, full: int, error: KafkaException | None = None) -> None:
        self.full, self.error = full, error
        self.tries: list[float] = []
        self.taken: list[bytes] = []

    def produce(self, topic, value=None, key=None, **kwargs):
        self.tries.append(time.monotonic())
        if len(self.tries) <= self.full:
            raise BufferError("Local: Queue full")
        if self.error is not None:
            raise self.error
        self.taken.append(value)

    def poll(self, timeout):
        time.sleep(timeout)
        return 0

    def __len__(self):
        return 0


def send_one(stub: QueueFullFor) -> None:
    async def main():
        emissions = EmissionProducer(lambda: stub)
        emissions.start()
        try:
            emissions.produce("t.transcript", b"k", b"v", 0, None, lambda *_: None)
        finally:
            await emissions.close(timeout=1)

    asyncio.run(main())


def test_a_full_queue_is_tried_again_until_it_takes_the_record():
    stub = QueueFullFor(full=3)
    send_one(stub)
    assert stub.taken == [b"v"] and len(stub.tries) == 4
    # the first try, then tenacity's (at once, then every QUEUE_FULL_RETRY_SECONDS)
    assert stub.tries[-1] - stub.tries[0] >= 2 * emitter.QUEUE_FULL_RETRY_SECONDS * 0.9


def test_a_queue_full_past_the_wait_fails_the_send_as_queue_full(monkeypatch):
    monkeypatch.setattr(emitter, "QUEUE_FULL_WAIT_SECONDS", 0.05)
    stub = QueueFullFor(full=10**9)
    with pytest.raises(EmissionFailed) as raised:
        send_one(stub)
    assert isinstance(raised.value.cause, kafka.BrokerError) and raised.value.cause.code == KafkaError._QUEUE_FULL
    assert stub.taken == [] and len(stub.tries) > 2


def test_a_refused_record_is_not_tried_again():
    stub = QueueFullFor(full=1, error=KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)))
    with pytest.raises(EmissionFailed):
        send_one(stub)
    assert len(stub.tries) == 2  # the full queue once, then the refusal: given up at once
