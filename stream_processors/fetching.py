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

Written against :data:`~turnlog.stream_processors.recovery.FAUST_VERSION`;
``tests/unit/test_faust_fetching.py`` pins the upstream sources it relies on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Set
from typing import Any

import faust
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from faust.types import TP

__all__ = ["SnapshotFetchApp", "SnapshotFetchConsumer", "records_to_hand_back"]

logger = logging.getLogger(__name__)


def records_to_hand_back(records: Mapping[TP, list[Any]], active: Set[TP]) -> dict[TP, int]:
    """``{partition: first offset}`` of the fetched partitions outside ``active``:
    where aiokafka must read again, because Faust would drop those records."""
    return {tp: batch[0].offset for tp, batch in records.items() if batch and tp not in active}


class SnapshotFetchConsumer(AIOKafkaConsumer):
    """Faust's aiokafka consumer, fetching only the partitions active when the fetch starts."""

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
    """``faust.App`` whose consumer is :class:`SnapshotFetchConsumer`."""

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
