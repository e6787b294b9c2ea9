"""The sink service: consume ``<prefix>.transcript`` and apply batches to the store.

Per batch (at most ``sink_batch_size`` records; each poll waits at most
``sink_batch_wait_seconds``; a batch of partials only waits up to
``sink_partial_wait_seconds`` for a completed turn to share its commit): one
database transaction writes the rows and the next offsets
(``SqlStore.apply_batch``). Offsets are never committed to Kafka; on partition
assignment the consumer seeks to the offsets in ``sink_offsets``,
so a crash at any point replays only what the store does not hold yet.

A database outage is retried with capped exponential backoff (the same batch,
until it commits or the service is asked to stop). Between tries the consumer
pauses its partitions and keeps polling, so it stays in its consumer group
(heartbeats, ``max.poll.interval.ms``) however long the outage lasts; once the
batch commits it seeks every assigned partition back to the stored offsets
and resumes them (records polled while paused are read again).

A record that fails to decode or to plan, in any way, is refused by the
writer alone (``sinks/batch.py``, ``plan_each``) and goes to ``<prefix>.dlq``
(reason ``invalid: ...``) before the batch's offsets move past it. A batch the
database refuses for good (a data or integrity error) is applied again record
by record; a record refused on its own goes to ``<prefix>.dlq`` with the reason
and its original bytes, and only then is its offset skipped, so one bad record
never stops the pipeline or takes other sessions' rows with it. Nothing here
decodes a record: the batching reads its type from the ``turnlog-type`` header,
or peeks it (``peek_event_type``, which answers None for anything undecodable).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from sqlalchemy.engine import Connection
from tenacity import (
    RetryCallState,
    Retrying,
    retry,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_fixed,
)

from turnlog import kafka, metrics
from turnlog.crypto.config import event_opener
from turnlog.crypto.ledger_signatures import ledger_verifier
from turnlog.dlq import bounded_reason, dlq_headers, reason_class
from turnlog.faults import fault_point
from turnlog.readiness import mark_not_ready, mark_ready
from turnlog.schemas import EventType
from turnlog.schemas.erasure import Erasure
from turnlog.schemas.headers import Headers, record_event_type
from turnlog.settings import TurnlogSettings
from turnlog.sinks.base import BatchResult, BatchWriter, SqlStore, report_finalized
from turnlog.sinks.batch import RejectedMessage, WriteResult, plan_each
from turnlog.sinks.driver_errors import store_errors
from turnlog.sinks.erasure_ledger import ErasureDuties
from turnlog.sinks.exceptions import (
    RecordRejectedError,
    SinkFencedError,
    StoreAheadOfLogError,
    StoreError,
    StoreUnavailableError,
)
from turnlog.sinks.finalization import report_turns_stored
from turnlog.sinks.offsets import offsets_past_end
from turnlog.sinks.source_records import SourceMessage
from turnlog.tracing import (
    TraceContext,
    TraceSpan,
    batch_scope,
    batch_span,
    consumer_attributes,
    context_from_headers,
    ended_on_failure,
    service_tracing,
)

__all__ = ["SinkService"]

logger = logging.getLogger(__name__)
DLQ_FLUSH_TIMEOUT_SECONDS = 30.0
#: How long the end offset of an assigned partition is waited for (seconds).
END_OFFSET_TIMEOUT_SECONDS = 5.0
#: Lookups of the end offsets before stored offsets past them stop the sink, and the wait between them (seconds).
END_OFFSET_ATTEMPTS = 3
END_OFFSET_RETRY_SECONDS = 1.0


#: How a projection forgets the sessions of erasure ledger records, in the batch's transaction; it
#: returns the erasures it refused (they name another fleet than the stored session's), or None.
Forget = Callable[[Connection, list[Erasure]], Collection[Erasure] | None]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _is_partial(headers: Headers, value: bytes | None) -> bool:
    """Whether a transcript record is a ``turn.partial``: its ``turnlog-type`` header
    (set by the sequencer) says so, or, without the header (older records), the
    ``type`` member of its value. Nothing else of the record is decoded here."""
    return record_event_type(headers, value) is EventType.TURN_PARTIAL


def _service_of(state: RetryCallState) -> SinkService:
    # tenacity passes the bound method's arguments; ``self`` comes first.
    return state.args[0]


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    logger.warning("store unavailable, retrying (attempt %d): %s", state.attempt_number, error)


# Retry while the store is unavailable, until it answers or the service stops
# (sleeping: for calls made inside a consumer callback, where polling is not allowed).
_while_store_unavailable = retry(
    retry=retry_if_exception_type(StoreUnavailableError),
    wait=wait_exponential(multiplier=0.2, max=5.0),
    stop=lambda state: _service_of(state).stopping.is_set(),
    before_sleep=_log_retry,
    reraise=True,
)


class SinkService:
    """Consumes the transcript topic and applies it to the store, one transaction per batch.

    By default it is the transcript sink (consumer group ``settings.sink_group``,
    rows from ``store.write_transcript``). Another projection of the transcript
    (the analytics one) passes its own ``consumer_group`` and ``write``; it gets
    the same batching, offsets-in-transaction, retries and dead-lettering.
    ``on_batch`` (optional) is called after each committed batch with its result.

    Traces (``settings.tracing``, ``turnlog.tracing``): a batch holding records with a sampled
    ``traceparent`` gets one CONSUMER span, linked to each such record's context (links, not a
    parent: one batch serves many turns; at most ``MAX_LINKS``), with the transaction's commit
    as an event and a ``finalize`` child span per session finalized in it.

    With ``settings.ready_file`` set, it writes that file as ``component``
    (:mod:`turnlog.readiness`) once the consumer has an assignment, seeked to the
    stored offsets (an empty one too: a member with no partition is in the group
    and consuming), removes it when the assignment is revoked, and at the end of
    :meth:`run`.
    """

    stopping: threading.Event  # declared for mypy: _while_store_unavailable's stop reads it

    def __init__(
        self,
        settings: TurnlogSettings,
        store: SqlStore,
        *,
        consumer_group: str | None = None,
        write: BatchWriter | None = None,
        consumer_config: Mapping[str, Any] | None = None,
        on_batch: Callable[[BatchResult], None] | None = None,
        component: str = "sink",
        forget: Forget | None = None,
    ) -> None:
        self.settings = settings
        self.component = component
        self.store = store
        self.consumer_group = consumer_group or settings.sink_group
        if write is None and store.transcript.opener is None:
            store.transcript.opener = event_opener(settings)  # KeyMaterialError: refuse to start
        # The erasure ledger is consumed beside the transcript: each projection forgets its own rows
        # (the transcript sink: the session's events, turns and row) in the batch's transaction.
        self._forget: Forget = forget or (lambda conn, ledger: store.erasures.apply(conn, ledger, _utcnow()).refused)
        self._ledger = ledger_verifier(settings)  # ConfigurationError: a malformed issuer key refuses the start
        self._write: BatchWriter = self._with_ledger(write or store.write_transcript)
        # The transcript sink also publishes pending erasures and runs the retention sweep.
        self._duties = ErasureDuties(settings, store) if write is None else None
        # Connection and group.id come from the Kafka layer (kafka.consumer); these are this service's own.
        self._config = {
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            # A SIGKILLed sink holds its partitions until its session times out.
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 2_000,
            "max.poll.interval.ms": int(settings.sink_max_poll_interval_seconds * 1000),
            **(consumer_config or {}),
        }
        self._on_batch = on_batch
        self._dlq: Producer | None = None
        self.stopping = threading.Event()
        self._tracing = service_tracing(settings, component)  # ConfigurationError: on without turnlog[otel]
        self._consumer: Consumer | None = None
        # The fencing tokens claimed for the assigned partitions (sinks/offsets.py); None outside run().
        self._fences: dict[tuple[str, int], int] | None = None
        self._paused = False  # partitions paused while waiting out a store outage
        # The batch's retries wait inside the group (see _wait_in_group).
        self._in_group = Retrying(
            retry=retry_if_exception_type(StoreUnavailableError),
            wait=wait_exponential(multiplier=0.2, max=5.0),
            stop=lambda _: self.stopping.is_set(),
            before_sleep=_log_retry,
            sleep=self._wait_in_group,
            reraise=True,
        )

    def run(self) -> None:
        """Consume and apply until :attr:`stopping` is set."""
        if self._duties is not None:
            self._duties.warn_if_log_outlives_policy()
            self._duties.warn_if_unsigned()
        consumer = kafka.consumer(self.settings, group_id=self.consumer_group, **self._config)
        self._consumer = consumer
        self._fences = {}
        ledger_topic = self.settings.topics.erasures
        consumer.subscribe([self.settings.topics.transcript, ledger_topic],
                           on_assign=self._seek_to_stored, on_revoke=self._revoked)
        batch: list[SourceMessage] = []
        traced: list[tuple[SourceMessage, TraceContext, bool]] = []  # (record, its context, is session.ended)
        boundary = False  # the batch holds something other than a partial
        first_at = 0.0
        try:
            while not self.stopping.is_set():
                if self._duties is not None:
                    self._duties.run_if_due()
                records = consumer.consume(self.settings.sink_batch_size - len(batch),
                                           self.settings.sink_batch_wait_seconds)
                for record in records:
                    error = record.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            logger.warning("consumer: %s", error.str())
                        continue
                    value = record.value()
                    if not batch:
                        first_at = time.monotonic()
                    headers = record.headers()
                    boundary = boundary or not _is_partial(headers, value)
                    # Set on every record without an error (a None value would be a tombstone: never written).
                    topic = cast(str, record.topic())
                    message = SourceMessage(topic, cast(int, record.partition()), cast(int, record.offset()),
                                            cast(bytes, value), record.key(),
                                            _header_pairs(headers) if topic == ledger_topic else None)
                    batch.append(message)
                    if self._tracing.enabled:
                        context = context_from_headers(headers)
                        if context is not None and context.sampled:
                            ended = record_event_type(headers, value) is EventType.SESSION_ENDED
                            traced.append((message, context, ended))
                if not batch:
                    continue
                # Completed turns and session events are written at once; partials alone
                # wait (up to sink_partial_wait_seconds) to share the next commit: they are
                # durable in Kafka already, and this keeps commits per turn <= 1 at low load.
                full = len(batch) >= self.settings.sink_batch_size
                if full or boundary or time.monotonic() - first_at >= self.settings.sink_partial_wait_seconds:
                    fault_point("sink.after_poll")
                    try:
                        result = self.apply(batch, traced)
                    except SinkFencedError as e:
                        # A zombie: the group moved partitions while this sink was frozen or cut off.
                        # Nothing was written; the other partitions of the batch are read again from
                        # the store's offsets, the fenced ones are revoked at the next rebalance.
                        logger.warning("fenced, dropped a batch of %d records: %s", len(batch), e)
                        metrics.SINK_FENCED_BATCHES.inc()
                        batch, traced, boundary = [], [], False
                        self._seek_back(consumer)
                        continue
                    batch, traced, boundary = [], [], False
                    if self._paused:
                        self._seek_back(consumer)
                    if self._on_batch is not None:
                        self._on_batch(result)
        finally:
            self._consumer = None
            self._fences = None
            consumer.close()
            mark_not_ready(self.settings.ready_file)
            if self._dlq is not None:
                self._dlq.flush(DLQ_FLUSH_TIMEOUT_SECONDS)
            if self._duties is not None:
                self._duties.close()
            self._tracing.flush()

    def _verified_erasure(self, message: SourceMessage) -> Erasure:
        """The erasure a ledger record names, once its signature is verified.

        Raises:
            EventValidationError: not an erasure record, or one no trusted issuer signed (the
                latter's reason is ``unauthenticated: ...`` in the DLQ: see :func:`plan_each`).
        """
        return self._ledger.read(message.key, message.value, message.headers).erasure

    def _with_ledger(self, write: BatchWriter) -> BatchWriter:
        """``write`` for the transcript's records, after the batch's erasure ledger records are
        applied (``forget``) in the same transaction; an unreadable ledger record is rejected
        (the DLQ) like any record."""
        ledger_topic = self.settings.topics.erasures

        def write_with_ledger(conn: Connection, messages: Sequence[SourceMessage]) -> WriteResult:
            ledger = [m for m in messages if m.topic == ledger_topic]
            if not ledger:
                return write(conn, messages)
            rejected: list[RejectedMessage] = []
            planned = list(plan_each(ledger, self._verified_erasure, rejected))
            if planned:
                refused = self._forget(conn, [erasure for _, erasure in planned]) or ()
                rejected.extend(
                    RejectedMessage(m, "the erasure names another fleet than the stored session's", "foreign fleet")
                    for m, erasure in planned if erasure in refused
                )
                fault_point("sink.after_forget")
                metrics.ERASURES_APPLIED.labels(component=self.component).inc(len(planned) - len(refused))
            result = write(conn, [m for m in messages if m.topic != ledger_topic])
            return dataclasses.replace(result, rejected=[*rejected, *result.rejected])

        return write_with_ledger

    def apply(
        self, batch: list[SourceMessage], traced: Sequence[tuple[SourceMessage, TraceContext, bool]] = ()
    ) -> BatchResult:
        """Apply one batch (retrying while the store is down); dead-letter records the store refuses.
        ``traced``: its records that carry a sampled trace context (the batch span links to them)."""
        span = self._batch_span(batch, traced) if traced else None
        ended = {m.key.decode("utf-8", "replace"): context for m, context, is_end in traced if is_end and m.key}
        with ended_on_failure(span), metrics.SINK_BATCH_SECONDS.time(), batch_scope(self._tracing, span, ended):
            result = self._apply_or_split(batch)
        if span is not None:
            span.set({"turnlog.applied": result.applied, "turnlog.stale": result.stale,
                      "turnlog.rejected": result.rejected})
            span.end()
        if result.stale:
            logger.info("skipped %d records below the stored offsets (another sink wrote them)", result.stale)
        metrics.SINK_RECORDS.labels("applied").inc(result.applied)
        metrics.SINK_RECORDS.labels("stale").inc(result.stale)
        metrics.SINK_RECORDS.labels("rejected").inc(result.rejected)
        return result

    def _batch_span(
        self, batch: list[SourceMessage], traced: Sequence[tuple[SourceMessage, TraceContext, bool]]
    ) -> TraceSpan | None:
        first = batch[0]
        try:
            return self._tracing.start(
                f"process {self.settings.topics.transcript}", kind="consumer",
                links=(context for _, context, _ in traced),
                attributes={
                    **consumer_attributes(first.topic, first.partition, group=self.consumer_group),
                    "messaging.batch.message_count": len(batch), "turnlog.traced_records": len(traced),
                },
            )
        except Exception as e:  # tracing must never stop the sink: the batch is applied untraced
            logger.warning("tracing a batch of %s[%d]@%d failed (%s): applied untraced", first.topic,
                           first.partition, first.offset, type(e).__name__)
            return None

    def _apply_or_split(self, batch: list[SourceMessage]) -> BatchResult:
        try:
            return self._apply_batch(batch)
        except RecordRejectedError as e:
            logger.warning("batch of %d refused (%s); applying record by record", len(batch), e)
        applied = stale = rejected = 0
        for message in batch:
            try:
                result = self._apply_batch([message])
                applied, stale = applied + result.applied, stale + result.stale
            except RecordRejectedError as e:
                self._dead_letter(message, f"sink: {e}")
                self._skip(message)
                rejected += 1
        return BatchResult(applied=applied, stale=stale, rejected=rejected)

    def _seek_to_stored(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Claim the assigned partitions (their fencing tokens: a sink that had them before
        writes nothing more) and start each at the store's offset.

        Raises:
            StoreAheadOfLogError: a stored offset is past the partition's end (the topic was recreated).
        """
        stored, self._fences = self._claim([(tp.topic, tp.partition) for tp in partitions])
        # Asked again before giving up: a broker that has just restarted may not have its end offsets yet.
        for attempt in Retrying(
            retry=retry_if_exception_type(StoreAheadOfLogError),
            stop=stop_after_attempt(END_OFFSET_ATTEMPTS),
            wait=wait_fixed(END_OFFSET_RETRY_SECONDS),
            reraise=True,
        ):
            with attempt:
                ahead = offsets_past_end(stored, self._end_offsets(consumer, list(stored)))
                if ahead:
                    raise StoreAheadOfLogError(self.consumer_group, ahead)
        for tp in partitions:
            tp.offset = stored.get((tp.topic, tp.partition), OFFSET_BEGINNING)
        logger.info("assigned %s", ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in partitions))
        # librdkafka keeps a partition's pause across assignments: a partition paused by
        # _wait_in_group and revoked before _seek_back resumed it (a rebalance, or this sink's
        # session lost, during a store retry) would come back paused and never be read again.
        # Resumed before the assign: a resume after it could outdate the assign's start offsets.
        consumer.resume(partitions)
        consumer.assign(partitions)
        mark_ready(self.settings.ready_file, self.component)

    @staticmethod
    def _end_offsets(consumer: Consumer, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The partitions' end offsets; a partition the broker does not answer for is left out
        (not judged: the check must not stop a sink the broker is merely slow for)."""
        ends: dict[tuple[str, int], int] = {}
        for topic, partition in partitions:
            try:
                _low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=END_OFFSET_TIMEOUT_SECONDS, cached=False
                )
            except KafkaException as e:
                logger.warning("end offset of %s[%d] unknown (%s): not checked against the store", topic, partition, e)
                continue
            ends[(topic, partition)] = high
        return ends

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """The assignment is revoked (a rebalance, or leaving the group): not ready until the next one."""
        if self._fences is not None:
            for tp in partitions:
                self._fences.pop((tp.topic, tp.partition), None)
        mark_not_ready(self.settings.ready_file)

    @_while_store_unavailable
    def _stored_offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        with store_errors(), self.store.engine.connect() as conn:
            return self.store.stored_offsets(conn, self.consumer_group, partitions)

    @_while_store_unavailable
    def _claim(
        self, partitions: list[tuple[str, int]]
    ) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        """Claim ``partitions`` and read their offsets, in one transaction: ``(offsets, fences)``."""
        with store_errors(), self.store.engine.begin() as conn:
            fences = self.store.claim_partitions(conn, self.consumer_group, partitions)
            return self.store.stored_offsets(conn, self.consumer_group, partitions), fences

    def _wait_in_group(self, seconds: float) -> None:
        """Wait ``seconds`` between store retries without leaving the consumer group:
        the assigned partitions are paused and the consumer keeps polling (heartbeats,
        rebalances). Nothing is delivered from a paused partition; a record polled
        before the pause took effect is dropped here and read again after :meth:`_seek_back`."""
        consumer = self._consumer
        if consumer is None:  # apply() called outside run() (replay)
            time.sleep(seconds)
            return
        assigned = consumer.assignment()
        if assigned:
            consumer.pause(assigned)
        self._paused = True
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and not self.stopping.is_set():
            consumer.poll(min(left, 0.5))

    def _seek_back(self, consumer: Consumer) -> None:
        """After an outage: every assigned partition back to its stored offset, then resumed
        (one revoked meanwhile is resumed when it is assigned again: :meth:`_seek_to_stored`)."""
        assigned = consumer.assignment()
        stored = self._stored_offsets([(tp.topic, tp.partition) for tp in assigned])
        for tp in assigned:
            consumer.seek(TopicPartition(tp.topic, tp.partition,
                                         stored.get((tp.topic, tp.partition), OFFSET_BEGINNING)))
        consumer.resume(assigned)
        self._paused = False
        logger.info("store back: resumed %d partitions at the stored offsets", len(assigned))

    def _apply_batch(self, batch: list[SourceMessage]) -> BatchResult:
        return self._in_group(self._apply_batch_once, batch)

    def _apply_batch_once(self, batch: list[SourceMessage]) -> BatchResult:
        with store_errors(), self.store.engine.begin() as conn:
            result = self.store.offsets.apply_tracked(
                conn, self.consumer_group, batch, self._write, on_rejected=self._dead_letter, fences=self._fences
            )
            fault_point("sink.after_write")
        span = batch_span()
        if span is not None:
            span.event("commit", {"turnlog.records": len(batch), "turnlog.finalized": len(result.finalized)})
        fault_point("sink.after_commit")
        report_finalized(result.finalized, result.ended_at)  # finalized in the batch's transaction, now committed
        report_turns_stored(result.turns_emitted_at)
        return result

    def _skip(self, message: SourceMessage) -> None:
        self._in_group(self._skip_once, message)

    def _skip_once(self, message: SourceMessage) -> None:
        with store_errors(), self.store.engine.begin() as conn:
            self.store.skip_records(conn, self.consumer_group, [message], fences=self._fences)

    def _dead_letter(self, message: SourceMessage, reason: str) -> None:
        """Produce ``message`` to the DLQ and wait for the ack, before its offset is skipped."""
        reason = bounded_reason(reason)  # it may quote a value of the record
        if self._dlq is None:
            self._dlq = kafka.producer(self.settings, client_id=f"{self.consumer_group}-dlq")
        logger.error("DLQ %s[%d]@%d: %s", message.topic, message.partition, message.offset, reason)
        metrics.DLQ_ROUTED.labels("sink", reason_class(reason)).inc()
        headers = dlq_headers(reason, message.topic, message.partition, message.offset)
        try:
            kafka.produce(
                self._dlq, self.settings.topics.dlq, message.value, key=message.key, partition=message.partition,
                headers=headers
            )
        except kafka.RecordRefusedError as e:
            raise StoreError(f"could not dead-letter {message.topic}[{message.partition}]@{message.offset}: {e}") from e
        if self._dlq.flush(DLQ_FLUSH_TIMEOUT_SECONDS):
            raise StoreError(f"could not dead-letter {message.topic}[{message.partition}]@{message.offset}: "
                             "DLQ unreachable")


def _header_pairs(headers: Any) -> tuple[tuple[str, bytes], ...]:
    """A record's headers as ``(name, value)`` pairs (a header without a value: empty bytes)."""
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or ())
    return tuple((name, value if isinstance(value, bytes) else (value or "").encode()) for name, value in pairs)
