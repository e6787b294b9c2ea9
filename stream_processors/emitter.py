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

A record the client or the broker refuses for what it is (too large for
``message.max.bytes`` or the topic's ``max.message.bytes``, an invalid record)
is not a broker outage: a record sent with a ``token`` is then reported back by
:meth:`EmissionBatch.delivered` (the caller decides what to do with it), and
only the other errors fail the batch. The broker refuses a whole record batch
for one record in it, so a refused record may be innocent: send it again alone
to know.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

from confluent_kafka import KafkaError, Message, Producer
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from turnlog import kafka
from turnlog.stream_processors.exceptions import ServiceError

__all__ = [
    "Batch", "EmissionFailed", "EmissionBatch", "EmissionProducer", "Emissions", "Refusal", "record_bytes",
    "MESSAGE_MAX_BYTES", "MAX_RECORD_BYTES",
]

logger = logging.getLogger(__name__)
POLL_SECONDS = 0.05
FLUSH_POLL_SECONDS = 0.005
#: How long a full librdkafka queue is waited on before a send gives up (seconds).
QUEUE_FULL_WAIT_SECONDS = 30.0
#: How often a send that found the queue full is tried again meanwhile (seconds).
QUEUE_FULL_RETRY_SECONDS = 0.005
#: librdkafka's ``message.max.bytes`` for the emission producer: the largest record it sends
#: (key, value and headers, before compression). librdkafka's default, set explicitly; the
#: topics' ``max.message.bytes`` (``deploy/topics.py``) leave room above it for compression's
#: framing (a test holds the two together).
MESSAGE_MAX_BYTES = 1_000_000
#: The largest record a caller should send, as :func:`record_bytes` counts it: ``MESSAGE_MAX_BYTES``
#: less room for librdkafka's framing of a record and its headers (tens of bytes).
MAX_RECORD_BYTES = MESSAGE_MAX_BYTES - 4096
#: Error codes that refuse one record for what it is, not for the broker's state: too large
#: for the client or the topic, a record list too large, an invalid record.
REFUSED_RECORD_CODES = frozenset(
    {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD}
)


def record_bytes(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]] | None = None) -> int:
    """A record's size as the producer's ``message.max.bytes`` counts it, near enough:
    key, value, and each header's name and value (librdkafka adds a few bytes of framing)."""
    size = len(key or b"") + len(value or b"")
    for name, header in headers or ():
        size += len(name.encode("utf-8")) + len(header or b"")
    return size


class EmissionFailed(ServiceError):
    """An emission was not delivered: the broker refused it for good, its delivery
    timeout passed, the producer hit a fatal error, or librdkafka refused it at send.

    Attributes:
        cause: the broker error, typed (``turnlog.kafka.BrokerError``; its ``code`` is librdkafka's).
    """

    def __init__(self, cause: kafka.BrokerError) -> None:
        super().__init__(f"emission not delivered: {cause}")
        self.cause = cause


Refusal = tuple[Any, kafka.BrokerError]
"""A record refused for what it is: ``(token, error)`` (the token given to :meth:`EmissionBatch.send`)."""


class Batch(Protocol):
    """Records sent together and awaited together: :class:`EmissionBatch`, or the
    sequencer's ``transactions.TransactionBatch``."""

    def send(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        headers: Any = None,
        token: Any = None,
    ) -> None: ...

    async def delivered(self) -> list[Refusal]: ...


class Emissions(Protocol):
    """Where the sequencer's records go: :class:`EmissionProducer`, or
    ``transactions.PartitionTransactions``."""

    #: True when a batch's records of one partition are visible together or not at all
    #: (the session states can then go in the same batch as the emissions).
    atomic: bool

    def batch(self) -> Batch: ...

    async def flush(self, timeout: float = 30.0) -> int: ...

    async def close(self, timeout: float = 30.0) -> None: ...


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
        self._refused: list[Refusal] = []
        self._done: asyncio.Future[list[Refusal]] = asyncio.get_running_loop().create_future()

    def send(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        headers: Sequence[tuple[str, bytes]] | None = None,
        token: Any = None,
    ) -> None:
        """Queue one record for ``topic[partition]`` (no wait for the broker).

        ``token`` (any value but None): if the client or the broker refuses this record for
        what it is (``REFUSED_RECORD_CODES``), :meth:`delivered` reports ``(token, error)``
        instead of failing the batch. Without a token such a refusal fails the batch.

        Raises:
            RuntimeError: after :meth:`delivered` was called.
            EmissionFailed: librdkafka refused the record (with a token: for another reason
                than what it is), or its queue stayed full for ``QUEUE_FULL_WAIT_SECONDS``.
        """
        with self._lock:
            if self._sealed:
                raise RuntimeError("send() after delivered()")
            self._pending += 1
        on_delivery = self._on_delivery if token is None else partial(self._on_token_delivery, token)
        try:
            self._producer.produce(topic, key, value, partition, headers, on_delivery)
        except EmissionFailed as e:
            with self._lock:
                self._pending -= 1
                if token is None or e.cause.code not in REFUSED_RECORD_CODES:
                    raise
                self._refused.append((token, e.cause))
        except BaseException:
            with self._lock:
                self._pending -= 1
            raise

    async def delivered(self) -> list[Refusal]:
        """Wait until the broker acknowledged every record sent in this batch; returns the
        records sent with a token that were refused for what they are (``(token, error)``,
        in no particular order; usually none).

        Raises:
            EmissionFailed: a record was not delivered (the others may have been).
        """
        with self._lock:
            self._sealed = True
            if self._pending == 0:
                self._resolve_done()
        return await self._done

    def _on_delivery(self, error: KafkaError | None, _message: Message) -> None:
        """Called on the poll thread."""
        with self._lock:
            self._pending -= 1
            if error is not None and self._error is None:
                self._error = error
            if self._sealed and self._pending == 0:
                self._producer.call_soon(self._resolve_done)

    def _on_token_delivery(self, token: Any, error: KafkaError | None, message: Message) -> None:
        """Called on the poll thread, for a record sent with a token."""
        if error is None or error.code() not in REFUSED_RECORD_CODES:
            self._on_delivery(error, message)
            return
        with self._lock:
            self._pending -= 1
            self._refused.append((token, kafka.to_broker_error(error, "delivering an emission")))
            if self._sealed and self._pending == 0:
                self._producer.call_soon(self._resolve_done)

    def _resolve_done(self) -> None:
        if self._done.done():
            return
        if self._error is not None:
            self._done.set_exception(EmissionFailed(kafka.to_broker_error(self._error, "delivering an emission")))
        else:  # every record is settled: no callback changes the list any more
            self._done.set_result(list(self._refused))


class EmissionProducer:
    """Owns one confluent-kafka ``Producer`` and the thread that serves its delivery reports.

    ``make_producer`` builds the producer (idempotent, ``acks=all``): called at
    :meth:`start`, so nothing connects before the service runs.
    """

    #: Each record is acknowledged on its own: a batch's records may land in part.
    atomic = False

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
        self, topic: str, key: bytes | None, value: bytes | None, partition: int, headers: Any, on_delivery: Any
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
        self, topic: str, key: bytes | None, value: bytes | None, partition: int, headers: Any, on_delivery: Any
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
