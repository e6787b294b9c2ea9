"""The sequencer (Faust): orders, deduplicates and fences the raw event stream.

Consumes ``<prefix>.events``, keeps one :class:`SessionSequence` per session in
a changelog-backed table, emits ordered events to ``<prefix>.transcript`` on
the same partition, and routes rejects to ``<prefix>.dlq`` with the reason and
the original bytes (see ``turnlog.dlq`` for the headers).

Order of work for each batch of records (``stream.take_events``), in
:meth:`Sequencer.process`:

1. decide every record against the session states (pure: ``sequencing.py``);
2. send the emissions and rejects through turnlog's idempotent producer
   (``emitter.py``) and wait until Kafka acknowledged them all;
3. only then send the new states to the table's changelog through the same
   producer, wait for their acknowledgement, and set them in the table;
4. Faust acks the batch's records and later commits their offsets.

So the stored state is never ahead of what the transcript holds, and the
committed offset never ahead of the stored state: a crash before (3) is
acknowledged re-processes the batch from the old state and re-emits the same
events in the same order (duplicates, dropped by seq downstream); a crash
after it re-processes against the new state, where they are duplicates.

The changelog is written here rather than by Faust's ``Table.__setitem__``
(one aiokafka send per key, flushed only at Faust's commit): the records are
the ones Faust writes and restores (raw key, JSON value, the key's murmur2
partition), at a fraction of the cost, and acknowledged before the ack.

The group's committed offset is what the resume barrier waits on
(``producers/resume.py``): since Faust's recovery completion no longer drops
fetched records (``recovery.py``), it never passes an unprocessed record.
Two checks stay as tripwires: offset continuity per partition (a jump is an
error log and ``turnlog_sequencer_offset_jumps_total``; the skipped records
are read again so nothing is lost) and a session's seq gap (the offsets
where the missing seq must be are read again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

import faust
import msgspec

from turnlog import kafka, metrics
from turnlog.dlq import dlq_headers, reason_class
from turnlog.exceptions import ConfigurationError
from turnlog.faults import fault_point
from turnlog.schemas import EventValidationError, decode_event
from turnlog.schemas.headers import event_type, peek_event_type, type_headers
from turnlog.settings import TopicNames, TurnlogSettings
from turnlog.signing import RecordVerifier
from turnlog.stream_processors.admission import admit
from turnlog.stream_processors.app import make_app, raw_topic
from turnlog.stream_processors.emitter import EmissionBatch, EmissionFailed, EmissionProducer
from turnlog.stream_processors.gap_repair import LogRangeReader
from turnlog.stream_processors.sequencing import SessionSequence, sequence

__all__ = ["build_sequencer", "Sequencer", "SourceRecord", "TABLE_NAME", "BATCH_SIZE", "BATCH_WAIT_SECONDS"]

logger = logging.getLogger(__name__)
TABLE_NAME = "sequencer-state"
BATCH_SIZE = 1000
BATCH_WAIT_SECONDS = 0.005
CHANGELOG_SEGMENT_MS = 10 * 60 * 1000
#: Faust commits the acked offsets this often (seconds); the resume barrier waits on them.
COMMIT_INTERVAL_SECONDS = 0.1
#: How long an emission waits for the broker before the worker stops (seconds). A broker may be
#: away for minutes: a batch waits through the outage (its records stay unacked) rather than
#: crash the worker when the broker comes back a little late (120 s crashed it after a 90 s outage
#: in CI, while the restarted broker was still starting).
EMISSION_DELIVERY_TIMEOUT_SECONDS = 600.0
EMISSION_LINGER_MS = 1
#: How often gaps whose re-read failed are read again (seconds).
GAP_RETRY_SECONDS = 5.0
_JSON = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One record of ``<prefix>.events``: from Faust's stream, or read again from the log."""

    key: bytes | None
    value: bytes
    partition: int
    offset: int
    #: the record's headers as the client gave them (a list of pairs, a mapping, or None)
    headers: Any = None


class Sequencer:
    """One worker's sequencing over its session states (a Faust table, or any mapping).

    ``states`` maps a session key (bytes) to its :meth:`SessionSequence.to_json`
    (a Faust table's store: setting a key there sends nothing); ``changelog``
    is the table's changelog topic, where this class writes each new state.
    """

    def __init__(
        self,
        *,
        states: MutableMapping[bytes, Any],
        changelog: str,
        emissions: EmissionProducer,
        reader: LogRangeReader,
        topics: TopicNames,
        max_buffer: int,
        verifier: RecordVerifier | None = None,
    ) -> None:
        self._states = states
        self._verifier = verifier
        self._changelog = changelog
        self._emissions = emissions
        self._reader = reader
        self._topics = topics
        self._max_buffer = max_buffer
        self._next_offset: dict[int, int] = {}  # partition -> the offset its next record should have
        self._repaired: dict[bytes, int] = {}  # key -> the next_seq whose gap was already read again
        self._unrepaired: dict[bytes, int] = {}  # key -> partition: a gap whose re-read failed (retried by retry_gaps)

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop positions of revoked partitions: another worker may take them."""
        revoked = set(partitions)
        for partition in revoked:
            self._next_offset.pop(partition, None)
        self._unrepaired = {key: p for key, p in self._unrepaired.items() if p not in revoked}

    @property
    def has_unrepaired_gaps(self) -> bool:
        """True while a session waits on a gap whose re-read failed (the broker did not answer)."""
        return bool(self._unrepaired)

    async def retry_gaps(self) -> None:
        """Read again the gaps whose re-read failed, and apply what is found as a batch.
        A session that gets no later record would otherwise wait on its gap for good."""
        pending, self._unrepaired = self._unrepaired, {}
        await self.process([], recheck=pending)

    async def process(self, records: list[SourceRecord], *, recheck: dict[bytes, int] | None = None) -> None:
        """Sequence one batch: decide, send, await the acks, then store the states.
        ``recheck`` (``{key: partition}``) adds sessions whose gap is read again.

        Raises:
            EmissionFailed: the broker refused an emission; nothing of the batch was stored.
        """
        batch = self._emissions.batch()
        touched: dict[bytes, tuple[SessionSequence, SourceRecord]] = {
            key: (SessionSequence.from_json(self._states.get(key)), SourceRecord(key, b"", partition, -1))
            for key, partition in (recheck or {}).items()
        }
        for record in records:
            for skipped in await self._skipped_before(record):
                self._decide(batch, touched, skipped)
            self._decide(batch, touched, record)
        for skipped in await self._missing_seqs(touched):
            self._decide(batch, touched, skipped)
        await batch.delivered()  # acks=all: the emissions are durable before the state moves
        fault_point("sequencer.after_emit")
        new_states = {key: state.to_json() for key, (state, _) in touched.items()}
        changelog = self._emissions.batch()
        for key, value in new_states.items():
            changelog.send(self._changelog, key=key, value=_JSON.encode(value), partition=touched[key][1].partition)
        await changelog.delivered()
        self._states.update(new_states)

    def _decide(
        self, batch: EmissionBatch, touched: dict[bytes, tuple[SessionSequence, SourceRecord]], record: SourceRecord
    ) -> None:
        key, raw = record.key, record.value
        try:
            event = decode_event(raw)
        except EventValidationError as e:
            self._reject(batch, record, raw, f"invalid: {e.reason}")
            return
        if key != event.session_id.encode("utf-8"):
            self._reject(batch, record, raw, f"invalid: record key {key!r} is not the session_id")
            return
        assert key is not None
        try:
            state = touched[key][0] if key in touched else SessionSequence.from_json(self._states.get(key))
            if self._verifier is not None:
                refused = admit(self._verifier, state, event, key, raw, record.headers)
                if refused is not None:
                    self._reject(batch, record, raw, refused)
                    return
            decision = sequence(state, event, raw, record.offset, max_buffer=self._max_buffer)
        except Exception as e:  # a bug here must not stop the pipeline; the bytes go to the DLQ
            logger.exception("sequencing %s seq %d failed", event.session_id, event.seq)
            self._reject(batch, record, raw, f"internal: {type(e).__name__}: {e}")
            return
        metrics.EVENTS_EMITTED.inc(len(decision.emit))
        if decision.duplicate:
            metrics.DUPLICATES_DROPPED.inc()
        if decision.gap_opened:
            metrics.GAPS_OPENED.inc()
            logger.info("gap in %s: waiting for seq %d (got %d)", event.session_id, state.next_seq, event.seq)
        touched[key] = (state, record)
        for out in decision.emit:
            # The turnlog-type header: this event's type; an event released from the gap buffer behind it is peeked.
            headers = type_headers(event_type(event) if out is raw else peek_event_type(out))
            batch.send(self._topics.transcript, key=key, value=out, partition=record.partition, headers=headers)
        for held, reason in decision.dlq:
            self._reject(batch, record, held, reason)

    def _reject(self, batch: EmissionBatch, record: SourceRecord, raw: bytes, reason: str) -> None:
        metrics.DLQ_ROUTED.labels("sequencer", reason_class(reason)).inc()
        logger.warning("DLQ %s[%d]@%d: %s", self._topics.events, record.partition, record.offset, reason)
        headers = dlq_headers(reason, self._topics.events, record.partition, record.offset)
        batch.send(self._topics.dlq, key=record.key, value=raw, partition=record.partition, headers=headers)

    async def _skipped_before(self, record: SourceRecord) -> list[SourceRecord]:
        """The tripwire: records of the partition between the expected offset and
        this one, read again from the log (normally none)."""
        partition = record.partition
        expected = self._next_offset.get(partition)
        if expected is None:
            try:
                expected = await asyncio.to_thread(self._reader.committed, partition)
            except kafka.BrokerError as e:  # cannot check this start; the session gap check still runs
                logger.warning("committed offset of %s[%d] unknown: %s", self._topics.events, partition, e)
                expected = record.offset
        self._next_offset[partition] = max(expected, record.offset + 1)
        if record.offset <= expected:
            return []
        metrics.OFFSET_JUMPS.inc()
        found = await asyncio.to_thread(self._reader.read, partition, expected, record.offset - 1)
        logger.error(
            "offsets %d..%d of %s[%d] were never delivered by the consumer (a stream-processor bug); "
            "read them again: %d records",
            expected, record.offset - 1, self._topics.events, partition, len(found),
        )
        return [SourceRecord(key, raw, partition, offset, headers) for offset, key, raw, headers in found]

    async def _missing_seqs(self, touched: dict[bytes, tuple[SessionSequence, SourceRecord]]) -> list[SourceRecord]:
        """For each session left waiting on a seq, the records at the offsets where it must be."""
        found: list[SourceRecord] = []
        for key, (state, record) in list(touched.items()):
            gap = state.missing_range()
            if gap is None or self._repaired.get(key) == state.next_seq:
                continue
            try:
                reread = await asyncio.to_thread(self._reader.read, record.partition, gap[0], gap[1], key)
            except kafka.BrokerError as e:  # not read: retry_gaps tries again, even if no record of the session comes
                logger.warning("gap in %r: the re-read failed (%s); retrying later", key, e)
                self._unrepaired[key] = record.partition
                continue
            self._repaired[key] = state.next_seq
            if reread:
                logger.warning("gap in %r: re-read %d records from %s[%d]", key, len(reread), self._topics.events,
                               record.partition)
            found.extend(
                SourceRecord(k, raw, record.partition, offset, headers) for offset, k, raw, headers in reread
            )
        return found


def record_verifier(settings: TurnlogSettings) -> RecordVerifier | None:
    """The write-side admission's verifier (``turnlog/signing.py``), or None in open mode (no fleet keys).

    Raises:
        ConfigurationError: fleet keys without ``epoch_grant_key`` (no resumed epoch could be admitted).
    """
    if not settings.fleet_keys:
        logger.warning(
            "TURNLOG_FLEET_KEYS is empty: records are not authenticated, and any writer of %s can write, "
            "fence or take over any session (open mode; see docs/design.md, 'Write-side isolation')",
            settings.topics.events,
        )
        return None
    if settings.epoch_grant_key is None:
        raise ConfigurationError(
            "TURNLOG_FLEET_KEYS is set but TURNLOG_EPOCH_GRANT_KEY is not: the sequencer could not admit any "
            "resumed epoch"
        )
    return RecordVerifier(settings.fleet_key_values(), settings.epoch_grant_key.get_secret_value())


def build_sequencer(settings: TurnlogSettings) -> faust.App:
    """The sequencer app (consumer group ``settings.sequencer_group``)."""
    app = make_app(settings, settings.sequencer_group, commit_interval_seconds=COMMIT_INTERVAL_SECONDS)
    topics = settings.topics
    events = raw_topic(app, topics.events)
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
    # A batch's records are produced together and then awaited: waiting
    # longer for more only adds to each batch's two round trips.
    linger: dict[str, Any] = {"linger.ms": EMISSION_LINGER_MS}
    emissions = EmissionProducer(
        lambda: kafka.producer(
            settings,
            client_id=f"{settings.sequencer_group}-emissions",
            delivery_timeout_seconds=EMISSION_DELIVERY_TIMEOUT_SECONDS,
            **linger,
        )
    )
    sequencer = Sequencer(
        states=states.data,  # the store: the changelog is written by the Sequencer itself
        changelog=states.changelog_topic.get_topic_name(),
        emissions=emissions,
        reader=LogRangeReader(settings, topics.events, settings.sequencer_group),
        topics=topics,
        max_buffer=settings.reorder_buffer_size,
        verifier=record_verifier(settings),
    )

    # The agent's batches and the gap retries never interleave: both read and write session states.
    batch_lock = asyncio.Lock()

    @app.agent(events, name="sequence-events")
    async def sequence_events(stream: faust.StreamT[bytes]) -> None:
        # The agent gets a faust.Stream, which has take_events; faust types it as StreamT, which has not.
        async for batch in stream.take_events(BATCH_SIZE, within=BATCH_WAIT_SECONDS):  # type: ignore[attr-defined]
            records = [
                SourceRecord(e.key, e.value, e.message.partition, e.message.offset, e.message.headers) for e in batch
            ]
            try:
                async with batch_lock:
                    await sequencer.process(records)
            except EmissionFailed as e:
                # Nothing of the batch was stored or acked: a restart processes it again.
                logger.error("stopping: %s", e)
                await app.crash(e)
                return

    @app.timer(interval=GAP_RETRY_SECONDS)
    async def retry_gaps() -> None:
        if not sequencer.has_unrepaired_gaps or app.rebalancing or app.in_recovery:
            return  # never touch table state while Faust restores or reassigns it
        try:
            async with batch_lock:
                await sequencer.retry_gaps()
        except EmissionFailed as e:
            logger.error("stopping: %s", e)
            await app.crash(e)

    # faust types a receiver as taking any positional arguments; these take the ones their signal sends.
    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def forget_revoked(_app: Any, revoked: Any, **_: Any) -> None:
        sequencer.forget(tp.partition for tp in revoked if tp.topic == topics.events)
        await emissions.flush()

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def close_emissions(_app: Any, **_: Any) -> None:
        await emissions.close()

    return app
