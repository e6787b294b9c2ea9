"""The sequencer's emissions, through a confluent-kafka idempotent producer.

Faust's own producer (aiokafka) costs several event-loop turns and tasks per
record sent; librdkafka batches, retries and acknowledges on its own threads.
The sequencer sends each batch's emissions and rejects here, then awaits
:meth:`EmissionBatch.delivered` (every record acknowledged, ``acks=all``)
before it writes the new session states and before Faust acks the batch's
source records, so the committed offset and the table never run ahead of the
transcript.

Delivery reports arrive on this module's poll thread; a batch's future is
resolved on the event loop (``call_soon_threadsafe``) once, when its last
record is acknowledged, not once per record.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from turnlog import kafka
from turnlog.stream_processors.exceptions import ServiceError

__all__ = ["EmissionFailed", "EmissionBatch", "EmissionProducer"]

logger = logging.getLogger(__name__)
POLL_SECONDS = 0.05
FLUSH_POLL_SECONDS = 0.005
#: How long a full librdkafka queue is waited on before a send gives up (seconds).
QUEUE_FULL_WAIT_SECONDS = 30.0
#: How often a send that found the queue full is tried again meanwhile (seconds).
QUEUE_FULL_RETRY_SECONDS = 0.005


class EmissionFailed(ServiceError):
    """An emission was not delivered: the broker refused it for good, its delivery
    timeout passed, the producer hit a fatal error, or librdkafka refused it at send.

    Attributes:
        cause: the broker error, typed (``turnlog.kafka.BrokerError``; its ``code`` is librdkafka's).
    """

    def __init__(self, cause: kafka.BrokerError) -> None:
        super().__init__(f"emission not delivered: {cause}")
        self.cause = cause


def _queue_stayed_full(_: RetryCallState) -> None:
    raise EmissionFailed(kafka.to_broker_error(KafkaError(KafkaError._QUEUE_FULL), "sending"))


class EmissionBatch:
    """Records sent together and awaited together. Create with :meth:`EmissionProducer.batch`."""

    def __init__(self, producer: EmissionProducer) -> None:
        self._producer = producer
        self._lock = threading.Lock()
        self._pending = 0
        self._sealed = False
        self._error: KafkaError | None = None
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def send(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes,
        partition: int,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> None:
        """Queue one record for ``topic[partition]`` (no wait for the broker).

        Raises:
            RuntimeError: after :meth:`delivered` was called.
            EmissionFailed: librdkafka refused the record, or its queue stayed full for
                ``QUEUE_FULL_WAIT_SECONDS``.
        """
        with self._lock:
            if self._sealed:
                raise RuntimeError("send() after delivered()")
            self._pending += 1
        try:
            self._producer.produce(topic, key, value, partition, headers, self._on_delivery)
        except BaseException:
            with self._lock:
                self._pending -= 1
            raise

    async def delivered(self) -> None:
        """Wait until the broker acknowledged every record sent in this batch.

        Raises:
            EmissionFailed: a record was not delivered (the others may have been).
        """
        with self._lock:
            self._sealed = True
            if self._pending == 0:
                self._settle()
        await self._done

    def _on_delivery(self, error: KafkaError | None, _message: Message) -> None:
        """Called on the poll thread."""
        with self._lock:
            self._pending -= 1
            if error is not None and self._error is None:
                self._error = error
            if self._sealed and self._pending == 0:
                self._producer.call_soon(self._settle)

    def _settle(self) -> None:
        if self._done.done():
            return
        if self._error is not None:
            self._done.set_exception(EmissionFailed(kafka.to_broker_error(self._error, "delivering an emission")))
        else:
            self._done.set_result(None)


class EmissionProducer:
    """Owns one confluent-kafka ``Producer`` and the thread that serves its delivery reports.

    ``make_producer`` builds the producer (idempotent, ``acks=all``): called at
    :meth:`start`, so nothing connects before the service runs.
    """

    def __init__(self, make_producer: Callable[[], Producer]) -> None:
        self._make_producer = make_producer
        self._producer: Producer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self) -> None:
        """Create the producer and start the poll thread (idempotent). Call it on the event loop.

        Raises:
            ServiceError: after :meth:`close`.
        """
        if self._closed:
            raise ServiceError("the emission producer is closed")
        if self._producer is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._producer = self._make_producer()
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="turnlog-emissions", daemon=True)
        self._thread.start()

    def batch(self) -> EmissionBatch:
        """A new batch of records to send and await together."""
        self.start()
        return EmissionBatch(self)

    def produce(
        self, topic: str, key: bytes | None, value: bytes, partition: int, headers: Any, on_delivery: Any
    ) -> None:
        """Hand one record to librdkafka; while its queue is full, try again every
        ``QUEUE_FULL_RETRY_SECONDS`` (the poll thread drains it) for up to
        ``QUEUE_FULL_WAIT_SECONDS``. The first try is made outside tenacity: it nearly
        always succeeds, and a ``Retrying`` call would cost ~15 µs on every record.

        Raises:
            EmissionFailed: librdkafka refused the record, or its queue stayed full.
        """
        try:
            self._send(topic, key, value, partition, headers, on_delivery)
        except BufferError:
            retrying = Retrying(
                retry=retry_if_exception_type(BufferError),
                wait=wait_fixed(QUEUE_FULL_RETRY_SECONDS),
                stop=stop_after_delay(QUEUE_FULL_WAIT_SECONDS),
                retry_error_callback=_queue_stayed_full,
            )
            retrying(self._send, topic, key, value, partition, headers, on_delivery)

    def _send(
        self, topic: str, key: bytes | None, value: bytes, partition: int, headers: Any, on_delivery: Any
    ) -> None:
        assert self._producer is not None
        try:
            kafka.produce(self._producer, topic, value, key=key, partition=partition, headers=headers,
                          on_delivery=on_delivery)
        except kafka.RecordRefusedError as e:
            raise EmissionFailed(e) from e

    def call_soon(self, callback: Callable[[], None]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(callback)

    def _serve(self) -> None:
        producer = self._producer
        assert producer is not None
        while not self._stop.is_set():
            producer.poll(POLL_SECONDS)

    async def flush(self, timeout: float = 30.0) -> int:
        """Wait up to ``timeout`` seconds until everything sent is acknowledged or failed;
        returns how many records are left.

        Only the poll thread ever polls the producer: a second thread in
        ``flush()`` beside it crashed the process (SIGSEGV) at a rebalance.
        """
        producer = self._producer
        if producer is None:
            return 0
        deadline = time.monotonic() + timeout
        while len(producer) > 0 and time.monotonic() < deadline:
            await asyncio.sleep(FLUSH_POLL_SECONDS)
        return len(producer)

    async def close(self, timeout: float = 30.0) -> None:
        """Flush, then stop the poll thread. Records still unacknowledged after ``timeout`` seconds are
        logged; their source records were never acked, so they are processed again after a restart."""
        self._closed = True
        if self._producer is None:
            return
        left = await self.flush(timeout)
        if left:
            logger.warning("%d emissions unacknowledged at shutdown: they are re-sent after the restart", left)
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
        self._producer = None
