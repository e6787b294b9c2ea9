"""Faust's fetch of paused partitions, fixed: no record is drained and then dropped.

The bug, in faust-streaming 0.15.3 (``faust/transport/consumer.py``) with
aiokafka 0.14 (``aiokafka/consumer/fetcher.py``):

1. Faust pauses a partition only in its own bookkeeping (``_paused_partitions``,
   ``_active_partitions``); aiokafka keeps fetching it. ``_wait_next_records``
   hands its *live* ``_active_partitions`` set to the consumer thread, which
   drains aiokafka's prefetched records of "these partitions".
2. aiokafka's ``Fetcher.fetched_records(partitions)`` reads "no partitions"
   as "every partition" (``if partitions and tp not in partitions``). The set
   is shared across threads: when the last active partitions are paused while
   the thread waits (a changelog restore ends, so its partitions are paused
   while the stream partitions are still paused too), the set is empty when
   the thread drains, and it drains the paused stream partitions as well,
   moving aiokafka's position past their records.
3. ``Consumer.getmany`` then skips every record of a partition that is not
   active, silently: the records are never delivered, never acked, and never
   fetched again. Faust's committed offset stops before them for good (or,
   with later records acked, its gap tracking commits past them).

Seen here as a sequencer that restored its changelog, said "Worker ready" and
never processed the records waiting on one partition (the crash suite's
restart test, about 1 start in 20 under load).

The fix (:class:`SnapshotFetchConsumer`): the thread gets a snapshot (a copy) of
the active partitions taken when the fetch starts, never an empty one; and
records of a partition that is no longer active when the batch comes back
are handed back to aiokafka (seek to the first of them) instead of being
dropped. Upstream's ``getmany`` then filters nothing out at that point.

A second failure, in aiokafka 0.14.0 alone: a record whose header *name* is not
UTF-8 (Kafka does not validate header names; any writer of the topic can send
one). aiokafka decodes header names while it unpacks a fetched partition
(``PartitionRecords._unpack_records``): ``Fetcher.fetched_records`` raises
(``UnicodeDecodeError`` from the C extension, ``CorruptRecordException`` from the
pure-Python build), the records of the pass are not returned, the partition's
position does not move, and every later fetch fails the same way. Faust's
consumer stops the worker on it; a restart fetches the same offset again. The
records of other partitions drained earlier in the same pass are lost too: their
positions moved, the list holding them was dropped.

The fix (:class:`UnreadableSafeConsumerThread`, the consumer thread of
:class:`SnapshotFetchConsumer`): the thread drains aiokafka one pass at a time,
with the positions taken before the pass. When a pass fails to unpack, the
partitions it drained are handed back (a seek to where they were), and the
failing partition is read from its position with confluent-kafka
(``unreadable_records.PartitionScanner``), up to and including the first record
whose headers cannot be read. Those records are returned in aiokafka's place,
the unreadable one carrying ``UnreadableHeaders`` (the sequencer dead-letters it
with its reason), and aiokafka's position moves past them. A failure with no
readable record at the position is not a record's and is raised, as upstream.

Written against :data:`~turnlog.stream_processors.recovery.FAUST_VERSION`;
``tests/unit/test_faust_fetching.py`` and ``tests/unit/test_unreadable_fetch.py``
pin the upstream sources it relies on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Set
from typing import Any

import faust
from aiokafka.consumer.fetcher import READ_COMMITTED, Fetcher, FetchResult
from aiokafka.errors import ConsumerStoppedError, CorruptRecordException
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from faust.types import TP

from turnlog import kafka, metrics
from turnlog.kafka.record_headers import UnreadableHeaders
from turnlog.stream_processors.unreadable_records import PartitionScanner

__all__ = [
    "SnapshotFetchApp",
    "SnapshotFetchConsumer",
    "UnreadableSafeConsumerThread",
    "PromptFetcher",
    "UNPACK_ERRORS",
    "records_to_hand_back",
]

logger = logging.getLogger(__name__)

#: What aiokafka raises while unpacking a fetched partition for what one of its records holds
#: (a header name that is not UTF-8): ``CorruptRecordException`` from the pure-Python build,
#: ``UnicodeDecodeError`` from the C extension. Broker and network errors are none of these.
UNPACK_ERRORS: tuple[type[Exception], ...] = (CorruptRecordException, UnicodeDecodeError)
#: Records read with confluent-kafka in aiokafka's place when the fetch asks for no limit.
SCAN_MAX_RECORDS = 1000
#: Longest the broker holds a fetch request that leaves out a partition whose fetched records are
#: not drained yet (milliseconds). aiokafka keeps one fetch in flight per broker and leaves such
#: partitions out of it; the request may then hold only partitions that get no records (Faust's
#: assignor leader topic, an idle partition) and, held for Faust's 1,500 ms, kept the drained
#: partitions from being fetched again: the sequencer's input stalled ~1.4 s out of every ~1.75 s
#: at 680 events/s (a batch that takes longer than aiokafka's 100 ms prefetch backoff to drain
#: starts it, and the burst after each stall keeps it going).
PROMPT_FETCH_MAX_WAIT_MS = 25
#: Longest the broker holds a fetch request of every fetchable partition (milliseconds; Faust's
#: own setting): the broker answers it as soon as one of them has a record, so the wait only paces
#: an idle consumer (25 ms here took an idle sequencer from ~3 % to ~7 % of a core, and the
#: broker from ~2 % to ~7 %).
IDLE_FETCH_MAX_WAIT_MS = 1500


class PromptFetcher(Fetcher):
    """aiokafka's fetcher, whose fetch request waits at the broker for at most
    :data:`PROMPT_FETCH_MAX_WAIT_MS` while it leaves out a partition with undrained records, and
    :data:`IDLE_FETCH_MAX_WAIT_MS` otherwise."""

    def _get_actions_per_node(self, assignment: Any) -> Any:
        leaves_some_out = any(tp in self._records for tp in assignment.tps)  # upstream's rule for leaving one out
        self._fetch_max_wait_ms = PROMPT_FETCH_MAX_WAIT_MS if leaves_some_out else IDLE_FETCH_MAX_WAIT_MS
        return super()._get_actions_per_node(assignment)


def records_to_hand_back(records: Mapping[TP, list[Any]], active: Set[TP]) -> dict[TP, int]:
    """``{partition: first offset}`` of the fetched partitions outside ``active``:
    where aiokafka must read again, because Faust would drop those records."""
    return {tp: batch[0].offset for tp, batch in records.items() if batch and tp not in active}


class UnreadableSafeConsumerThread(AIOKafkaConsumerThread):
    """Faust's aiokafka consumer thread, whose fetch goes on past a record aiokafka cannot unpack,
    whose consumer reads only committed records (``read_committed``: the sequencer writes
    the transcript and its changelog in transactions; upstream reads them so only in its own
    exactly-once mode), and whose fetcher is a :class:`PromptFetcher`."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # Both handed to the fetcher aiokafka makes at start.
        consumer._isolation_level = "read_committed"
        consumer._fetch_max_wait_ms = PROMPT_FETCH_MAX_WAIT_MS
        return consumer

    async def on_start(self) -> None:
        await super().on_start()
        # aiokafka makes its Fetcher in start(); its fetch routine looks the method up on each pass.
        consumer = self._consumer
        assert consumer is not None  # made by upstream's on_start
        consumer._fetcher.__class__ = PromptFetcher

    @property
    def scanner(self) -> PartitionScanner | None:
        """Reads a partition with confluent-kafka where aiokafka failed (the app's
        ``partition_scanner``); None: such a failure is raised, as upstream (it stops the worker)."""
        return getattr(self.app, "partition_scanner", None)

    async def _fetch_records(
        self,
        consumer: Any,
        active_partitions: Set[TP] | None,
        timeout: float | None = None,
        max_records: int | None = None,
    ) -> Mapping[TP, list[Any]]:
        # Upstream's, with fetched_records drained by _drain.
        if not self.consumer.flow_active:
            return {}
        fetcher = consumer._fetcher
        if consumer._closed or fetcher._closed:
            raise ConsumerStoppedError()
        with fetcher._subscriptions.fetch_context():
            return await self._drain(consumer, fetcher, active_partitions, timeout or 0.0, max_records)

    async def _drain(
        self, consumer: Any, fetcher: Fetcher, partitions: Set[TP] | None, timeout: float, max_records: int | None
    ) -> Mapping[TP, list[Any]]:
        """``fetcher.fetched_records(partitions, timeout, max_records)``, one pass at a time: the
        positions are taken right before each pass (a pass with no timeout never awaits), so a
        pass that fails to unpack a partition is undone exactly (:meth:`_past_unreadable`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        subscriptions = fetcher._subscriptions
        while True:
            if subscriptions.reassignment_in_progress:
                await subscriptions.wait_for_assignment()
            pending = _fetched_positions(fetcher, partitions)
            try:
                drained = await fetcher.fetched_records(partitions, timeout=0, max_records=max_records)
            except UNPACK_ERRORS as error:
                return await self._past_unreadable(consumer, fetcher, pending, error, max_records)
            remaining = deadline - loop.time()
            if drained or remaining <= 0 or fetcher._closed:
                return drained
            waiter = fetcher._create_fetch_waiter()
            done, _ = await asyncio.wait([waiter], timeout=remaining)
            if not done or fetcher._closed:
                waiter.cancel()
                return {}
            waiter.result()  # raises what the fetch routine failed with (authorization errors)

    async def _past_unreadable(
        self,
        consumer: Any,
        fetcher: Fetcher,
        pending: list[tuple[TP, FetchResult, int]],
        error: Exception,
        max_records: int | None,
    ) -> Mapping[TP, list[Any]]:
        """After a pass raised ``error`` unpacking a partition: hand back what the pass drained,
        read the failing partition with confluent-kafka up to and including its first record
        whose headers cannot be read, return those records and move aiokafka past them.

        ``pending``: ``(partition, its fetch result, its position)`` before the pass, in the
        order the pass visits them (aiokafka's). The pass drained, in that order, every
        partition before the one that failed (each result drained is removed); the failing
        one is the first whose result is still there.

        Raises:
            The ``error``: it is not one partition's (none is found), no scanner is set, or no
            record can be read at the failing partition's position.
        """
        failed = next(((tp, position) for tp, result, position in pending if fetcher._records.get(tp) is result), None)
        scanner = self.scanner
        if failed is None or scanner is None:
            raise error
        tp, position = failed
        handed_back: dict[TP, int] = {}
        for drained, _, before in pending:  # their records were dropped with the pass: fetch them again
            if drained == tp:
                break
            if _position(fetcher, drained) not in (None, before):
                consumer.seek(drained, before)
                handed_back[drained] = before
        if handed_back:
            logger.info("records drained with it are read again from %s", handed_back)
        consumer.seek(tp, position)  # drops the half-unpacked fetch
        logger.error(
            "%s[%d]: aiokafka cannot unpack the records from offset %d (%s); reading them with confluent-kafka",
            tp.topic, tp.partition, position, type(error).__name__,
        )
        try:
            records = await asyncio.to_thread(
                scanner.scan, tp.topic, tp.partition, position,
                max_records=max_records or SCAN_MAX_RECORDS,
                max_bytes=fetcher._max_partition_fetch_bytes,
                read_committed=fetcher._isolation_level == READ_COMMITTED,
            )
        except kafka.BrokerError as e:  # the next fetch fails at the same place and reads again
            logger.warning("%s[%d]: reading from offset %d failed: %s", tp.topic, tp.partition, position, e)
            return {}
        if not records:
            raise error
        if _position(fetcher, tp) != position:
            return {}  # revoked or sought meanwhile: the records are no longer this fetch's to hand on
        consumer.seek(tp, records[-1].offset + 1)
        for record in records:
            if isinstance(record.headers, UnreadableHeaders):
                metrics.UNREADABLE_RECORDS.labels(tp.topic).inc()
                logger.error("%s[%d]@%d: %s; handed on as unreadable", tp.topic, tp.partition, record.offset,
                             record.headers.reason)
        return {tp: records}


def _position(fetcher: Fetcher, tp: TP) -> int | None:
    """aiokafka's position of ``tp`` (None: not assigned, or no position yet)."""
    assignment = fetcher._subscriptions.subscription.assignment if fetcher._subscriptions.subscription else None
    state = assignment.state_value(tp) if assignment is not None else None
    return state.position if state is not None and state.has_valid_position else None


def _fetched_positions(fetcher: Fetcher, partitions: Set[TP] | None) -> list[tuple[TP, FetchResult, int]]:
    """``(partition, fetch result, position)`` of the fetched partitions a pass over
    ``partitions`` drains, in the order it visits them (aiokafka's ``_records``)."""
    found = []
    for tp, result in fetcher._records.items():
        if type(result) is FetchResult and (not partitions or tp in partitions):
            position = _position(fetcher, tp)
            if position is not None:
                found.append((tp, result, position))
    return found


class SnapshotFetchConsumer(AIOKafkaConsumer):
    """Faust's aiokafka consumer, fetching only the partitions active when the fetch starts,
    through an :class:`UnreadableSafeConsumerThread`."""

    def _new_consumer_thread(self) -> UnreadableSafeConsumerThread:  # upstream's, with the thread class replaced
        return UnreadableSafeConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _getmany(self, active_partitions: Set[TP] | None, timeout: float) -> Mapping[TP, list[Any]]:
        if active_partitions is None:  # a client-only app reads every partition, as upstream
            return await super()._getmany(None, timeout)
        fetching = set(active_partitions)  # a copy, not the live set: that one changes while the thread drains
        if not fetching:  # aiokafka would read an empty set as every partition
            return {}
        records = await super()._getmany(fetching, timeout)
        active = self._get_active_partitions() | self._buffered_partitions  # what getmany will deliver
        dropped = records_to_hand_back(records, active)
        if not dropped:
            return records
        # A revoked partition is not ours to seek: its next owner starts at the committed offset.
        hand_back = {tp: offset for tp, offset in dropped.items() if tp in self.assignment()}
        if hand_back:
            logger.info("fetched records of partitions paused meanwhile; read again from %s", hand_back)
            await self.seek_wait(hand_back)
        return {tp: batch for tp, batch in records.items() if tp not in dropped}


class SnapshotFetchApp(faust.App):
    """``faust.App`` whose consumer is :class:`SnapshotFetchConsumer`. ``partition_scanner``
    (set it before the worker starts) reads a partition where aiokafka cannot unpack it."""

    partition_scanner: PartitionScanner | None = None

    def _new_consumer(self) -> SnapshotFetchConsumer:  # upstream's, with the consumer class replaced
        transport = self.transport
        return SnapshotFetchConsumer(
            transport,
            callback=self.topics.on_message,
            on_partitions_revoked=self._on_partitions_revoked,
            on_partitions_assigned=self._on_partitions_assigned,
            beacon=self.beacon,
            loop=transport.loop,
        )
