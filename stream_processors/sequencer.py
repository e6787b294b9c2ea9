"""The sequencer (Faust): orders, deduplicates and fences the raw event stream.

Consumes ``<prefix>.events``, keeps one :class:`SessionSequence` per session in
a changelog-backed table, emits ordered events to ``<prefix>.transcript`` on
the same partition, and routes rejects to ``<prefix>.dlq`` with the reason and
the original bytes (see ``turnlog.dlq`` for the headers).

Order of work for each batch of records (``stream.take_events``):

1. decide every record against the session states (pure: ``sequencing.py``);
2. send the emissions and rejects, and wait until Kafka acknowledged them all;
3. only then write the new states to the table (and so to its changelog);
4. Faust acks the batch's records; its periodic commit flushes the producer
   (changelog included) before it commits their offsets.

So the stored state is never ahead of what the transcript holds: a crash
before (3) re-processes the batch from the old state and re-emits the same
events in the same order (duplicates, dropped by seq downstream); a crash
after (3) re-processes against the new state, where they are duplicates.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import faust
from confluent_kafka import KafkaException

from turnlog import metrics
from turnlog.dlq import dlq_headers, reason_class
from turnlog.faults import fault_point
from turnlog.schemas import EventValidationError, decode_event
from turnlog.settings import TurnlogSettings
from turnlog.stream_processors.app import make_app, raw_topic
from turnlog.stream_processors.gap_repair import LogRangeReader
from turnlog.stream_processors.progress import ProgressCommitter
from turnlog.stream_processors.sequencing import SessionSequence, sequence

__all__ = ["build_sequencer", "TABLE_NAME", "BATCH_SIZE", "BATCH_WAIT_SECONDS"]

logger = logging.getLogger(__name__)
TABLE_NAME = "sequencer-state"
BATCH_SIZE = 500
BATCH_WAIT_SECONDS = 0.02
#: A partition with nothing processed for this long, but records past our position, is re-read (seconds).
IDLE_TAIL_SECONDS = 2.0
CHANGELOG_SEGMENT_MS = 10 * 60 * 1000


@dataclass(frozen=True, slots=True)
class _Position:
    """Where a re-read record came from (what a Faust message says of itself)."""

    topic: str
    partition: int
    offset: int


def build_sequencer(settings: TurnlogSettings) -> faust.App:
    """The sequencer app (consumer group ``settings.sequencer_group``)."""
    app = make_app(settings, settings.sequencer_group)
    topics = settings.topics
    events = raw_topic(app, topics.events)
    transcript = raw_topic(app, topics.transcript)
    dlq = raw_topic(app, topics.dlq)
    states = app.Table(
        TABLE_NAME,
        default=None,
        key_type=bytes,  # raw keys; values (no value_type) are JSON
        partitions=settings.partitions,
        # States are written after a batch, outside one record's context: the
        # key's own partition (murmur2, as the topics) picks the changelog partition.
        use_partitioner=True,
        # Roll segments often so compaction keeps the changelog (and so the
        # restore at start-up) near one record per session.
        extra_topic_configs={"segment.ms": str(CHANGELOG_SEGMENT_MS), "min.cleanable.dirty.ratio": "0.1"},
        help="SessionSequence per session id (JSON).",
    )

    async def reject(key: bytes | None, raw: bytes, reason: str, message: Any) -> Any:
        metrics.DLQ_ROUTED.labels("sequencer", reason_class(reason)).inc()
        logger.warning("DLQ %s[%d]@%d: %s", message.topic, message.partition, message.offset, reason)
        headers = dlq_headers(reason, message.topic, message.partition, message.offset)
        return await dlq.send(key=key, value=raw, headers=headers, partition=message.partition)

    reader = LogRangeReader(settings.bootstrap_servers, topics.events, settings.sequencer_group)
    repaired: dict[bytes, int] = {}  # key -> the next_seq whose gap was already re-read
    next_offset: dict[int, int] = {}  # partition -> the offset the next record should have
    progress = ProgressCommitter(settings.bootstrap_servers, topics.events, settings.sequencer_group)

    def apply(state: SessionSequence, event: Any, raw: bytes, offset: int) -> Any:
        decision = sequence(state, event, raw, offset, max_buffer=settings.reorder_buffer_size)
        metrics.EVENTS_EMITTED.inc(len(decision.emit))
        if decision.duplicate:
            metrics.DUPLICATES_DROPPED.inc()
        if decision.gap_opened:
            metrics.GAPS_OPENED.inc()
            logger.info("gap in %s: waiting for seq %d (got %d)", event.session_id, state.next_seq, event.seq)
        return decision

    # The agent's batches and the idle-tail re-read never interleave: both
    # read and write the same session states.
    batch_lock = asyncio.Lock()
    last_batch_at: dict[int, float] = {}  # partition -> when a batch last held one of its records

    @app.agent(events, name="sequence-events")
    async def sequence_events(stream: faust.StreamT[bytes]) -> None:
        async for records in stream.take_events(BATCH_SIZE, within=BATCH_WAIT_SECONDS):
            async with batch_lock:
                await process([(record.key, record.value, record.message) for record in records])

    @app.timer(interval=IDLE_TAIL_SECONDS)
    async def reread_idle_tails() -> None:
        """A record the stream processor dropped is noticed by the next one in its
        partition; if none comes, it is noticed here: an assigned partition with
        nothing processed for a while, yet records past our position, is re-read.
        Then the recorded progress catches up (``progress.py``)."""
        if app.rebalancing or app.in_recovery:
            return  # never touch table state while Faust restores or reassigns it
        assigned = {tp.partition for tp in app.consumer.assignment() if tp.topic == topics.events}
        await reread(assigned)
        await record_progress(assigned)

    async def record_progress(assigned: set[int]) -> None:
        try:
            candidates = {
                p: next_offset[p] if p in next_offset else await asyncio.to_thread(reader.committed, p)
                for p in sorted(assigned)
            }
            await asyncio.to_thread(progress.catch_up, candidates)
        except KafkaException as e:  # the next tick tries again
            logger.warning("could not bring the recorded progress up to date: %s", e)

    @app.on_partitions_revoked.connect
    async def forget_revoked(_app: Any, revoked: Any, **_: Any) -> None:
        # Another worker may take these: our positions there would go stale.
        for tp in revoked:
            if tp.topic == topics.events:
                next_offset.pop(tp.partition, None)
                last_batch_at.pop(tp.partition, None)

    async def reread(assigned: set[int]) -> None:
        now = time.monotonic()
        for partition in sorted(assigned & set(next_offset)):
            if now - last_batch_at.get(partition, now) < IDLE_TAIL_SECONDS:
                continue
            try:
                end = await asyncio.to_thread(reader.end_offset, partition)
            except KafkaException as e:
                logger.warning("end offset of %s[%d] unknown: %s", topics.events, partition, e)
                continue
            async with batch_lock:
                expected = next_offset.get(partition, end)
                if expected >= end:
                    continue
                found = await asyncio.to_thread(reader.read, partition, expected, end - 1)
                logger.warning(
                    "offsets %d..%d of %s[%d] were never delivered; re-read %d records",
                    expected, end - 1, topics.events, partition, len(found),
                )
                await process([(key, raw, _Position(topics.events, partition, offset)) for offset, key, raw in found])

    async def process(items: list[tuple[bytes | None, bytes, Any]]) -> None:
        """One batch: ``(key, value, message)`` items, ``message`` giving topic, partition and offset."""
        touched: dict[bytes, tuple[SessionSequence, Any]] = {}
        sent: list[Any] = []

        async def handle(key: bytes | None, raw: bytes, message: Any) -> None:
            try:
                event = decode_event(raw)
            except EventValidationError as e:
                sent.append(await reject(key, raw, f"invalid: {e.reason}", message))
                return
            if key != event.session_id.encode("utf-8"):
                sent.append(await reject(key, raw, f"invalid: record key {key!r} is not the session_id", message))
                return
            try:
                state = touched[key][0] if key in touched else SessionSequence.from_json(states.get(key))
                decision = apply(state, event, raw, message.offset)
            except Exception as e:  # a bug here must not stop the pipeline; the bytes go to the DLQ
                logger.exception("sequencing %s seq %d failed", event.session_id, event.seq)
                sent.append(await reject(key, raw, f"internal: {type(e).__name__}: {e}", message))
                return
            touched[key] = (state, message)
            for out in decision.emit:
                sent.append(await transcript.send(key=key, value=out, partition=message.partition))
            for held, reason in decision.dlq:
                sent.append(await reject(key, held, reason, message))

        batch_at = time.monotonic()
        for record_key, record_value, message in items:
            last_batch_at[message.partition] = batch_at
            expected = next_offset.get(message.partition)
            if expected is None:
                try:
                    expected = await asyncio.to_thread(reader.committed, message.partition)
                except KafkaException as e:  # cannot check this start; the session gap re-read still runs
                    logger.warning("committed offset of %s[%d] unknown: %s", message.topic, message.partition, e)
                    expected = message.offset
            if message.offset > expected:  # records skipped before this one: read them again
                skipped = await asyncio.to_thread(reader.read, message.partition, expected, message.offset - 1)
                logger.warning(
                    "offsets %d..%d of %s[%d] were not delivered; re-read %d records",
                    expected, message.offset - 1, message.topic, message.partition, len(skipped),
                )
                for offset, key, raw in skipped:
                    await handle(key, raw, _Position(message.topic, message.partition, offset))
            next_offset[message.partition] = max(expected, message.offset + 1)
            await handle(record_key, record_value, message)
        for key, (state, message) in list(touched.items()):
            gap = state.missing_range()
            if gap is None or repaired.get(key) == state.next_seq:
                continue
            repaired[key] = state.next_seq
            found = await asyncio.to_thread(reader.read, message.partition, gap[0], gap[1], key)
            if found:
                logger.warning("gap in %r: re-read %d records from %s[%d]", key, len(found), topics.events, message.partition)
            for offset, _, raw in found:
                await handle(key, raw, _Position(message.topic, message.partition, offset))
        await asyncio.gather(*sent)  # acks=all: the emissions are durable before the state moves
        fault_point("sequencer.after_emit")
        for key, (state, _) in touched.items():
            states[key] = state.to_json()
        batch_partitions = {message.partition for _, _, message in items}
        try:
            progress.commit({p: next_offset[p] for p in batch_partitions})
        except KafkaException as e:  # only the resume barrier waits on it; the next batch commits again
            logger.warning("could not record progress: %s", e)

    return app
