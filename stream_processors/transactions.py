"""The sequencer's writes in Kafka transactions: one transactional producer per events partition.

A worker frozen past its session timeout (SIGSTOP, a GC pause, a frozen VM) loses its
partitions to another worker without knowing it. An idempotent producer does not stop it
when it wakes: it finishes the batch it was in and writes session states older than the
new owner's to the changelog, and the next worker to restore that changelog partition
restores them and waits for good on a seq that was emitted long ago (``chaos --cluster``,
seeds 202 and 303: 445 acknowledged turns never stored).

Kafka's transactions fence it (KIP-98's zombie fencing). Events partition ``p`` has its own
``transactional.id``, ``<group>.<events topic>.<p>``; the worker assigned ``p`` calls
``init_transactions`` with it (:meth:`PartitionTransactions.fence`) before it restores
``p``'s states. That aborts the previous owner's open transaction and bumps the producer
epoch: every later write of the previous owner fails with ``PRODUCER_FENCED``
(:class:`EmissionsFenced`) and its worker stops. Everything a batch writes for ``p`` goes to
partition ``p`` of its topic (the transcript, the DLQ and the changelog are co-partitioned
with the events), in one transaction: a ``read_committed`` reader (the sink, the finalizer,
a changelog restore) sees all of it or none of it.

The producers have no poll thread: ``commit_transaction`` flushes, and serves the delivery
reports on the thread that calls it, which is the only one that polls the producer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from turnlog import kafka
from turnlog.faults import fault_point
from turnlog.stream_processors.emitter import (
    QUEUE_FULL_RETRY_SECONDS,
    QUEUE_FULL_WAIT_SECONDS,
    REFUSED_RECORD_CODES,
    EmissionFailed,
    Refusal,
)
from turnlog.stream_processors.exceptions import ServiceError

__all__ = ["EmissionsFenced", "PartitionTransactions", "TransactionBatch", "transactional_id"]

logger = logging.getLogger(__name__)


def transactional_id(group: str, events_topic: str, partition: int) -> str:
    """The ``transactional.id`` of the sequencer's writes for ``events_topic[partition]``."""
    return f"{group}.{events_topic}.{partition}"


class EmissionsFenced(EmissionFailed):
    """Another worker took the partition: its ``init_transactions`` fenced this worker's producer.
    Nothing this worker wrote in the open transaction is visible to ``read_committed`` readers."""


@dataclass(slots=True)
class _Record:
    topic: str
    key: bytes | None
    value: bytes | None
    partition: int
    headers: Any
    token: Any


class PartitionTransactions:
    """The transactional producers of the events partitions this worker owns.

    ``make_producer(partition)`` builds the producer of ``partition`` (with its
    ``transactional.id``, idempotent, ``acks=all``; its ``transaction.timeout.ms`` above
    ``timeout``). ``timeout`` (seconds): how long a transaction's commit, or a fence, waits
    through a broker outage before :class:`EmissionFailed`.
    """

    #: A batch's records of one partition are visible together or not at all.
    atomic = True

    def __init__(self, make_producer: Callable[[int], Producer], *, timeout: float) -> None:
        self._make_producer = make_producer
        self._timeout = timeout
        self._producers: dict[int, asyncio.Future[Producer]] = {}
        self._closed = False

    async def fence(self, partitions: Iterable[int]) -> None:
        """Make the producers of ``partitions`` this worker does not hold yet, each fencing the
        partition's previous writer (``init_transactions``), concurrently. Call it when the
        partitions are assigned, before their states are restored.

        Raises:
            EmissionFailed: a producer was not made or not initialized within the timeout.
        """
        await asyncio.gather(*(self.producer(p) for p in set(partitions)))

    async def producer(self, partition: int) -> Producer:
        """The producer of ``partition``, made and fenced on first use.

        Raises:
            ServiceError: after :meth:`close`.
            EmissionFailed: it was not made or not initialized within the timeout.
        """
        if self._closed:
            raise ServiceError("the sequencer's transactional producers are closed")
        ready = self._producers.get(partition)
        if ready is None:
            ready = self._producers[partition] = asyncio.ensure_future(asyncio.to_thread(self._initialized, partition))
        try:
            return await asyncio.shield(ready)
        except BaseException:
            if ready.done() and self._producers.get(partition) is ready:
                del self._producers[partition]  # made again on the next use
            raise

    def _initialized(self, partition: int) -> Producer:
        """A new producer of ``partition`` after ``init_transactions``, tried again while the
        transaction coordinator is unavailable (a failover), up to the timeout."""
        try:
            producer = self._make_producer(partition)
        except kafka.BrokerError as e:
            raise EmissionFailed(e) from e
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                producer.init_transactions(max(1.0, deadline - time.monotonic()))
                logger.info("transactions of partition %d fenced their previous writer", partition)
                return producer
            except KafkaException as e:
                error = e.args[0]
                cause = kafka.to_broker_error(e, f"initializing the transactions of partition {partition}")
                if not error.retriable() or time.monotonic() >= deadline:
                    raise EmissionFailed(cause) from e
                logger.warning("%s; trying again", cause)

    async def release(self, partitions: Iterable[int]) -> None:
        """Drop the producers of revoked ``partitions`` (their next owner fences them anyway).
        Call it with no batch in flight."""
        for partition in set(partitions):
            ready = self._producers.pop(partition, None)
            if ready is not None and not ready.done():
                with contextlib.suppress(Exception):  # failed to start: nothing to drop
                    await ready

    def batch(self) -> TransactionBatch:
        """A new batch: its records of each partition are committed in one transaction."""
        return TransactionBatch(self)

    async def flush(self, timeout: float = 30.0) -> int:
        """Nothing waits here: every batch is committed before :meth:`TransactionBatch.delivered` returns."""
        return 0

    async def close(self, timeout: float = 30.0) -> None:
        """Drop every producer; open transactions are aborted by the broker or by the next owner."""
        self._closed = True
        await self.release(list(self._producers))

    def transact(self, partition: int, producer: Producer, records: list[_Record]) -> list[Refusal]:
        """Write ``records`` (all of ``partition``) in one transaction; blocking: run it in a
        worker thread. Returns the records refused for what they are; when the broker refused
        one of them the transaction is aborted and every record of it is returned (``(token,
        error)``) for the caller to send again, each alone.

        Raises:
            EmissionsFenced: another worker fenced this producer.
            EmissionFailed: the transaction was not committed within the timeout, or a record
                without a token was refused.
        """
        deadline = time.monotonic() + self._timeout
        for attempt in range(1, ABORTED_ATTEMPTS + 1):
            refused, failure = self._attempt(partition, producer, records, deadline)
            if failure is None:
                return refused
            # Aborted. A record refused for what it is fails the others of its transaction (purged,
            # or out of sequence after it): all are sent again, each alone, which tells them apart.
            if refused and all(r.token is not None for r in records):
                reason = refused[0][1]
                undelivered = {token for token, _ in refused}
                return refused + [(r.token, reason) for r in records if r.token not in undelivered]
            # Not a record's fault (the first transaction after an abort fails once while librdkafka
            # bumps the producer epoch, OUT_OF_ORDER_SEQUENCE_NUMBER): the transaction is written again.
            if attempt == ABORTED_ATTEMPTS or time.monotonic() >= deadline:
                raise EmissionFailed(failure)
            logger.warning("%s; writing the transaction again", failure)
        raise AssertionError("unreachable")

    def _attempt(
        self, partition: int, producer: Producer, records: list[_Record], deadline: float
    ) -> tuple[list[Refusal], kafka.BrokerError | None]:
        """One transaction of ``records``: ``(refused records, None)`` when it was committed,
        ``(refused records, the error)`` when it had to be aborted (it was).

        Raises:
            EmissionsFenced: another worker fenced this producer.
            EmissionFailed: a fatal producer error, the commit's timeout, or a record without a
                token refused by the client.
        """
        refused: list[Refusal] = []
        failed: list[KafkaError] = []

        def on_delivery(token: Any, error: KafkaError | None, _message: Message) -> None:
            if error is None or error.code() in PURGED_CODES:  # purged: the transaction is being aborted
                return
            if token is not None and error.code() in REFUSED_RECORD_CODES:
                refused.append((token, kafka.to_broker_error(error, "delivering an emission")))
            else:
                failed.append(error)

        _call(producer.begin_transaction, partition, "beginning a transaction")
        for record in records:
            try:
                _produce(producer, record, partial(on_delivery, record.token))
            except EmissionFailed as e:
                if record.token is None or e.cause.code not in REFUSED_RECORD_CODES:
                    self._abort(producer, partition, deadline)
                    raise
                refused.append((record.token, e.cause))  # refused by the client: the transaction is unharmed
        fault_point("sequencer.before_commit")
        while True:
            try:
                producer.commit_transaction(max(1.0, deadline - time.monotonic()))
                return refused, None
            except KafkaException as e:
                error: KafkaError = e.args[0]
                cause = kafka.to_broker_error(e, f"committing the transaction of partition {partition}")
                if error.fatal():
                    raise _fenced_or_failed(cause, partition) from e
                if error.txn_requires_abort():
                    self._abort(producer, partition, deadline)
                    producer.flush(max(1.0, deadline - time.monotonic()))  # serves the delivery reports not yet served
                    return refused, (kafka.to_broker_error(failed[0], "delivering an emission") if failed else cause)
                if not error.retriable() or time.monotonic() >= deadline:
                    raise EmissionFailed(cause) from e
                logger.warning("%s; trying again", cause)

    def _abort(self, producer: Producer, partition: int, deadline: float) -> None:
        """Abort the open transaction of ``partition``.

        Raises:
            EmissionsFenced, EmissionFailed: it was not aborted.
        """
        try:
            producer.abort_transaction(max(1.0, deadline - time.monotonic()))
        except KafkaException as e:
            cause = kafka.to_broker_error(e, f"aborting the transaction of partition {partition}")
            raise _fenced_or_failed(cause, partition) from e


class TransactionBatch:
    """Records sent together and committed together, one transaction per partition. Create
    with :meth:`PartitionTransactions.batch`. The interface of ``emitter.EmissionBatch``."""

    def __init__(self, owner: PartitionTransactions) -> None:
        self._owner = owner
        self._records: dict[int, list[_Record]] = {}
        self._sealed = False

    def send(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        headers: Any = None,
        token: Any = None,
    ) -> None:
        """Queue one record for ``topic[partition]``; nothing is sent before :meth:`delivered`.

        Raises:
            RuntimeError: after :meth:`delivered` was called.
        """
        if self._sealed:
            raise RuntimeError("send() after delivered()")
        self._records.setdefault(partition, []).append(_Record(topic, key, value, partition, headers, token))

    async def delivered(self) -> list[Refusal]:
        """Commit each partition's records in one transaction (the partitions concurrently);
        returns the records refused for what they are, and with them every other record of a
        transaction the broker refused one of (``(token, error)``; usually none).

        Raises:
            EmissionsFenced: another worker took one of the partitions.
            EmissionFailed: a transaction was not committed (the others may have been).
        """
        self._sealed = True
        owner = self._owner
        producers = {partition: await owner.producer(partition) for partition in self._records}
        results = await asyncio.gather(*(
            asyncio.to_thread(owner.transact, partition, producers[partition], records)
            for partition, records in self._records.items()
        ))
        return [refusal for refused in results for refusal in refused]


def _produce(producer: Producer, record: _Record, on_delivery: Any) -> None:
    """Hand ``record`` to librdkafka; while its queue is full, serve delivery reports and try
    again, for up to ``QUEUE_FULL_WAIT_SECONDS``.

    Raises:
        EmissionFailed: librdkafka refused the record, or its queue stayed full.
    """
    deadline = time.monotonic() + QUEUE_FULL_WAIT_SECONDS
    while True:
        try:
            kafka.produce(producer, record.topic, record.value, key=record.key, partition=record.partition,
                          headers=record.headers, on_delivery=on_delivery)
            return
        except kafka.RecordRefusedError as e:
            raise EmissionFailed(e) from e
        except BufferError:
            if time.monotonic() >= deadline:
                raise EmissionFailed(kafka.to_broker_error(KafkaError(KafkaError._QUEUE_FULL), "sending")) from None
            producer.poll(QUEUE_FULL_RETRY_SECONDS)


def _call(method: Callable[[], None], partition: int, what: str) -> None:
    """``method()`` (a producer's transaction call), its errors as :class:`EmissionFailed`."""
    try:
        method()
    except KafkaException as e:
        raise _fenced_or_failed(kafka.to_broker_error(e, f"{what} of partition {partition}"), partition) from e


def _fenced_or_failed(cause: kafka.BrokerError, partition: int) -> EmissionFailed:
    if cause.code in FENCED_CODES:
        logger.error("fenced: another worker took partition %d (%s)", partition, cause)
        return EmissionsFenced(cause)
    return EmissionFailed(cause)


#: How many times a transaction aborted for no record's fault is written before the batch fails.
ABORTED_ATTEMPTS = 3
#: A record dropped from librdkafka's queues because its transaction must be aborted (another
#: record of it was refused): it is sent again with the others.
PURGED_CODES = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
#: The errors of a producer another worker fenced with the same ``transactional.id``.
FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
