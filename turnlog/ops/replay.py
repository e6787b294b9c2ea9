"""Rebuild a store from ``<prefix>.events``: ``turnlog replay``.

The raw log is read partition by partition in offset order, up to the end
offsets taken when the replay starts, and put through the sequencer's own pure
state machine (``stream_processors.sequencing``): the same ordering, dedupe and
fencing as the live pipeline. What it emits is written with the sink's own
``SqlStore.apply_batch`` (no consumer offsets: the replay owns no group), which
finalizes each session in the transaction that leaves it ended and complete,
as the live sink does; the guarded UPDATE is then tried once more on every
session seen. So a rebuilt store holds the same rows and the same aggregates
as the live one.

A session the target store already holds starts from its stored position
(epoch, ``last_seq``), so replaying twice, or replaying the tail of the log
into a restored backup (``--from-time``), adds only what is missing. A session
the store holds as ``finalized`` or ``abandoned`` is left untouched.

The log can rebuild only what it still holds: ``TURNLOG_EVENTS_RETENTION_MS``
(30 days by default) bounds how far back a replay reaches.

Forgotten sessions stay forgotten: the erasure ledger (``<prefix>.erasures``)
is read first, every record of a session it names is skipped unread (counted
in ``ReplayResult.erased``, not an error), and the ledger is applied to the
target store, which then knows them as erased (and drops what it held of them).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import cast

from confluent_kafka import KafkaError, TopicPartition

from turnlog import kafka
from turnlog.crypto.config import event_opener
from turnlog.exceptions import TurnlogError
from turnlog.kafka.record_headers import UnreadableHeaders, read_headers
from turnlog.ops.erasure import read_ledger
from turnlog.producers.partitioning import partition_for
from turnlog.redact import redact
from turnlog.schemas import SETTLED_SESSION_STATUSES, EventValidationError, SessionStatus, decode_event
from turnlog.settings import TurnlogSettings
from turnlog.signing import FLEET_HEADER, ProvenanceError, RecordVerifier, provenance_headers
from turnlog.sinks.base import SqlStore
from turnlog.sinks.exceptions import RecordRejectedError
from turnlog.sinks.source_records import SourceMessage
from turnlog.stream_processors.admission import (
    admit,
    admit_open,
    authenticate,
    note_owner,
    open_mode_grant_key,
    record_verifier,
)
from turnlog.stream_processors.sequencing import SessionSequence, raw_of, sequence

__all__ = ["ReplayResult", "ReplayError", "replay_events"]

logger = logging.getLogger(__name__)

#: Events written per store transaction.
WRITE_BATCH = 2000


class ReplayError(TurnlogError):
    """The log cannot be read (no such topic, broker unreachable)."""


@dataclass(slots=True)
class ReplayResult:
    """What a replay did. ``rate`` is log records read per second of wall time."""

    records_read: int = 0
    events_applied: int = 0
    duplicates: int = 0
    rejected: int = 0
    #: records of sessions the erasure ledger names, skipped unread
    erased: int = 0
    sessions_seen: int = 0
    sessions_settled: int = 0
    sessions_finalized: int = 0
    seconds: float = 0.0
    rejected_reasons: dict[str, int] = field(default_factory=dict)
    #: ``(session_id, missing seq, events held)`` of sessions still waiting for a seq the log did not have.
    incomplete: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.records_read / self.seconds if self.seconds > 0 else 0.0


#: ``progress(records_read, records_total)``
Progress = Callable[[int, int], None]


def replay_events(
    settings: TurnlogSettings,
    store: SqlStore,
    *,
    from_time: dt.datetime | None = None,
    session_ids: Collection[str] = (),
    progress: Progress | None = None,
) -> ReplayResult:
    """Replay ``settings.topics.events`` into ``store`` (already migrated).

    ``from_time`` (aware) starts each partition at the first record at or after
    it (Kafka's timestamp index); None starts at the earliest retained offset.
    ``session_ids`` restricts the replay to those sessions and reads only their
    partitions.

    Sealed events are opened with ``settings.keyring_file`` (unless ``store``
    already has an opener); one that does not open is rejected and counted.

    Raises:
        ReplayError: the topic does not exist or the broker cannot be reached.
        StoreError: the store refused a write.
        KeyMaterialError: the keyring is set and cannot be used.
        ConfigurationError: no fleet keys and no ``insecure_open_fleets`` (``record_verifier``).
    """
    started = time.monotonic()
    if store.transcript.opener is None:
        store.transcript.opener = event_opener(settings)
    verifier = record_verifier(settings)  # ConfigurationError before any client is made
    topic = settings.topics.events
    wanted = set(session_ids)
    with kafka.OffsetReader(settings) as offsets:
        starts, ends = _offset_range(offsets, topic, settings, from_time, wanted)
    consumer = kafka.consumer(
        settings,
        group_id=f"{settings.topic_prefix}-replay",  # never joined or committed: partitions are assigned
        **{"enable.auto.offset.store": False, "enable.partition.eof": True},
    )
    result = ReplayResult()
    try:
        ledger = read_ledger(settings)
    except kafka.BrokerError as e:
        raise ReplayError(f"cannot read the erasure ledger {settings.topics.erasures}: {redact(str(e))}") from e
    if wanted:
        ledger = {key: erasure for key, erasure in ledger.items() if key[0] in wanted}
    erased_fleets: dict[str, set[str]] = {}
    for session_id, fleet in ledger:
        erased_fleets.setdefault(session_id, set()).add(fleet)
    try:
        total = sum(max(0, ends[p] - starts[p]) for p in ends)
        pending = {p for p in ends if ends[p] > starts[p]}
        if progress:
            progress(0, total)
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(pending)])
        states: dict[str, SessionSequence | None] = {}
        emitted: list[SourceMessage] = []
        while pending:
            for record in consumer.consume(500, 1.0):
                error = record.error()
                partition = record.partition()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(partition)
                        continue
                    raise ReplayError(f"reading {topic}[{partition}]: {error.str()}")
                offset = cast(int, record.offset())  # every record without an error has its offset
                if partition not in pending or offset >= ends[partition]:
                    pending.discard(partition)
                    continue
                result.records_read += 1
                if offset + 1 >= ends[partition]:
                    pending.discard(partition)
                if _erased(record, erased_fleets, states):
                    result.erased += 1
                    continue
                _sequence_record(store, record, states, wanted, emitted, result,
                                 max_buffer=settings.reorder_buffer_size, verifier=verifier,
                                 open_grant_key=open_mode_grant_key(settings),
                                 partitions=settings.partitions)
                if len(emitted) >= WRITE_BATCH:
                    _write(store, emitted, result)
            if progress:
                progress(result.records_read, total)
        _write(store, emitted, result)
        if ledger:
            with store.writing() as writes:
                writes.apply_erasures(list(ledger.values()), dt.datetime.now(dt.UTC))
    finally:
        consumer.close()
    result.sessions_seen = len(states)
    result.incomplete = sorted(
        (sid, state.next_seq, len(state.buffer)) for sid, state in states.items() if state is not None and state.buffer
    )
    result.sessions_settled = sum(1 for state in states.values() if state is None)
    result.sessions_finalized += _finalize(store, [sid for sid, state in states.items() if state is not None])
    result.seconds = time.monotonic() - started
    return result


def _erased(
    record: object, erased_fleets: Mapping[str, Collection[str]], states: Mapping[str, SessionSequence | None]
) -> bool:
    """Whether the record belongs to a forgotten session, decided before anything of it is decoded:
    its key names a session id the ledger holds an erasure of (the sequencer admits a record only
    under its session's id) for the fleet the record claims (its provenance header), else the
    fleet its session was started by here; a record of no known fleet counts as forgotten. An
    erasure is bound to its fleet: another fleet's session of the id is replayed."""
    if not erased_fleets:
        return False
    key = record.key()  # type: ignore[attr-defined]
    if key is None:
        return False
    session_id = key.decode("utf-8", "replace")
    forgotten = erased_fleets.get(session_id)
    if not forgotten:
        return False
    fleet: str | None = None
    headers = read_headers(record)
    if not isinstance(headers, UnreadableHeaders):
        with contextlib.suppress(ProvenanceError):
            claimed = provenance_headers(headers).get(FLEET_HEADER)
            fleet = claimed.decode("utf-8", "replace") if claimed is not None else None
    if fleet is None:
        state = states.get(session_id)
        fleet = state.fleet if state is not None else None
    return fleet is None or fleet in forgotten


def _offset_range(
    offsets: kafka.OffsetReader,
    topic: str,
    settings: TurnlogSettings,
    from_time: dt.datetime | None,
    wanted: set[str],
) -> tuple[dict[int, int], dict[int, int]]:
    """``(start offsets, end offsets)`` per partition to read.

    Raises:
        ReplayError: the topic does not exist or the broker did not answer.
    """
    try:
        partitions = offsets.partitions(topic)
        if wanted:
            partitions = sorted({partition_for(sid, len(partitions)) for sid in wanted})
        marks = offsets.watermarks(topic, partitions)
        starts = {p: marks[p].low for p in partitions}
        ends = {p: marks[p].high for p in partitions}
        if from_time is not None:
            found = offsets.offsets_for_time(topic, partitions, int(from_time.timestamp() * 1000))
            for p, offset in found.items():
                # None: no record at or after the time in this partition: nothing to read.
                starts[p] = ends[p] if offset is None else max(offset, starts[p])
    except kafka.UnknownTopicError as e:
        raise ReplayError(f"topic {topic} does not exist (TURNLOG_TOPIC_PREFIX={settings.topic_prefix!r})") from e
    except kafka.BrokerError as e:
        where = redact(settings.bootstrap_servers)
        raise ReplayError(f"cannot read the offsets of {topic} at {where}: {redact(str(e))}") from e
    return starts, ends


def _sequence_record(
    store: SqlStore,
    record: object,
    states: dict[str, SessionSequence | None],
    wanted: set[str],
    emitted: list[SourceMessage],
    result: ReplayResult,
    *,
    max_buffer: int,
    verifier: RecordVerifier | None = None,
    open_grant_key: bytes | None = None,
    partitions: int | None = None,
) -> None:
    """Put one log record through the sequencer's admission (with ``verifier``: fleet keys
    configured; without, open mode's checks of what the record claims, with ``open_grant_key``
    for resumed epochs) and state machine.

    A record that fails to decode (``EventValidationError``: any failure) or to
    sequence (any exception from ``sequence``, as the live sequencer
    dead-letters with ``internal: ...``) is skipped: counted in
    ``result.rejected`` and ``rejected_reasons``, and logged with its topic,
    partition and offset, never its content; so is a record whose headers
    cannot be read (``unreadable``: a header name that is not UTF-8). Store
    errors (reading the session's stored position) are not the record's and
    propagate.
    """
    raw: bytes = record.value()  # type: ignore[attr-defined]
    try:
        event = decode_event(raw)
    except EventValidationError as e:
        _skip(record, result, e.reason, e.reason)
        return
    if wanted and event.session_id not in wanted:
        return
    headers = read_headers(record)
    if isinstance(headers, UnreadableHeaders):  # in any mode, as the live sequencer dead-letters it
        _skip(record, result, "unreadable", f"unreadable: {headers.reason}")
        return
    key: bytes | None = record.key()  # type: ignore[attr-defined]
    if key != event.session_id.encode("utf-8"):
        _skip(record, result, "invalid", "invalid: the record key is not the session_id")
        return
    if event.session_id not in states:
        states[event.session_id] = _initial_state(store, event.session_id)
    state = states[event.session_id]
    if state is None:  # finalized or abandoned in the target store: leave it be
        return
    if partitions is not None and record.partition() != partition_for(event.session_id, partitions):  # type: ignore[attr-defined]
        _skip(record, result, "misrouted", f"misrouted: {event.session_id} is not on this partition")
        return
    if verifier is not None:  # the live sequencer's write-side admission, so a replay admits the same records
        try:
            verified = authenticate(verifier, key, raw, headers)
        except ProvenanceError as e:
            _skip(record, result, "unauthenticated", f"unauthenticated: {e.reason}")
            return
        refused = admit(verified, state, event, fleets=verifier.fleets)
    else:
        try:
            refused = admit_open(provenance_headers(headers), open_grant_key, state, event)
        except ProvenanceError as e:
            refused = f"unauthenticated: {e.reason}"
    if refused is not None:
        _skip(record, result, refused.split(":", 1)[0], refused)
        return
    try:
        decision = sequence(state, event, raw, record.offset(), max_buffer=max_buffer)  # type: ignore[attr-defined]
        if verifier is None:
            note_owner(state, event)
    except Exception as e:  # a bug in sequencing must not stop the replay: this record alone is skipped
        _skip(record, result, "internal", f"internal: cannot be sequenced ({type(e).__name__})")
        return
    result.duplicates += int(decision.duplicate)
    result.rejected += len(decision.dlq)
    for _, reason in decision.dlq:
        kind = reason.split(":", 1)[0]
        result.rejected_reasons[kind] = result.rejected_reasons.get(kind, 0) + 1
    for value in decision.emit:  # states stay in memory here: a buffered event has its bytes (raw_of)
        emitted.append(
            SourceMessage(record.topic(), record.partition(), record.offset(), raw_of(value), record.key())  # type: ignore[attr-defined]
        )


def _skip(record: object, result: ReplayResult, kind: str, reason: str) -> None:
    """Count a log record the replay skips, under ``kind`` in ``rejected_reasons``, and say where it is."""
    result.rejected += 1
    result.rejected_reasons[kind] = result.rejected_reasons.get(kind, 0) + 1
    logger.warning(
        "skipping %s[%d]@%d: %s", record.topic(), record.partition(), record.offset(), reason  # type: ignore[attr-defined]
    )


def _initial_state(store: SqlStore, session_id: str) -> SessionSequence | None:
    """Where sequencing of ``session_id`` starts: its stored position, or the beginning."""
    with store.reading() as reads:
        start = reads.sequencing_start(session_id)
    position = start.position
    if position is None:
        return SessionSequence()
    if position.status in SETTLED_SESSION_STATUSES:  # a replay never touches these
        return None
    return SessionSequence(
        fleet=start.fleet,  # the stored session's owner: another fleet's records of the id are refused
        epoch=position.epoch,
        next_seq=position.last_seq + 1,
        ended=position.status == SessionStatus.ENDED,
        started_event_id=start.started_event_id,  # so a re-read session.started is known as a re-send
    )


def _write(store: SqlStore, emitted: list[SourceMessage], result: ReplayResult) -> None:
    """Write the sequenced events, one transaction per batch.

    As in the live sink, a record the writer refuses (it cannot be decoded or
    planned) is skipped and counted, and a batch the database refuses for good
    (``RecordRejectedError``) is written again record by record, skipping (and
    counting) each record refused on its own: one bad record never stops the replay.

    Raises:
        StoreError: the store is unavailable, or refused a write for another reason.
    """
    if not emitted:
        return
    try:
        _apply(store, emitted, result)
    except RecordRejectedError as e:
        logger.warning("batch of %d refused (%s); writing record by record", len(emitted), e)
        for message in emitted:
            try:
                _apply(store, [message], result)
            except RecordRejectedError as refused:
                result.rejected += 1
                result.rejected_reasons["store"] = result.rejected_reasons.get("store", 0) + 1
                logger.warning(
                    "skipping %s[%d]@%d: %s", message.topic, message.partition, message.offset, refused
                )
    emitted.clear()


def _apply(store: SqlStore, messages: list[SourceMessage], result: ReplayResult) -> None:
    """Write ``messages`` in one transaction; count what it applied and refused once it committed."""
    refused: list[tuple[SourceMessage, str]] = []
    with store.writing() as writes:
        applied = writes.apply_batch(None, messages, on_rejected=lambda m, reason: refused.append((m, reason)))
    result.events_applied += applied.applied
    result.sessions_finalized += len(applied.finalized)
    for message, reason in refused:
        result.rejected += 1
        result.rejected_reasons[reason] = result.rejected_reasons.get(reason, 0) + 1
        logger.warning("skipping %s[%d]@%d: %s", message.topic, message.partition, message.offset, reason)


def _finalize(store: SqlStore, session_ids: list[str]) -> int:
    finalized = 0
    now = dt.datetime.now(dt.UTC)
    for session_id in sorted(session_ids):
        with store.writing() as writes:
            finalized += int(writes.finalize_session(session_id, now))
    return finalized
