"""The sequencer (Faust): orders, deduplicates and fences the raw event stream.

Consumes ``<prefix>.events``, keeps one :class:`SessionSequence` per session in
a changelog-backed table, emits ordered events to ``<prefix>.transcript`` on
the same partition, and routes rejects to ``<prefix>.dlq`` with the reason and
the original bytes (see ``turnlog.dlq`` for the headers).

Order of work for each batch of records (``stream.take_events``), in
:meth:`Sequencer.process`:

1. decide every record against the session states (pure: ``sequencing.py``);
2. send the emissions and rejects, and the new states to the table's
   changelog, in one Kafka transaction per events partition
   (``transactions.py``: a worker that lost the partition is fenced), and wait
   until each is committed; then set the states in the table;
3. Faust acks the batch's records and later commits their offsets.

So the stored state is never ahead of what the transcript holds (they are
committed together), and the committed offset never ahead of the stored
state: a crash before (2) is committed re-processes the batch from the old
state and re-emits the same events in the same order; a crash after it
re-processes against the new state, where they are duplicates (dropped by seq
downstream). With ``TURNLOG_SEQUENCER_TRANSACTIONS=false`` one idempotent
producer (``emitter.py``) sends the emissions, waits for their
acknowledgement, and only then sends the states: the same order, unfenced.

The changelog is written here rather than by Faust's ``Table.__setitem__``
(one aiokafka send per key, flushed only at Faust's commit): the records are
the ones Faust writes and restores (raw key, JSON value, the key's murmur2
partition), at a fraction of the cost, and acknowledged before the ack.

Bounded in bytes, whatever the events' sizes: a session's reorder buffer holds
events by position (``sequencing.py``), so its state record stays a few bytes
per buffered event and under ``max_state_bytes`` (buffered events past that go
to the DLQ); a batch first decides everything into an :class:`Outbox`, then
reads the released or rejected buffered events again from the log, then sends.
A record larger than the producer may send (``max_record_bytes``) or refused by
the client or the broker for what it is goes to the DLQ as a reference (its
bytes left out, the reason and source offset kept): one record never stops the
worker; only the broker's absence does (``EmissionFailed``, ``BrokerError``).

The group's committed offset is what the resume barrier waits on
(``turnlog/resume_barrier.py``): since Faust's recovery completion no longer drops
fetched records (``recovery.py``), it never passes an unprocessed record.
Two checks stay as tripwires: offset continuity per partition (a jump is an
error log and ``turnlog_sequencer_offset_jumps_total``; the skipped records
are read again so nothing is lost) and a session's seq gap (the offsets
where the missing seq must be are read again).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Coroutine, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any, NoReturn

import faust
import msgspec

from turnlog import kafka, metrics
from turnlog.dlq import dlq_headers, reason_class
from turnlog.faults import fault_point
from turnlog.kafka.partitioning import partition_for
from turnlog.kafka.record_headers import UnreadableHeaders
from turnlog.kafka.topic_specs import SEQUENCER_CHANGELOG_CONFIGS, SEQUENCER_TABLE
from turnlog.readiness import mark_not_ready
from turnlog.schemas import EventValidationError, decode_event
from turnlog.schemas.headers import EventType, event_type, peek_event_type, type_headers
from turnlog.settings import TopicNames, TurnlogSettings
from turnlog.signing import ProvenanceError, RecordVerifier, provenance_headers
from turnlog.stream_processors.admission import (
    admit,
    admit_open,
    authenticate,
    note_owner,
    open_mode_grant_key,
    record_verifier,
)
from turnlog.stream_processors.app import make_app, raw_topic
from turnlog.stream_processors.emitter import (
    MAX_RECORD_BYTES,
    MESSAGE_MAX_BYTES,
    Batch,
    EmissionFailed,
    EmissionProducer,
    Emissions,
    record_bytes,
)
from turnlog.stream_processors.log_ranges import LogRangeReader, LogRecord, offset_runs
from turnlog.stream_processors.outbox import Outbox, Outgoing
from turnlog.stream_processors.sequencing import DEFAULT_MAX_BUFFER_BYTES, Buffered, SessionSequence, sequence
from turnlog.stream_processors.transactions import PartitionTransactions, transactional_id
from turnlog.tracing import (
    NO_TRACING,
    TraceContext,
    TraceSpan,
    Tracing,
    consumer_attributes,
    context_from_headers,
    service_tracing,
)

__all__ = ["build_sequencer", "Sequencer", "SourceRecord", "TABLE_NAME", "BATCH_SIZE", "BATCH_WAIT_SECONDS"]

logger = logging.getLogger(__name__)
TABLE_NAME = SEQUENCER_TABLE
BATCH_SIZE = 1000
#: How long a batch gathers records (seconds). Each batch costs one Kafka transaction per events
#: partition it touches (~1.8 ms of broker CPU each, whatever its size), so a wider window buys
#: fewer, fuller transactions: at ~680 events/s, 15 ms against 5 ms took the broker from ~760
#: to ~620 us of CPU per event and turn-to-store p99 from ~360 to ~220 ms (docs/benchmarks.md).
BATCH_WAIT_SECONDS = 0.015
#: Faust commits the acked offsets this often (seconds); the resume barrier waits on them.
COMMIT_INTERVAL_SECONDS = 0.1
#: How long an emission waits for the broker before the worker stops (seconds). A broker may be
#: away for minutes: a batch waits through the outage (its records stay unacked) rather than
#: crash the worker when the broker comes back a little late (120 s crashed it after a 90 s outage
#: in CI, while the restarted broker was still starting).
EMISSION_DELIVERY_TIMEOUT_SECONDS = 600.0
EMISSION_LINGER_MS = 1
#: A transaction the broker aborts if it is not committed by then (seconds): above the emissions'
#: delivery timeout (librdkafka requires it), under the broker's ``transaction.max.timeout.ms`` (900 s).
TRANSACTION_TIMEOUT_SECONDS = EMISSION_DELIVERY_TIMEOUT_SECONDS + 60.0
#: How often gaps whose re-read failed are read again (seconds).
GAP_RETRY_SECONDS = 5.0
#: Largest session state record (bytes of its JSON): far under the broker's record limit
#: (``message.max.bytes``, ~1 MB). The worst state of the default settings (1,024 buffered
#: positions, the longest ids) is about 80 KB; buffered events past this go to the DLQ.
MAX_STATE_BYTES = 256 * 1024
#: Longest DLQ reason (UTF-8 bytes): a reason may quote a record's field names or sizes.
MAX_REASON_BYTES = 1024
#: Longest key a DLQ reference keeps (bytes); a longer one (no valid session id is) is left out.
MAX_REFERENCE_KEY_BYTES = 1024
#: Buffered events read again from the log share one read when their offsets are this close.
HELD_READ_STEP = 64
#: How long reading buffered events again waits through a broker outage (seconds), as emissions do.
HELD_READ_TIMEOUT_SECONDS = EMISSION_DELIVERY_TIMEOUT_SECONDS
HELD_READ_RETRY_SECONDS = 5.0
_JSON = msgspec.json.Encoder()
#: Bytes the turnlog-type header adds to a transcript record (the longest type's).
_TYPE_HEADER_BYTES = max(record_bytes(None, None, type_headers(kind)) for kind in EventType)


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

    Bounds (bytes): a session's reorder buffer holds at most ``max_buffer`` events and
    ``max_buffer_bytes`` of them; a state record at most ``max_state_bytes``; a record sent
    at most ``max_record_bytes`` (key, value and headers). ``held_read_timeout`` (seconds):
    how long reading buffered events again waits through a broker outage.

    ``tracing`` (``turnlog.tracing``): a record carrying a sampled ``traceparent`` gets a
    CONSUMER span, child of it, from its decision until its batch is delivered; the transcript
    record of that event carries the span's context on (when it fits under ``max_record_bytes``).
    """

    def __init__(
        self,
        *,
        states: MutableMapping[bytes, Any],
        changelog: str,
        emissions: Emissions,
        reader: LogRangeReader,
        topics: TopicNames,
        max_buffer: int,
        verifier: RecordVerifier | None = None,
        open_grant_key: bytes | None = None,
        partitions: int | None = None,
        max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
        max_state_bytes: int = MAX_STATE_BYTES,
        max_record_bytes: int = MAX_RECORD_BYTES,
        held_read_timeout: float = HELD_READ_TIMEOUT_SECONDS,
        tracing: Tracing = NO_TRACING,
        group: str | None = None,
    ) -> None:
        self._tracing = tracing
        self._group = group
        self._max_buffer_bytes = max_buffer_bytes
        self._max_state_bytes = max_state_bytes
        self._max_record_bytes = max_record_bytes
        self._held_read_timeout = held_read_timeout
        self._states = states
        self._verifier = verifier
        #: open mode (no verifier): the epoch grant key resumed epochs are checked with (admit_open)
        self._open_grant_key = open_grant_key
        #: the events topic's partition count: a record on another partition than its session's is refused
        self._partitions = partitions
        self._changelog = changelog
        self._emissions = emissions
        self._reader = reader
        self._topics = topics
        self._max_buffer = max_buffer
        self._next_offset: dict[int, int] = {}  # partition -> the offset its next record should have
        self._repaired: dict[bytes, int] = {}  # key -> the next_seq whose gap was already read again
        self._unrepaired: dict[bytes, int] = {}  # key -> partition: a gap whose re-read failed (retried by retry_gaps)
        self._held = HeldCounts()

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop positions of revoked partitions: another worker may take them."""
        revoked = set(partitions)
        for partition in revoked:
            self._next_offset.pop(partition, None)
        self._unrepaired = {key: p for key, p in self._unrepaired.items() if p not in revoked}
        self._held.forget(revoked)

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
        """Sequence one batch: decide, read released buffered events again, send, await the
        acks, then store the states. ``recheck`` (``{key: partition}``) adds sessions whose gap
        is read again. A record that cannot be sequenced or sent goes to the DLQ; nothing
        about one record raises.

        Raises:
            EmissionFailed: an emission was not delivered (the broker away past the delivery
                timeout, a fatal producer error); nothing of the batch was stored.
            BrokerError: the log could not be read again past ``held_read_timeout`` (buffered
                events to release, an offset jump); nothing of the batch was sent or stored.
        """
        outbox = Outbox()
        if not self._tracing.enabled:
            await self._process(outbox, records, recheck)
            return
        try:
            await self._process(outbox, records, recheck)
        except BaseException as e:
            for span in outbox.spans:
                span.fail(f"batch not delivered: {type(e).__name__}")
            raise
        finally:
            for span in outbox.spans:
                span.end()

    async def _process(
        self, outbox: Outbox, records: list[SourceRecord], recheck: dict[bytes, int] | None
    ) -> None:
        touched: dict[bytes, tuple[SessionSequence, SourceRecord]] = {}
        for key, partition in (recheck or {}).items():
            try:
                touched[key] = (SessionSequence.from_json(self._states.get(key)), SourceRecord(key, b"", partition, -1))
            except Exception:  # an unreadable state: the session's next record meets it in _decide
                logger.exception("state of %r unreadable; its gap is not read again now", key)
        for record in records:
            for skipped in await self._skipped_before(record):
                self._decide_one(outbox, touched, skipped)
            self._decide_one(outbox, touched, record)
        for skipped in await self._missing_seqs(touched):
            self._decide_one(outbox, touched, skipped)
        new_states = self._bounded_states(outbox, touched)
        await self._read_held(outbox)
        stored = {key: (encoded, touched[key][1].partition) for key, (_, encoded) in new_states.items()
                  if encoded is not None}
        if self._emissions.atomic:  # one transaction per partition: the states land with the emissions or not at all
            unstored = await self._deliver(outbox, stored)
        else:  # acks=all: the emissions are durable before the state moves
            await self._deliver(outbox)
            unstored = stored
        fault_point("sequencer.after_emit")
        if unstored:
            changelog = self._emissions.batch()
            for key, (encoded, partition) in unstored.items():
                changelog.send(self._changelog, key=key, value=encoded, partition=partition, token=key)
            for key, error in await changelog.delivered():
                # Kept in memory: after a restart the older stored state meets the session's next
                # record as a gap, and the gap re-read applies the records since.
                logger.error("state of %r not stored in %s: %s", key, self._changelog, error)
        self._states.update({key: value for key, (value, _) in new_states.items()})
        self._held.update((key, record.partition, len(state.buffer)) for key, (state, record) in touched.items())

    def _decide_one(
        self, outbox: Outbox, touched: dict[bytes, tuple[SessionSequence, SourceRecord]], record: SourceRecord
    ) -> None:
        """:meth:`_decide`, with every failure of one record sent to the DLQ: a record too large
        to be carried to the transcript is refused before it is decoded or buffered."""
        try:
            size = record_bytes(record.key, record.value) + _TYPE_HEADER_BYTES
            if size > self._max_record_bytes:
                self._reject(outbox, record, record.value, (
                    f"too large: the event would be a {size}-byte transcript record, over the"
                    f" {self._max_record_bytes} a record may have"
                ))
                return
            self._decide(outbox, touched, record)
        except Exception as e:  # a bug must not stop the pipeline; the record goes to the DLQ
            logger.exception("deciding %s[%d]@%d failed", self._topics.events, record.partition, record.offset)
            self._reject(outbox, record, record.value, f"internal: {type(e).__name__}")

    def _decide(
        self, batch: Outbox, touched: dict[bytes, tuple[SessionSequence, SourceRecord]], record: SourceRecord
    ) -> None:
        key, raw = record.key, record.value
        if isinstance(record.headers, UnreadableHeaders):  # refused alone, whatever the mode (fetching.py)
            self._reject(batch, record, raw, f"unreadable: {record.headers.reason}")
            return
        verified = None
        claimed: dict[str, bytes] = {}
        try:
            if self._verifier is not None:  # before decoding: an HMAC costs less than a decode
                verified = authenticate(self._verifier, key, raw, record.headers)
            else:  # open mode: what the record claims, unsigned (admit_open)
                claimed = provenance_headers(record.headers)
        except ProvenanceError as e:
            self._reject(batch, record, raw, f"unauthenticated: {e.reason}")
            return
        try:
            event = decode_event(raw)
        except EventValidationError as e:
            self._reject(batch, record, raw, f"invalid: {e.reason}")
            return
        if key != event.session_id.encode("utf-8"):
            self._reject(batch, record, raw, "invalid: record key is not the session_id")
            return
        home = partition_for(event.session_id, self._partitions) if self._partitions is not None else record.partition
        if record.partition != home:
            # Another partition's worker may hold this session: a record here would be sequenced apart from it.
            self._reject(batch, record, raw, (
                f"misrouted: {event.session_id} belongs on partition {home}, not {record.partition}"
            ))
            return
        assert key is not None
        try:
            state = touched[key][0] if key in touched else SessionSequence.from_json(self._states.get(key))
            if verified is not None and self._verifier is not None:
                refused = admit(verified, state, event, fleets=self._verifier.fleets)
            else:
                refused = admit_open(claimed, self._open_grant_key, state, event)
            if refused is not None:
                self._reject(batch, record, raw, refused)
                return
            decision = sequence(
                state, event, raw, record.offset, max_buffer=self._max_buffer, max_buffer_bytes=self._max_buffer_bytes
            )
            if verified is None:
                note_owner(state, event)
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
        trace = self._traced(batch, record, event, decision) if self._tracing.enabled else ()
        for out in decision.emit:
            # The turnlog-type header: this event's type; an event released from the gap buffer behind it is
            # peeked. The trace goes with this record's own event (a released one's context is not kept).
            buffered = isinstance(out, Buffered)
            offset, kind = (out.offset, None) if isinstance(out, Buffered) else (record.offset, event_type(event))
            batch.transcript(
                self._topics.transcript, key=key, value=out, partition=record.partition, source_offset=offset,
                kind=kind, trace=() if buffered else trace,
            )
        for held, reason in decision.dlq:
            self._reject(batch, record, held, reason)

    def _traced(self, batch: Outbox, record: SourceRecord, event: Any, decision: Any) -> tuple[tuple[str, bytes], ...]:
        """Start the CONSUMER span of ``record`` when its headers carry a sampled trace context
        (hostile headers are ignored: ``turnlog.tracing.context_from_headers``); returns the
        headers that carry the span on to its transcript record (none if untraced)."""
        parent = context_from_headers(record.headers)
        if parent is None or not parent.sampled:
            return ()
        try:
            span = self._start_span(record, event, decision, parent)
            if span is None:
                return ()
            batch.spans.append(span)
            return span.context.headers()
        except Exception as e:  # called after the session's state moved on: a failure here would lose the event
            logger.warning("tracing %s[%d]@%d failed (%s): left untraced", self._topics.events, record.partition,
                           record.offset, type(e).__name__)
            return ()

    def _start_span(self, record: SourceRecord, event: Any, decision: Any, parent: TraceContext) -> TraceSpan | None:
        return self._tracing.start(
            f"process {self._topics.events}", kind="consumer", parent=parent,
            attributes={
                **consumer_attributes(self._topics.events, record.partition, record.offset, self._group),
                "turnlog.session_id": event.session_id, "turnlog.seq": event.seq, "turnlog.epoch": event.epoch,
                "turnlog.event_type": event_type(event).value, "turnlog.emitted": len(decision.emit),
                "turnlog.duplicate": bool(decision.duplicate), "turnlog.gap_opened": bool(decision.gap_opened),
            },
        )

    def _reject(self, batch: Outbox, record: SourceRecord, raw: bytes | Buffered | None, reason: str) -> None:
        """Route ``raw`` (``record``'s value, or a buffered event of its session) to the DLQ."""
        reason = _bounded(reason, MAX_REASON_BYTES)
        offset = raw.offset if isinstance(raw, Buffered) else record.offset
        metrics.DLQ_ROUTED.labels("sequencer", reason_class(reason)).inc()
        logger.warning("DLQ %s[%d]@%d: %s", self._topics.events, record.partition, offset, reason)
        batch.dlq(self._topics.dlq, key=record.key, value=raw, partition=record.partition, source_offset=offset,
                  reason=reason)

    def _bounded_states(
        self, outbox: Outbox, touched: dict[bytes, tuple[SessionSequence, SourceRecord]]
    ) -> dict[bytes, tuple[dict[str, Any], bytes | None]]:
        """Each touched session's new state, as JSON and as its changelog record's value, at most
        ``max_state_bytes``: the highest buffered seqs go to the DLQ until it fits. (None: it
        does not fit even with nothing buffered; it is not written, see :meth:`process`.)"""
        states: dict[bytes, tuple[dict[str, Any], bytes | None]] = {}
        for key, (state, record) in touched.items():
            value = state.to_json()
            encoded = _JSON.encode(value)
            while len(encoded) > self._max_state_bytes and state.buffer:
                excess = len(encoded) - self._max_state_bytes
                while excess > 0 and state.buffer:
                    seq = max(state.buffer)
                    held = state.buffer.pop(seq)
                    excess -= len(_JSON.encode([seq, held.epoch, held.ends_session, held.offset, held.size]))
                    self._reject(outbox, record, held, (
                        f"overflow: the session's state would pass {self._max_state_bytes} bytes;"
                        f" buffered seq {seq} is dropped while waiting for seq {state.next_seq}"
                    ))
                value = state.to_json()
                encoded = _JSON.encode(value)
            if len(encoded) > self._max_state_bytes:
                logger.error("state of %r is %d bytes, over %d: not stored", key, len(encoded), self._max_state_bytes)
                states[key] = (value, None)
            else:
                states[key] = (value, encoded)
        return states

    async def _read_held(self, outbox: Outbox) -> None:
        """Read again from the log the bytes of the buffered events the batch releases or rejects
        (those buffered in an earlier batch): each is kept only if it is that event (session,
        seq, epoch, size); one not found stays without bytes and goes out as a reference.

        Raises:
            BrokerError: the log could not be read past ``held_read_timeout``.
        """
        wanted: dict[tuple[int, bytes | None], list[Buffered]] = {}
        for item, unread in outbox.unread():
            wanted.setdefault((item.partition, item.key), []).append(unread)
        for (partition, key), held in wanted.items():
            found: dict[int, bytes | None] = {}
            for first, last in offset_runs(sorted({h.offset for h in held}), HELD_READ_STEP):
                for offset, _, value, _ in await self._read_patiently(partition, first, last, key):
                    found[offset] = value
            for h in held:
                again = found.get(h.offset)
                if again is not None and _is_buffered_event(again, key, h):
                    h.raw = again
            lost = sorted(h.seq for h in held if h.raw is None)
            if lost:
                logger.error("buffered seqs %s of %r are not in %s[%d] any more", lost, key, self._topics.events,
                             partition)

    async def _read_patiently(self, partition: int, first: int, last: int, key: bytes | None) -> list[LogRecord]:
        """``reader.read``, tried again while the broker is away, up to ``held_read_timeout``.

        Raises:
            BrokerError: not read within ``held_read_timeout``, or not retriable.
        """
        deadline = time.monotonic() + self._held_read_timeout
        while True:
            try:
                return await asyncio.to_thread(self._reader.read, partition, first, last, key)
            except kafka.BrokerError as e:
                if not e.retriable or time.monotonic() + HELD_READ_RETRY_SECONDS > deadline:
                    raise
                logger.warning("reading buffered events of %r again failed (%s); trying again", key, e)
                await asyncio.sleep(HELD_READ_RETRY_SECONDS)

    async def _deliver(
        self, outbox: Outbox, states: dict[bytes, tuple[bytes, int]] | None = None
    ) -> dict[bytes, tuple[bytes, int]]:
        """Send the outbox in order, and after it ``states`` (``{key: (state JSON, partition)}``,
        to the changelog), and wait for the acks. A record refused for what it is is sent
        again alone (the broker refuses a whole record batch, or the whole transaction, for one
        of its records, so the others land after later records of their partition: the sink
        orders by seq); one refused alone goes to the DLQ as a reference. Returns the states
        not stored with the batch (their transaction was refused for a record), to be sent
        after it.

        Raises:
            EmissionFailed: a record was not delivered for another reason, or even its
                reference was refused (the DLQ topic takes no record of a few hundred bytes).
        """
        batch = self._emissions.batch()
        for index in range(len(outbox.items)):
            self._send(batch, outbox, index)
        for key, (encoded, partition) in (states or {}).items():
            batch.send(self._changelog, key=key, value=encoded, partition=partition, token=key)
        refusals = await batch.delivered()
        unstored = {token: states[token] for token, _ in refusals if isinstance(token, bytes) and states}
        refused = sorted(((token, error) for token, error in refusals if isinstance(token, int)), key=lambda r: r[0])
        for index, _ in refused:
            error = await self._send_alone(outbox, index)
            if error is None:
                continue
            item = outbox.items[index]
            if item.reference:
                raise EmissionFailed(error)
            logger.error("%s refused a record of %s[%d]@%d: %s", item.topic, self._topics.events, item.partition,
                         item.source_offset, error)
            outbox.items[index] = self._reference(item, "refused", f"the broker refused it ({error})")
            error = await self._send_alone(outbox, index)
            if error is not None:
                raise EmissionFailed(error)
        return unstored

    async def _send_alone(self, outbox: Outbox, index: int) -> kafka.BrokerError | None:
        """Send ``outbox.items[index]`` in a batch of its own; the error if it is refused for what it is.

        Raises:
            EmissionFailed: it was not delivered for another reason.
        """
        alone = self._emissions.batch()
        self._send(alone, outbox, index)
        refused = await alone.delivered()
        return refused[0][1] if refused else None

    def _send(self, batch: Batch, outbox: Outbox, index: int) -> None:
        """Send ``outbox.items[index]`` (token: ``index``); one that cannot be sent as it is
        (its bytes gone from the log, or too large) is replaced by its DLQ reference first."""
        item = outbox.items[index]
        value = item.value
        if isinstance(value, Buffered):
            if value.raw is None:
                where = f"{self._topics.events}[{item.partition}]@{value.offset}"
                item = outbox.items[index] = self._reference(
                    item, "lost", f"buffered seq {value.seq} is not in {where} any more"
                )
            value = value.raw or b""
        if item.reason is None:
            headers = type_headers(item.kind if item.kind is not None else peek_event_type(value))
            if item.trace:  # the trace goes on only where the event still fits
                traced = [*(headers or ()), *item.trace]
                if record_bytes(item.key, value, traced) <= self._max_record_bytes:
                    headers = traced
        else:
            headers = dlq_headers(item.reason, self._topics.events, item.partition, item.source_offset)
        size = record_bytes(item.key, value, headers)
        if size > self._max_record_bytes:
            what = f"the record would be {size} bytes, over the {self._max_record_bytes} a record may have"
            item = outbox.items[index] = self._reference(item, "too large", what)
            value = b""
            headers = dlq_headers(item.reason or "", self._topics.events, item.partition, item.source_offset)
        batch.send(item.topic, key=item.key, value=value, partition=item.partition, headers=headers, token=index)

    def _reference(self, item: Outgoing, why: str, what: str) -> Outgoing:
        """The DLQ record that stands for ``item`` when it cannot be sent: its bytes left out
        (an empty value; the source offset names where they are). The reason: a DLQ record's
        own, or for a transcript record ``why`` (its class), each with ``what`` happened."""
        if item.reason is not None:
            reason = f"{item.reason}; its bytes are left out: {what}"
        else:
            reason = f"{why}: {what}; the event is left out of the transcript"
            # A DLQ record's own reason was counted at its rejection.
            metrics.DLQ_ROUTED.labels("sequencer", reason_class(reason)).inc()
        reason = _bounded(reason, MAX_REASON_BYTES)
        logger.warning("DLQ %s[%d]@%d: %s", self._topics.events, item.partition, item.source_offset, reason)
        key = item.key if item.key is None or len(item.key) <= MAX_REFERENCE_KEY_BYTES else None
        return Outgoing(self._topics.dlq, key, b"", item.partition, item.source_offset, reason=reason, reference=True)

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


class HeldCounts:
    """The running counts behind ``turnlog_sequencer_reorder_buffer_events`` and
    ``turnlog_sequencer_gaps_open``: per session with a non-empty reorder buffer on this
    worker's partitions, its partition and how many events it holds.

    Updated from the sessions each batch touched, after their states are stored (no scan of
    the table); a revoked partition's sessions are dropped. A session restored with a buffer
    after an assignment is counted from the first batch that touches it again (its next record
    or its gap's re-read).
    """

    def __init__(self) -> None:
        self._held: dict[bytes, tuple[int, int]] = {}  # key -> (partition, events buffered)
        self._events = 0

    def update(self, sessions: Iterable[tuple[bytes, int, int]]) -> None:
        """``(key, partition, events buffered now)`` of each session a batch touched; then publish."""
        for key, partition, buffered in sessions:
            old = self._held.pop(key, None)
            if old is not None:
                self._events -= old[1]
            if buffered:
                self._held[key] = (partition, buffered)
                self._events += buffered
        self._publish()

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop the sessions of revoked ``partitions`` (their buffers go with the partitions); then publish."""
        revoked = set(partitions)
        for key, (partition, buffered) in list(self._held.items()):
            if partition in revoked:
                del self._held[key]
                self._events -= buffered
        self._publish()

    def _publish(self) -> None:
        metrics.REORDER_BUFFER_EVENTS.set(self._events)
        metrics.GAPS_OPEN.set(len(self._held))


def _bounded(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8 (on a character boundary, marked with "…")."""
    encoded = text.encode("utf-8")
    if len(encoded) <= max_bytes:
        return text
    return encoded[: max_bytes - 3].decode("utf-8", "ignore") + "…"


def _is_buffered_event(value: bytes, key: bytes | None, held: Buffered) -> bool:
    """Whether ``value``, read again from the log at ``held.offset``, is the event buffered there."""
    try:
        event = decode_event(value)
    except EventValidationError:
        return False
    return (len(value), event.seq, event.epoch, event.session_id.encode("utf-8")) == (
        held.size, held.seq, held.epoch, key
    )


#: The sequencer's exit status when it stops with a batch it could not write (the broker away
#: past the delivery timeout, or fenced by another worker): a supervisor restarts it.
EXIT_BATCH_NOT_WRITTEN = 75  # EX_TEMPFAIL


def _stop_uncommitted(settings: TurnlogSettings, error: BaseException) -> NoReturn:
    """Exit the process at once, without Faust's shutdown. Faust's ``take_events`` acks a batch's
    events when its generator is closed, whatever the agent did with them, and a graceful stop
    commits what is acked: the offsets of a batch whose transaction was never committed would
    pass its records, and a restart would never read them again. The next owner of the
    partitions (or this worker, restarted) reads them from the last committed offset; open
    transactions are aborted by its fence or by the broker."""
    # Turnlog's own errors name partitions and offsets; another's message may quote a record.
    cause = error if isinstance(error, (EmissionFailed, kafka.BrokerError)) else type(error).__name__
    logger.error("stopping without committing the batch's offsets: %s", cause)
    mark_not_ready(settings.ready_file)
    logging.shutdown()
    os._exit(EXIT_BATCH_NOT_WRITTEN)


async def _locked(lock: asyncio.Lock, work: Awaitable[None]) -> None:
    async with lock:
        await work


async def _whole_or_stop(settings: TurnlogSettings, work: Coroutine[Any, Any, None]) -> None:
    """Run one batch's ``work`` to its end, or stop the worker uncommitted (:func:`_stop_uncommitted`).

    Any failure of the batch stops the worker: the broker away past the delivery timeout, a
    fence (:class:`EmissionFailed`, ``BrokerError``), or anything else the batch raised. A
    stopping Faust cancels its agent mid-batch; the batch is then finished first (its
    transaction committed or failed), since Faust acks the batch's events as the cancellation
    closes ``take_events`` and commits them as it stops.
    """
    batch = asyncio.ensure_future(work)
    try:
        await asyncio.shield(batch)
    except asyncio.CancelledError:
        try:
            await batch  # at once if it is done
        except BaseException as e:  # noqa: BLE001 - cancelled again, or the batch failed: not acked
            _stop_uncommitted(settings, e)
        raise
    except BaseException as e:  # noqa: BLE001 - whatever failed the batch, nothing of it may be acked
        _stop_uncommitted(settings, e)


def build_sequencer(settings: TurnlogSettings) -> faust.App:
    """The sequencer app (consumer group ``settings.sequencer_group``).

    Raises:
        ConfigurationError: ``settings.tracing`` is on without ``turnlog[otel]`` installed.
    """
    tracing = service_tracing(settings, "sequencer")
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
        # As turnlog topics create makes it (turnlog.kafka.topic_specs); Faust adds the replication when it declares it.
        extra_topic_configs=dict(SEQUENCER_CHANGELOG_CONFIGS),
        help="SessionSequence per session id (JSON).",
    )
    # A batch's records are produced together and then awaited: waiting
    # longer for more only adds to each batch's two round trips.
    # message.max.bytes explicit: the record limit the sequencer checks its records against.
    linger: dict[str, Any] = {"linger.ms": EMISSION_LINGER_MS, "message.max.bytes": MESSAGE_MAX_BYTES}
    emissions: Emissions
    if settings.sequencer_transactions:
        def transactional(partition: int) -> Any:
            transaction: dict[str, Any] = {
                "transactional.id": transactional_id(settings.sequencer_group, topics.events, partition),
                "transaction.timeout.ms": int(TRANSACTION_TIMEOUT_SECONDS * 1000),
            }
            return kafka.producer(
                settings,
                client_id=f"{settings.sequencer_group}-emissions-{partition}",
                delivery_timeout_seconds=EMISSION_DELIVERY_TIMEOUT_SECONDS,
                **linger,
                **transaction,
            )

        emissions = PartitionTransactions(transactional, timeout=EMISSION_DELIVERY_TIMEOUT_SECONDS)
    else:
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
        max_buffer_bytes=settings.reorder_buffer_bytes,
        verifier=record_verifier(settings),
        open_grant_key=open_mode_grant_key(settings),
        partitions=settings.partitions,
        tracing=tracing,
        group=settings.sequencer_group,
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
            await _whole_or_stop(settings, _locked(batch_lock, sequencer.process(records)))

    @app.timer(interval=GAP_RETRY_SECONDS)
    async def retry_gaps() -> None:
        if not sequencer.has_unrepaired_gaps or app.rebalancing or app.in_recovery:
            return  # never touch table state while Faust restores or reassigns it
        await _whole_or_stop(settings, _locked(batch_lock, sequencer.retry_gaps()))

    # faust types a receiver as taking any positional arguments; these take the ones their signal sends.
    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def forget_revoked(_app: Any, revoked: Any, **_: Any) -> None:
        partitions = [tp.partition for tp in revoked if tp.topic == topics.events]
        sequencer.forget(partitions)
        await emissions.flush()
        if isinstance(emissions, PartitionTransactions):
            async with batch_lock:  # no transaction of theirs in flight
                await emissions.release(partitions)

    if isinstance(emissions, PartitionTransactions):
        fenced = emissions

        async def fence_assigned(assigned: Any) -> None:
            # Before the states are restored: the previous owner commits nothing past the restore's end.
            await fenced.fence(tp.partition for tp in assigned if tp.topic == topics.events)

        app.before_restore = fence_assigned

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def close_emissions(_app: Any, **_: Any) -> None:
        await emissions.close()
        await asyncio.to_thread(tracing.flush)

    return app
