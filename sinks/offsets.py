"""Offsets in the rows' transaction: the ``sink_offsets`` tracking records.

:class:`SqlOffsets` is the frame every projection of the transcript shares
(:meth:`SqlOffsets.apply_tracked`). In the caller's transaction, in this order:

1. lock this consumer group's ``sink_offsets`` rows for the batch's partitions,
   refuse the batch (:class:`SinkFencedError`) when another sink has claimed one
   of them since this one did, and drop records below the stored offsets;
2. hand the rest to the batch writer, which writes their rows (and, for the
   transcript, finalizes the sessions they complete: ``sinks/transcript.py``);
3. move ``sink_offsets`` forward past the whole batch (never backward).

Nothing here commits: the caller's ``engine.begin()`` block commits the rows,
the finalization and the offsets together, or none of them. The Kafka
consumer (``sinks/service.py``) never commits offsets to Kafka; on partition
assignment it claims the partitions (:meth:`SqlOffsets.claim_partitions`) and
seeks to the offsets stored.

Fencing: each row's ``owner_generation`` is a fencing token. A sink assigned a
partition raises it and keeps the value; each batch's transaction reads it
under the row lock and commits only if it is still that value. A sink frozen
past its session timeout (a GC pause, SIGSTOP, a cut network) whose partitions
moved to another sink therefore writes no row and no offset when it wakes: the
other sink's claim raised the generation first. A claim waits for a batch
transaction holding the row lock; Postgres ends a transaction left idle by a
frozen client (``sinks/postgres.py``), so a claim is never held up longer.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from turnlog.sinks.exceptions import SinkFencedError
from turnlog.sinks.interfaces import BatchResult, BatchWriter, Dialect, OnRejected
from turnlog.sinks.source_records import SourceMessage, next_offsets
from turnlog.sinks.tables import sink_offsets

if TYPE_CHECKING:
    from turnlog.sinks.base import SqlStore

__all__ = ["SqlOffsets", "offsets_to_store", "Fences", "stored_group_offsets"]

logger = logging.getLogger(__name__)
#: ``{(topic, partition): owner_generation}`` a sink claimed for its assigned partitions.
Fences = Mapping[tuple[str, int], int]


def offsets_to_store(
    consumer_group: str, next_offsets: Mapping[tuple[str, int], int], stored: Mapping[tuple[str, int], int]
) -> list[dict[str, Any]]:
    """The ``sink_offsets`` rows that move ``consumer_group`` forward: one per
    partition whose next offset is past the stored one, in (topic, partition) order.
    A partition never moves backward (the upsert's guard says the same)."""
    return [
        {"consumer_group": consumer_group, "topic": topic, "partition": partition, "next_offset": offset}
        for (topic, partition), offset in sorted(next_offsets.items())
        if offset > stored.get((topic, partition), -1)
    ]


class SqlOffsets:
    """:class:`~turnlog.sinks.interfaces.OffsetTracking` over the ``sink_offsets`` table."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect

    def apply_tracked(
        self,
        conn: Connection,
        consumer_group: str | None,
        messages: Sequence[SourceMessage],
        write: BatchWriter,
        *,
        on_rejected: OnRejected | None = None,
        fences: Fences | None = None,
    ) -> BatchResult:
        """The offset-in-transaction frame every projection of the transcript shares.

        In ``conn``'s transaction: lock ``consumer_group``'s ``sink_offsets`` rows
        for the batch's partitions, drop records below them, let ``write`` turn
        the rest into rows (it returns the records it refused, with a reason,
        and the sessions it finalized), then move the offsets past the whole
        batch. The transcript sink and the analytics projection
        (``sinks/analytics.py``) are two ``write`` functions over this one frame.
        Sessions in ``BatchResult.finalized`` are finalized once the caller
        commits; :func:`~turnlog.sinks.finalization.report_finalized` counts them after that.

        Undecodable records are handed to ``on_rejected(message, reason)``
        before the offsets move past them; without it they are logged.
        ``consumer_group=None`` writes the rows without reading or moving any
        offsets (``turnlog replay``). With ``fences`` (the generations the
        sink claimed), the batch is refused when the store holds another
        generation for one of its partitions.

        Raises:
            SinkFencedError: ``fences`` is given and another sink claimed a partition of the
                batch since; nothing was written (the caller's transaction rolls back).
        """
        stored: dict[tuple[str, int], int] = {}
        if consumer_group is not None:
            partitions = {(m.topic, m.partition) for m in messages}
            stored = self._locked_and_fenced(conn, consumer_group, partitions, fences)
        fresh = [m for m in messages if m.offset >= stored.get((m.topic, m.partition), 0)]
        written = write(conn, fresh)
        rejected = written.rejected
        for refused in rejected:
            m = refused.message
            if on_rejected is not None:
                on_rejected(m, f"{refused.reason_class}: {refused.reason}")
            else:
                logger.error(
                    "skipping undecodable record %s[%d]@%d: %s", m.topic, m.partition, m.offset, refused.reason
                )
        if consumer_group is not None:
            self._advance(conn, consumer_group, next_offsets(fresh), stored)
        return BatchResult(
            applied=len(fresh) - len(rejected),
            stale=len(messages) - len(fresh),
            rejected=len(rejected),
            finalized=written.finalized,
            turns_emitted_at=written.turns_emitted_at,
            ended_at=written.ended_at,
        )

    def skip_records(
        self, conn: Connection, consumer_group: str, messages: Sequence[SourceMessage], *, fences: Fences | None = None
    ) -> None:
        """Move the group's offsets past ``messages`` without writing their rows
        (for records dead-lettered by the sink).

        Raises:
            SinkFencedError: as :meth:`apply_tracked`.
        """
        partitions = {(m.topic, m.partition) for m in messages}
        stored = self._locked_and_fenced(conn, consumer_group, partitions, fences)
        self._advance(conn, consumer_group, next_offsets(messages), stored)

    def claim_partitions(
        self, conn: Connection, consumer_group: str, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        """Claim ``partitions`` for a sink just assigned them: raise each one's
        ``owner_generation`` (creating its row, at offset 0, if it has none) and return
        ``{(topic, partition): the generation now held}``. From the caller's commit on,
        a batch under an older generation is refused (:meth:`apply_tracked`)."""
        claimed = {}
        for topic, partition in sorted(set(partitions)):
            row = conn.execute(
                self._claim, {"consumer_group": consumer_group, "topic": topic, "partition": partition,
                              "next_offset": 0, "owner_generation": 1}
            ).one()
            claimed[(topic, partition)] = row.owner_generation
        return claimed

    def _locked_and_fenced(
        self, conn: Connection, consumer_group: str, partitions: set[tuple[str, int]], fences: Fences | None
    ) -> dict[tuple[str, int], int]:
        """Lock the partitions' rows; their next offsets, after checking ``fences`` against them."""
        if fences is None:
            return self.stored_offsets(conn, consumer_group, partitions, lock=True)
        if not partitions:
            return {}
        topics = sorted({topic for topic, _ in partitions})
        rows = conn.execute(self._locked_offsets_query, {"group": consumer_group, "topics": topics})
        stored, generations = {}, {}
        for r in rows:
            if (r.topic, r.partition) in partitions:
                stored[(r.topic, r.partition)] = r.next_offset
                generations[(r.topic, r.partition)] = r.owner_generation
        fenced = {tp: (fences.get(tp), generations.get(tp)) for tp in partitions
                  if fences.get(tp) is None or generations.get(tp) != fences[tp]}
        if fenced:
            raise SinkFencedError(consumer_group, fenced)
        return stored

    def stored_offsets(
        self, conn: Connection, consumer_group: str, partitions: Iterable[tuple[str, int]], *, lock: bool = False
    ) -> dict[tuple[str, int], int]:
        """``{(topic, partition): next offset}`` stored for ``consumer_group``."""
        wanted = set(partitions)
        if not wanted:
            return {}
        topics = sorted({topic for topic, _ in wanted})
        query = self._locked_offsets_query if lock else self._offsets_query
        rows = conn.execute(query, {"group": consumer_group, "topics": topics})
        return {(r.topic, r.partition): r.next_offset for r in rows if (r.topic, r.partition) in wanted}

    # The queries are built once per store too: building one and its cache key costs
    # more than the sink's Python work on the rows of a small batch.
    @functools.cached_property
    def _offsets_query(self) -> Any:
        return (
            select(sink_offsets.c.topic, sink_offsets.c.partition, sink_offsets.c.next_offset,
                   sink_offsets.c.owner_generation)
            .where(sink_offsets.c.consumer_group == bindparam("group"),
                   sink_offsets.c.topic.in_(bindparam("topics", expanding=True)))
            .order_by(sink_offsets.c.topic, sink_offsets.c.partition)
        )

    @functools.cached_property
    def _locked_offsets_query(self) -> Any:
        return self._dialect.lock(self._offsets_query)

    # Built once per store: building an upsert (its ``excluded`` columns) costs
    # about as much as executing it for a small batch.
    @functools.cached_property
    def _upsert(self) -> Any:
        stmt = self._dialect.insert(sink_offsets)
        return stmt.on_conflict_do_update(
            index_elements=[sink_offsets.c.consumer_group, sink_offsets.c.topic, sink_offsets.c.partition],
            set_={"next_offset": stmt.excluded.next_offset},
            where=stmt.excluded.next_offset > sink_offsets.c.next_offset,
        )

    @functools.cached_property
    def _claim(self) -> Any:
        stmt = self._dialect.insert(sink_offsets)
        return stmt.on_conflict_do_update(
            index_elements=[sink_offsets.c.consumer_group, sink_offsets.c.topic, sink_offsets.c.partition],
            set_={"owner_generation": sink_offsets.c.owner_generation + 1},
        ).returning(sink_offsets.c.owner_generation)

    def _advance(
        self,
        conn: Connection,
        consumer_group: str,
        next_offsets: Mapping[tuple[str, int], int],
        stored: Mapping[tuple[str, int], int],
    ) -> None:
        rows = offsets_to_store(consumer_group, next_offsets, stored)
        if not rows:
            return
        conn.execute(self._upsert, rows)


def offsets_past_end(stored: dict[tuple[str, int], int], ends: dict[tuple[str, int], int]) -> dict[
        tuple[str, int], tuple[int, int]]:
    """``{(topic, partition): (stored, end)}`` where the stored offset (the next record
    to apply) is past the partition's end offset (the next record to be written).
    A partition whose end is unknown is not judged."""
    return {tp: (offset, ends[tp]) for tp, offset in stored.items() if tp in ends and offset > ends[tp]}


def stored_group_offsets(store: SqlStore, consumer_group: str, topics: Sequence[str]) -> dict[tuple[str, int], int]:
    """``{(topic, partition): next offset}`` of ``consumer_group``'s ``sink_offsets`` rows on
    ``topics``, read in a short transaction of its own without locking them: what the lag
    collector (``turnlog/kafka/lag.py``) compares with the partitions' ends
    (:meth:`StoreReads.group_offsets <turnlog.sinks.access.StoreReads.group_offsets>`).

    Raises:
        StoreUnavailableError: the store could not be read.
    """
    with store.reading() as reads:
        return reads.group_offsets(consumer_group, topics)
