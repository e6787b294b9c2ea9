"""Faust's recovery completion, reordered so no fetched record is dropped.

The bug (faust-streaming#596, also #216, #221), in faust-streaming 0.15.3
``Recovery.on_recovery_completed`` (``faust/tables/recovery.py``):

1. it resumes the stream partitions, while the fetcher is running (the
   changelog restore resumed the flow);
2. it then awaits ``perform_seek()`` (seek to the committed offsets); during
   that await the fetcher reads the resumed partitions and puts records into
   the agents' input queues;
3. it then calls ``app.flow_control.resume()``, and mode's
   ``FlowControlEvent.resume()`` clears every queue created with
   ``clear_on_resume=True``, which every agent's input queue is. Those records
   are gone, never acked, while the fetcher's position is past them.

What follows depends on the offsets: the consumer's gap tracking
(``Consumer._add_gap``) lets the committed offset jump past the lost records,
or ``_new_offset`` never moves past them and the partition's commit stalls for
good. It happens at every start that restores a changelog while a backlog
waits, and at rebalances under traffic.

The fix keeps the stream partitions paused until they are seeked, and clears
the queues (``flow_control.resume()``) before they are resumed: seek, clear,
resume partitions, resume flow, with no ``await`` between the last three, so
the fetcher cannot run in between. ``_resume_streams`` (apps without tables,
such as the finalizer) has the same order and gets the same fix.

Two more changes, for a changelog written in Kafka transactions (the sequencer's,
``transactions.py``):

- its highwater (the offset of the last record to restore) is the offset of the last
  *committed record*, not the high watermark less one: a transaction ends in a marker,
  which no consumer is given, so upstream's restore would wait for it for good
  (``OffsetReader.record_ends``; the app's ``record_ends``);
- the app's ``before_restore`` (the sequencer's fence: ``init_transactions`` of each
  events partition assigned) is awaited before the restore starts, so a fenced previous
  owner can commit nothing past the end the restore reads to.

The override is written against exactly one faust-streaming version,
:data:`FAUST_VERSION`, which ``pyproject.toml`` pins;
``tests/unit/test_faust_recovery.py`` fails when the installed version or the
upstream methods replaced here change. The reproduction and the write-up for
upstream are in ``docs/faust-recovery.md``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Set
from typing import Any, cast

from faust.tables import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_fixed

from turnlog.kafka import BrokerError

__all__ = ["FAUST_VERSION", "OrderedRecovery", "OrderedTableManager"]

#: The faust-streaming version these overrides were written against.
FAUST_VERSION = "0.15.3"
#: How long a restore looks for its changelog partitions' last records through a broker outage
#: before the worker fails (seconds): as long as the sequencer's emissions wait one out.
RESTORE_END_PATIENCE_SECONDS = 600.0
#: Between two lookups of the last records (seconds).
RESTORE_END_RETRY_SECONDS = 1.0


class OrderedRecovery(Recovery):
    """Faust's ``Recovery`` with the stream partitions seeked and the agents'
    queues cleared before the partitions are resumed."""

    async def on_rebalance(
        self, assigned: set[TP], revoked: set[TP], newly_assigned: set[TP], generation_id: int = 0
    ) -> None:
        """Upstream's, after the app's ``before_restore`` (if set) was awaited with ``assigned``:
        not for an assignment a newer rebalance already replaced (upstream ignores it too), whose
        partitions may be another worker's by now."""
        before_restore: Callable[[Set[TP]], Awaitable[None]] | None = getattr(self.app, "before_restore", None)
        if before_restore is not None and generation_id == self.app.consumer_generation_id:
            await before_restore(assigned)
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)

    async def _build_highwaters(
        self, consumer: Any, tps: set[TP], destination: Counter[TP], title: str
    ) -> None:
        """Each changelog partition's last committed record's offset (-1: none), where the
        app has ``record_ends``; upstream's (the high watermark less one) otherwise."""
        record_ends: Callable[[str, Set[int]], Mapping[int, int]] | None = getattr(self.app, "record_ends", None)
        if record_ends is None:
            await super()._build_highwaters(consumer, tps, destination, title)
            return
        highwaters: dict[TP, int] = {}
        for topic in {tp.topic for tp in tps}:
            wanted = {tp.partition for tp in tps if tp.topic == topic}
            ends = await self._patiently(record_ends, topic, wanted)
            for partition in wanted:
                end = ends.get(partition, 0)
                highwaters[TP(topic, partition)] = end - 1 if end > 0 else -1
        self.log.info("Highwater for %s changelog partitions (last committed records):\n%s",
                      title, self._highwater_logtable(highwaters, title=title))
        destination.clear()
        destination.update(highwaters)

    async def _patiently(
        self, record_ends: Callable[[str, Set[int]], Mapping[int, int]], topic: str, partitions: Set[int]
    ) -> Mapping[int, int]:
        """``record_ends(topic, partitions)`` in a worker thread, tried again for up to
        ``RESTORE_END_PATIENCE_SECONDS`` while the broker is unavailable (a leader election,
        two brokers of three down): the worker waits the failover out instead of crashing.

        Raises:
            BrokerError: a non-retriable one, or the broker stayed unavailable.
        """
        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda e: isinstance(e, BrokerError) and e.retriable),
            stop=stop_after_delay(RESTORE_END_PATIENCE_SECONDS),
            wait=wait_fixed(RESTORE_END_RETRY_SECONDS),
            before_sleep=lambda state: self.log.warning(
                "last records of %s not found yet, trying again: %s", topic,
                state.outcome.exception() if state.outcome else None,
            ),
            reraise=True,
        )
        return await retrying(asyncio.to_thread, record_ends, topic, partitions)

    def _stream_partitions(self) -> set[Any]:
        return {tp for tp in self.app.consumer.assignment() if not self._is_changelog_tp(tp)}

    async def _seek_then_resume_streams(self) -> None:
        """Seek the (still paused) stream partitions, then clear the queues and
        resume partitions and flow in one step of the event loop.

        Raises:
            RebalanceAgain, ServiceStopped: as Faust's own recovery does.
        """
        app = self.app
        consumer = app.consumer
        streams = self._stream_partitions()
        consumer.pause_partitions(streams)  # paused since the rebalance; say it again, it costs nothing
        if streams:
            self.log.info("Seek stream partitions to committed offsets.")
            await self._wait(consumer.perform_seek(), timeout=app.conf.broker_request_timeout)
        self.completed.set()
        # No await from here on: the fetcher cannot run between these.
        app.flow_control.resume()  # clears the clear_on_resume queues: nothing from past the seek is lost
        consumer.resume_partitions(self._stream_partitions())
        consumer.resume_flow()

    async def _after_streams_resumed(self, *, standbys_ready: bool) -> None:
        app = self.app
        await cast(Any, app)._fetcher.maybe_start()  # make sure the fetcher runs
        self.tables.on_actives_ready()
        if standbys_ready:
            self.tables.on_standbys_ready()
        app.on_rebalance_end()  # its sensors' on_rebalance_end: the ready file is written (worker.ReadinessSensor)
        self.log.info("Worker ready")

    async def _resume_streams(self, generation_id: int = 0) -> None:
        """Upstream's path for apps without tables, reordered."""
        app = self.app
        await app.on_rebalance_complete.send()
        if app.consumer_generation_id != generation_id:
            self.log.warning("Recovery rebalancing again")
            return
        await self._seek_then_resume_streams()
        await self._after_streams_resumed(standbys_ready=True)

    async def on_recovery_completed(self, generation_id: int = 0) -> None:
        """Upstream's completion of an active table restore, reordered."""
        app = self.app
        self.log.info("Restore complete!")
        await app.on_rebalance_complete.send()
        self._set_recovery_ended()
        callbacks = [
            asyncio.ensure_future(table.on_recovery_completed(self.actives_for_table[table],
                                                              self.standbys_for_table[table]))
            for table in self.tables.values()
        ]
        if callbacks:
            await asyncio.wait(callbacks)
        if app.consumer_generation_id != generation_id:
            self.log.warning(f"Recovery rebalancing again app id {app.consumer_generation_id} param {generation_id}")
            return
        await self._seek_then_resume_streams()
        await self._after_streams_resumed(standbys_ready=not app.assignor.assigned_standbys())


class OrderedTableManager(TableManager):
    """Faust's ``TableManager`` whose recovery service is :class:`OrderedRecovery`.

    Installed with ``faust.App(..., TableManager=OrderedTableManager)``.
    """

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = OrderedRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery
