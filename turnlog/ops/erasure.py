"""Forgetting a session on request (``turnlog forget``, ``DELETE /api/sessions/{id}``), and
reading the erasure ledger (replay, verify).

docs/design.md, "Encryption and erasure". :func:`request_erasure`:

1. In the store: the session must exist within the caller's fleets (else
   :class:`ErasureNotFound`: the API's 404; nothing changes). Its erasure row
   is inserted as pending, or the one already there is taken (asking twice is
   one erasure).
2. Its ledger record goes to ``<prefix>.erasures`` and, once acknowledged, the
   row is marked published. A broker that does not answer leaves it pending:
   the sink publishes it when the broker is back.
3. It waits up to ``wait_seconds`` for the sink to have applied it.

A store that does not answer: with the session's fleet given (the CLI's
``--fleet``) the ledger record is written alone and the sink applies it when
the store is back; without it, :class:`~turnlog.sinks.exceptions.StoreUnavailableError`
(nothing changed). Either way the answer says ``pending`` until the store
holds the erasure done.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Collection
from dataclasses import dataclass

from confluent_kafka import KafkaError, Producer, TopicPartition
from sqlalchemy import select

from turnlog import kafka
from turnlog.exceptions import TurnlogError
from turnlog.faults import fault_point
from turnlog.schemas import EventValidationError
from turnlog.schemas.erasure import Erasure, ErasureReason, decode_erasure
from turnlog.settings import TurnlogSettings
from turnlog.sinks.base import SqlStore
from turnlog.sinks.erasure import ErasureStatus
from turnlog.sinks.erasure_ledger import publish_erasures
from turnlog.sinks.errors import store_errors
from turnlog.sinks.exceptions import StoreUnavailableError
from turnlog.sinks.tables import sessions

__all__ = ["ErasureNotFound", "ErasureOutcome", "request_erasure", "read_ledger"]

#: How often request_erasure looks whether the sink has applied the erasure (seconds).
_POLL_SECONDS = 0.2


class ErasureNotFound(TurnlogError):
    """No such session within the caller's fleets (and no erasure of it): nothing changed."""


@dataclass(frozen=True, slots=True)
class ErasureOutcome:
    """Where an erasure stands. ``status``: ``done`` (the store holds nothing of the session)
    or ``pending``; ``published``: its ledger record was acknowledged by the broker."""

    session_id: str
    fleet: str
    status: ErasureStatus
    published: bool
    requested_at: dt.datetime
    requested_by: str


def request_erasure(
    settings: TurnlogSettings,
    store: SqlStore,
    session_id: str,
    *,
    requested_by: str,
    fleets: Collection[str] | None = None,
    fleet: str | None = None,
    reason: ErasureReason = "request",
    wait_seconds: float = 10.0,
    producer: Producer | None = None,
) -> ErasureOutcome:
    """Forget ``session_id`` everywhere (module docstring).

    ``fleets``: the fleets the caller may erase in (None: any); ``fleet``: the
    session's fleet, used only when the store does not answer.

    Raises:
        ErasureNotFound: the store has neither the session within ``fleets`` nor an erasure of it.
        StoreUnavailableError: the store does not answer and ``fleet`` was not given.
    """
    now = dt.datetime.now(dt.UTC)
    store_answered = True
    try:
        erasure, published = _recorded(store, session_id, fleets, requested_by, reason, now)
    except StoreUnavailableError:
        if fleet is None or (fleets is not None and fleet not in fleets):
            raise
        store_answered, published = False, False
        erasure = Erasure(session_id=session_id, fleet=fleet, requested_by=requested_by, requested_at=now,
                          reason=reason)
    fault_point("forget.after_request")
    if not published:
        own = producer is None
        producer = producer or kafka.producer(settings, client_id=f"turnlog-forget-{session_id[:40]}")
        try:
            acked = publish_erasures(producer, settings, [erasure], timeout=max(1.0, settings.ack_wait_seconds * 5))
        finally:
            if own:
                producer.flush(0)
        published = bool(acked)
        if published and store_answered:
            try:
                with store_errors(), store.engine.begin() as conn:
                    store.erasures.mark_published(conn, acked, dt.datetime.now(dt.UTC))
            except StoreUnavailableError:
                pass  # the sink marks it when it applies the record
    status: ErasureStatus = "pending"
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            with store_errors(), store.engine.connect() as conn:
                state = store.erasures.state(conn, session_id)
        except StoreUnavailableError:
            state = None
        if state is not None and state.status == "done":
            status = "done"
            break
        if time.monotonic() >= deadline:
            break
        time.sleep(_POLL_SECONDS)
    return ErasureOutcome(session_id, erasure.fleet, status, published, erasure.requested_at, erasure.requested_by)


def _recorded(
    store: SqlStore, session_id: str, fleets: Collection[str] | None, requested_by: str, reason: ErasureReason,
    now: dt.datetime,
) -> tuple[Erasure, bool]:
    """The erasure of ``session_id`` as the store holds it (inserted as pending if new) and
    whether its ledger record was published already.

    Raises:
        ErasureNotFound, StoreUnavailableError: as :func:`request_erasure`.
    """
    with store_errors(), store.engine.begin() as conn:
        state = store.erasures.state(conn, session_id)
        if state is not None:
            if fleets is not None and state.fleet not in fleets:
                raise ErasureNotFound(f"no session {session_id}")
            return state.as_erasure(), state.published_at is not None
        fleet = conn.execute(select(sessions.c.fleet).where(sessions.c.id == session_id)).scalar()
        if fleet is None or (fleets is not None and fleet not in fleets):
            raise ErasureNotFound(f"no session {session_id}")
        erasure = Erasure(session_id=session_id, fleet=fleet, requested_by=requested_by, requested_at=now,
                          reason=reason)
        store.erasures.request(conn, erasure)
        return erasure, False


def read_ledger(settings: TurnlogSettings, *, timeout: float = 30.0) -> dict[str, Erasure]:
    """Every erasure in ``<prefix>.erasures`` (read to its end), by session id. A record that
    does not decode is skipped (it names nothing to forget); a missing topic is an empty ledger.

    Raises:
        BrokerError: the broker cannot be reached.
    """
    topic = settings.topics.erasures
    with kafka.OffsetReader(settings) as offsets:
        try:
            ends = offsets.record_ends(topic)
        except kafka.UnknownTopicError:
            return {}
        starts = {p: marks.low for p, marks in offsets.watermarks(topic, list(ends)).items()}
    pending = {p for p, end in ends.items() if end > starts[p]}
    ledger: dict[str, Erasure] = {}
    if not pending:
        return ledger
    consumer = kafka.consumer(settings, group_id=f"{settings.topic_prefix}-ledger-reader",
                              **{"enable.auto.offset.store": False, "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(pending)])
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for record in consumer.consume(500, 1.0):
                error = record.error()
                partition = record.partition()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF and partition is not None:
                        pending.discard(partition)
                    continue
                try:
                    erasure = decode_erasure(record.value())
                except EventValidationError:
                    continue
                ledger[erasure.session_id] = erasure
                if partition is not None and (record.offset() or 0) + 1 >= ends[partition]:
                    pending.discard(partition)
        if pending:
            raise kafka.BrokerError(f"{topic}: partitions {sorted(pending)} not read to their end in {timeout:.0f} s")
    finally:
        consumer.close()
    return ledger
